"""Attach vs safetensors.torch.load_file on the host-memory device.

Same ~1 GiB, ~290-tensor bf16 Llama-shaped checkpoint for both, measured
alternately in one run (the machines are shared and noisy: only ratios taken
side by side mean anything).

  attach: connect -> hello -> attach -> receive fds -> map -> every tensor view
          built (the point where an engine can bind them);
  attach+touch: the same, then read one element of every tensor (page faults);
  load_file: safetensors.torch.load_file of every shard, page cache warm. On
          CPU it returns tensors over a private mmap of the file: nothing is
          read until touched, so this is a lower bound, not an engine's cost;
  load_file_cold: the same right after dropping the page cache (root only);
  load_file_copy: load_file, then a copy into tensors the process owns, which
          is what an engine's weight loading does (param.copy_(loaded)) and
          what an attach replaces: the engine binds the daemon's pages instead.
"""

from __future__ import annotations

import argparse
import os
import time

from common import DATA, summary, write_result

from tests.helpers import run_daemon, write_config
from wcached.cli.demo import LLAMA_TINY, generate_llama

BENCH_LLAMA = {
    **LLAMA_TINY,
    "vocab_size": 32000,
    "hidden_size": 1024,
    "intermediate_size": 3584,
    "num_hidden_layers": 32,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args()
    import torch
    from safetensors.torch import load_file

    from wcached.client import attach

    ckpt = DATA / "llama-1g"
    if not (ckpt / "model.safetensors.index.json").exists():
        print("generating", ckpt)
        generate_llama(ckpt, BENCH_LLAMA, shards=4, seed=1)
    shards = sorted(ckpt.glob("*.safetensors"))
    work = DATA / "host-run"
    work.mkdir(parents=True, exist_ok=True)
    cfg = write_config(
        work / "wcached.toml",
        models=[{"name": "default", "path": str(ckpt)}],
        daemon={"socket_dir": str(work / "run")},
    )

    def do_load() -> dict:
        out = {}
        for f in shards:
            out.update(load_file(str(f)))
        return out

    def do_load_copy() -> dict:
        return {k: v.clone() for k, v in do_load().items()}

    def drop_caches() -> bool:
        try:
            os.sync()
            with open("/proc/sys/vm/drop_caches", "w") as f:
                f.write("3")
            return True
        except OSError:
            return False

    def do_load_cold() -> dict:
        return do_load()

    def do_attach(touch: bool):
        a = attach("default", "cpu0", socket_dir=str(work / "run"))
        if touch:
            for t in a.tensors.values():
                if t.numel():
                    t.view(-1)[0].item()
        return a

    with run_daemon(cfg, timeout=600) as d:
        do_load()  # warm the page cache for the baseline
        a = do_attach(False)
        ref = do_load()
        assert all(torch.equal(a.tensors[k], v) for k, v in ref.items()), "attach differs from load_file"
        n_tensors, total = len(a.manifest.tensors), a.manifest.total_bytes
        fill_s = next(iter(d.log().splitlines()), "")
        a.close()
        del ref
        can_drop = drop_caches()
        samples: dict[str, list[float]] = {"attach": [], "attach_touch": [], "load_file": []}
        samples["load_file_copy"] = []
        if can_drop:
            samples["load_file_cold"] = []
        for _ in range(args.rounds):
            for name, fn in (
                ("attach", lambda: do_attach(False)),
                ("attach_touch", lambda: do_attach(True)),
                ("load_file", do_load),
                ("load_file_copy", do_load_copy),
                ("load_file_cold", do_load_cold),
            ):
                if name not in samples:
                    continue
                if name == "load_file_cold":
                    drop_caches()
                t0 = time.perf_counter()
                obj = fn()
                samples[name].append(time.perf_counter() - t0)
                if hasattr(obj, "close"):
                    obj.close()
                del obj
        fill_line = next((line for line in d.log().splitlines() if "filled default" in line), fill_s)

    stats = {k: summary(v) for k, v in samples.items()}
    attach_ms = stats["attach"]["median_ms"]
    ratios = {f"{k}/attach": round(v["median_ms"] / attach_ms, 1) for k, v in stats.items() if k != "attach"}
    result = {
        "checkpoint": {"tensors": n_tensors, "bytes": total, "shards": len(shards)},
        "rounds": args.rounds,
        "stats": stats,
        "ratios": ratios,
        "daemon_fill": fill_line.split("daemon: ", 1)[-1],
        "targets": {"attach_ms": 20, "speedup": 20},
    }
    table = (
        f"Checkpoint: {n_tensors} tensors, {total / 2**30:.2f} GiB, {len(shards)} shards; "
        f"{args.rounds} alternating rounds.\n\n"
        "| what | median ms | min ms | max ms |\n|---|---|---|---|\n"
        + "\n".join(f"| {k} | {v['median_ms']} | {v['min_ms']} | {v['max_ms']} |" for k, v in stats.items())
        + "\n\nRatios of medians (targets: attach <= 20 ms, >= 20x faster than load_file):\n\n"
        + "\n".join(f"- {k}: **{v}x**" for k, v in ratios.items())
        + "\n\n"
        f"Daemon fill: {result['daemon_fill']}\n"
    )
    path = write_result("host-attach", result, table)
    print(table)
    print("written", path.with_suffix(".json"))


if __name__ == "__main__":
    main()
