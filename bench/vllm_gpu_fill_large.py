"""A model that takes 60 % of the GPU fills, and an engine starts beside it.

A 70B-shaped Llama, its layer count chosen so the bf16 weights take
``--fraction`` of GPU 0's memory (random weights, made on the GPU in a
separate process, written to /dev/shm when it has room), is filled by a daemon
on GPU 0 through vLLM with ``--segment-size`` segments. Recorded: seconds to
READY, the fill's peak GPU memory (the worker's own measure: device-wide
cuMemGetInfo samples and torch's peak) and its ratio to the model. Then an
engine with ``--load-format wcache`` (fallback off) starts beside the daemon
at the utilization the daemon's share leaves (0.9 minus the share on a vLLM
without the external-weight hook, 0.9 with it), and generates.

With ``--worker-cls`` the engine starts at 0.9 on any vLLM, through
``--worker-cls wcached.integrations.vllm_worker.Worker`` (where vLLM has no
hook), and once the daemon has stopped a disk engine starts at the same 0.9:
their KV caches side by side.

    PYTHONPATH=/var/tmp/site python3 bench/vllm_gpu_fill_large.py [--fraction 0.6] [--worker-cls]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_result
from vllm_gpu_load import gpu_name

from tests.helpers import run_daemon
from tests.integrations.test_vllm_gpu import _config, _verify_every_tensor, engine, weights_share
from wcached.cli.demo import LLAMA_TINY, llama_shapes
from wcached.integrations.vllm_bind import WORKER_CLS

# Llama 3 70B's shapes; only the number of layers varies.
LLAMA70B_LAYER = {
    **LLAMA_TINY,
    "vocab_size": 128256,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 8192,
}


def model_bytes(cfg: dict) -> int:
    return sum(2 * math.prod(shape) for _, shape in llama_shapes(cfg))


def sized_to(target: int) -> dict:
    per_layer = model_bytes({**LLAMA70B_LAYER, "num_hidden_layers": 2}) - model_bytes(
        {**LLAMA70B_LAYER, "num_hidden_layers": 1}
    )
    rest = model_bytes({**LLAMA70B_LAYER, "num_hidden_layers": 0})
    return {**LLAMA70B_LAYER, "num_hidden_layers": max(1, round((target - rest) / per_layer))}


def gpu_total_bytes() -> int:
    # nvidia-smi rather than torch: this process stays off the GPU, so the
    # fill's device-wide measure counts the daemon's worker alone.
    out = subprocess.run(
        ["nvidia-smi", "-i", "0", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.split()[0]) << 20


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--fraction", type=float, default=0.6)
    p.add_argument("--segment-size", default="2GiB")
    p.add_argument("--dir", default=None, help="where to write the checkpoint (default: /dev/shm if it fits)")
    p.add_argument(
        "--worker-cls",
        action="store_true",
        help="the engine at 0.9 with wcached's worker class, then a disk engine at 0.9",
    )
    args = p.parse_args()
    import vllm

    total = gpu_total_bytes()
    cfg = sized_to(int(args.fraction * total))
    size = model_bytes(cfg)
    base = args.dir
    if base is None:
        base = "/dev/shm" if shutil.disk_usage("/dev/shm").free > size * 1.1 else tempfile.gettempdir()
    work = Path(tempfile.mkdtemp(prefix="wcached-fill-large-", dir=base))
    try:
        t0 = time.perf_counter()
        gen = (
            "import sys, json; from pathlib import Path; sys.path[:0] = sys.argv[1:3];"
            "from vllm_gpu_load import generate_on_gpu;"
            "generate_on_gpu(Path(sys.argv[3]), json.loads(sys.argv[4]))"
        )
        here = Path(__file__).resolve().parent
        subprocess.run(
            [sys.executable, "-c", gen, str(here.parent), str(here), str(work / "model"), json.dumps(cfg)],
            check=True,
        )
        model = work / "model"
        print(
            f"checkpoint: {size / 2**30:.1f} GiB ({size / total:.0%} of the GPU) "
            f"in {time.perf_counter() - t0:.0f} s under {work}",
            flush=True,
        )
        daemon_cfg = _config(work, model, engine_args={"max_model_len": 2048}, segment_size=args.segment_size)
        t0 = time.perf_counter()
        with run_daemon(daemon_cfg, "0", timeout=900) as d:
            ready_s = time.perf_counter() - t0
            log = d.log()
            peak = re.search(r"peak device memory ([0-9.]+) GiB \(([0-9.]+)x the model\)", log)
            if not peak:
                raise SystemExit(log[-4000:])
            held, share = weights_share(daemon_cfg)
            print(f"daemon READY after {ready_s:.1f} s; {peak.group(0)}; holds {share:.1%}", flush=True)
            from vllm.model_executor.model_loader.base_loader import BaseModelLoader

            hook = hasattr(BaseModelLoader, "get_external_weight_memory")
            util = 0.9 if hook or args.worker_cls else round(0.9 - share, 4)
            extra = {"socket_dir": d.socket_dir, "fallback": False}
            worker = {"worker_cls": WORKER_CLS} if args.worker_cls and not hook else {}
            out = engine(
                model,
                load_format="wcache",
                model_loader_extra_config=extra,
                gpu_memory_utilization=util,
                max_model_len=2048,
                **worker,
            )
            if out["rc"] != 0 or "wcached: bound" not in out["log"]:
                raise SystemExit(out["log"][-4000:])
            if args.worker_cls:
                # A second wcache engine, and the daemon's memory against
                # the digests its fill recorded: what a token difference is.
                again = engine(
                    model,
                    load_format="wcache",
                    model_loader_extra_config=extra,
                    gpu_memory_utilization=util,
                    max_model_len=2048,
                    **worker,
                )
                out["tokens_again"] = again.get("tokens")
                out["verify"] = _verify_every_tensor(daemon_cfg, d.socket_dir)[1]
                print(f"second wcache engine agrees: {out['tokens_again'] == out['tokens']}; {out['verify']}")
            print(
                f"engine at {util}: load {out['vllm_load_s']} s, KV {out['kv_gib']} GiB, "
                f"first token {out['first_token_s']:.1f} s",
                flush=True,
            )
        disk = {}
        if args.worker_cls:
            # The daemon has stopped: the GPU is the disk engine's alone.
            disk = engine(model, gpu_memory_utilization=util, max_model_len=2048)
            if disk["rc"] != 0:
                raise SystemExit(disk["log"][-4000:])
            same = disk["tokens"] == out["tokens"]
            print(f"disk engine at {util}: KV {disk['kv_gib']} GiB, tokens same: {same}", flush=True)
            # Random weights give near-flat logits, where greedy choices can
            # flip between runs: a second disk engine shows how often.
            again = engine(model, gpu_memory_utilization=util, max_model_len=2048)
            disk["tokens_again"] = again.get("tokens")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {
        "gpu": gpu_name(),
        "gpu_memory_bytes": total,
        "vllm": vllm.__version__,
        "model": {"config": cfg, "bytes": held, "share_of_gpu": round(share, 4)},
        "fill": {
            "segment_size": args.segment_size,
            "ready_s": round(ready_s, 2),
            "peak_gib": float(peak.group(1)),
            "peak_x_model": float(peak.group(2)),
            "peak_share_of_gpu": round(float(peak.group(1)) * 2**30 / total, 4),
        },
        "engine": {
            "gpu_memory_utilization": util,
            "external_weight_hook": hook,
            "worker_cls": worker.get("worker_cls"),
            "load_s": out["vllm_load_s"],
            "kv_gib": out["kv_gib"],
            "first_token_s": round(out["first_token_s"], 2),
            "tokens": out["tokens"],
            "tokens_second_wcache_engine": out.get("tokens_again"),
            "verify": out.get("verify"),
        },
    }
    if disk:
        result["disk_engine"] = {
            "gpu_memory_utilization": util,
            "kv_gib": disk["kv_gib"],
            "kv_tokens": disk["kv_tokens"],
            "wcache_kv_tokens": out["kv_tokens"],
            "kv_ratio_wcache_to_disk": round(out["kv_gib"] / disk["kv_gib"], 4),
            "tokens_same": disk["tokens"] == out["tokens"],
            "tokens": disk["tokens"],
            "tokens_second_disk_engine": disk["tokens_again"],
            "disk_engines_agree": disk["tokens"] == disk["tokens_again"],
            "first_token_of_each_prompt_same": [
                a[0] == b[0] for a, b in zip(disk["tokens"], out["tokens"], strict=True)
            ],
        }
    table = "\n".join(
        [
            f"vLLM {vllm.__version__} on one {result['gpu']} ({total / 2**30:.1f} GiB), "
            f"{cfg['num_hidden_layers']}-layer 70B-shaped Llama in bf16",
            "",
            "| what | figure |",
            "|---|---|",
            f"| model | {held / 2**30:.1f} GiB = {share:.1%} of the GPU |",
            f"| daemon READY (fill from /dev/shm) | {ready_s:.1f} s |",
            f"| fill peak GPU memory | {peak.group(1)} GiB = {peak.group(2)}x the model = "
            f"{result['fill']['peak_share_of_gpu']:.1%} of the GPU |",
            f"| engine beside it{' (' + WORKER_CLS + ')' if worker else ''} | utilization {util}, "
            f"KV cache {out['kv_gib']} GiB, first token after {out['first_token_s']:.1f} s |",
        ]
        + (
            [
                f"| disk engine, daemon stopped | utilization {util}, KV cache {disk['kv_gib']} GiB "
                f"(wcache/disk {result['disk_engine']['kv_ratio_wcache_to_disk']}), "
                f"same tokens: {result['disk_engine']['tokens_same']} "
                f"(two disk engines: {result['disk_engine']['disk_engines_agree']}) |"
            ]
            if disk
            else []
        )
    )
    write_result("vllm-gpu-fill-large" + ("-worker-cls" if args.worker_cls else ""), result, table)
    print(table)


if __name__ == "__main__":
    main()
