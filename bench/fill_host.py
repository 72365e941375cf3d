"""The fill and attach benchmark of bench/attach_cuda.py on the host-memory
device (cpu0), sized for a 2-core CI machine, so that a regression of the
fill or attach paths shows as a ratio on any machine:

  (a) "llama-1g": a Llama-shaped bf16 checkpoint of ~1 GiB, 291 tensors;
  (b) "many":     ~0.5 GB in 5,000 tensors of 100 KiB.

  raw_read:      one sequential reader of the shards into a buffer, page
                 cache warm (the kernel's copy out of the page cache: a fill
                 to host memory does that copy and nothing else);
  fill:          the daemon's fill, warm, with and without digests (its own
                 figure, from status);
  load_copy:     safetensors load_file plus a copy into tensors the process
                 owns (an engine's weight load, which an attach replaces);
  attach_fresh:  connect -> every tensor view built, in a fresh process with
                 torch imported; attach_warm: the same inside one process.

With --paths: the host backend's two ways of filling, in-process and
interleaved (3 rounds): the kernel copying page cache -> memfd (sendfile into
the segment) against reads into the segment's mapping (what it falls back to
without /proc), digests on and off.

Run from the repo root: .venv/bin/python bench/fill_host.py [--rounds N].
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attach_cuda import fill_seconds, raw_read
from attach_host import BENCH_LLAMA
from common import DATA, REPO, summary, write_result

from tests.helpers import run_daemon, write_config
from wcached.cli.demo import generate_llama

MANY = [(f"blocks.{i // 10}.w{i % 10}", (200, 256)) for i in range(5000)]

ATTACH_CLIENT = """
import sys, time, torch
from wcached.client import attach
t0 = time.perf_counter()
a = attach("default", "cpu0", socket_dir=sys.argv[1])
a.tensors[a.manifest.tensors[-1].name].view(-1)[0].item()
print(time.perf_counter() - t0, len(a.tensors))
"""


def generate_many(out: Path) -> None:
    import torch
    from safetensors.torch import save_file

    if (out / "model.safetensors.index.json").exists():
        return
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    weight_map = {}
    for s, part in enumerate((MANY[:2500], MANY[2500:])):
        name = f"model-{s + 1:05d}-of-00002.safetensors"
        save_file(
            {n: torch.randn(shape, generator=g).to(torch.bfloat16) for n, shape in part}, str(out / name)
        )
        weight_map.update({n: name for n, _ in part})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def fresh_attach(socket_dir: str) -> float:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run(
        [sys.executable, "-c", ATTACH_CLIENT, socket_dir], capture_output=True, text=True, env=env
    )
    if r.returncode:
        raise RuntimeError(r.stderr)
    return float(r.stdout.split()[0])


def load_copy(files: list[Path]) -> float:
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    out = {}
    for f in files:
        out.update({k: v.clone() for k, v in load_file(str(f)).items()})
    return time.perf_counter() - t0


def bench_checkpoint(name: str, ckpt: Path, rounds: int) -> dict:
    from wcached.client import attach

    files = sorted(ckpt.glob("*.safetensors"))
    nbytes = sum(f.stat().st_size for f in files)
    work = Path(tempfile.mkdtemp(prefix=f"wcached-bench-{name}-"))
    res: dict = {"files": len(files), "bytes": nbytes}
    raw_read(files)  # the page cache warm for every figure below
    res["raw_read_warm_s"] = min(raw_read(files) for _ in range(3))
    configs = {
        "fill_warm_s": {"name": "default", "path": str(ckpt)},
        "fill_warm_nodigest_s": {"name": "default", "path": str(ckpt), "digest": False},
    }
    for key, model in configs.items():
        cfg = write_config(work / f"{key}.toml", models=[model], daemon={"socket_dir": str(work / "run")})
        times = []
        for _ in range(2):
            with run_daemon(cfg, "cpu0", timeout=600) as d:
                times.append(fill_seconds(d.socket_dir, "cpu0"))
        res[key] = min(times)
    res["load_copy_warm_s"] = min(load_copy(files) for _ in range(2))
    cfg = write_config(
        work / "attach.toml", models=[configs["fill_warm_s"]], daemon={"socket_dir": str(work / "run")}
    )
    with run_daemon(cfg, "cpu0", timeout=600) as d:
        with attach("default", "cpu0", socket_dir=d.socket_dir) as a:
            res["tensors"] = len(a.manifest.tensors)
        warm = []
        for _ in range(rounds * 4):
            t0 = time.perf_counter()
            a = attach("default", "cpu0", socket_dir=d.socket_dir)
            a.tensors[a.manifest.tensors[-1].name].view(-1)[0].item()
            warm.append(time.perf_counter() - t0)
            a.close()
        res["attach_warm"] = summary(warm)
        res["attach_fresh"] = summary([fresh_attach(d.socket_dir) for _ in range(rounds)])
    gb = nbytes / 1e9
    for key in ("raw_read_warm", "fill_warm", "fill_warm_nodigest", "load_copy_warm"):
        res[f"{key}_GBps"] = round(gb / res[f"{key}_s"], 2)
    res["fill_warm_vs_raw_read"] = round(res["raw_read_warm_s"] / res["fill_warm_s"], 3)
    res["fill_warm_nodigest_vs_raw_read"] = round(res["raw_read_warm_s"] / res["fill_warm_nodigest_s"], 3)
    res["load_copy_over_fill_warm"] = round(res["load_copy_warm_s"] / res["fill_warm_s"], 2)
    res["load_copy_over_attach_fresh"] = round(
        res["load_copy_warm_s"] * 1000 / res["attach_fresh"]["median_ms"], 1
    )
    return res


def table(results: dict) -> str:
    rows = ["| | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]

    def row(label: str, f) -> None:
        rows.append(f"| {label} | " + " | ".join(str(f(r)) for r in results.values()) + " |")

    row("tensors", lambda r: r["tensors"])
    row("bytes", lambda r: f"{r['bytes'] / 1e9:.2f} GB")
    row("one sequential reader, warm (GB/s)", lambda r: r["raw_read_warm_GBps"])
    row("fill warm (GB/s)", lambda r: r["fill_warm_GBps"])
    row("fill warm without digests (GB/s)", lambda r: r["fill_warm_nodigest_GBps"])
    row("fill warm / one reader", lambda r: f"{r['fill_warm_vs_raw_read']:.0%}")
    row("fill warm without digests / one reader", lambda r: f"{r['fill_warm_nodigest_vs_raw_read']:.0%}")
    row("load_file + copy, warm (s)", lambda r: round(r["load_copy_warm_s"], 3))
    row("load_file + copy / fill warm", lambda r: f"{r['load_copy_over_fill_warm']}x")
    row("attach, fresh process (median ms)", lambda r: r["attach_fresh"]["median_ms"])
    row("attach, warm process (median ms)", lambda r: r["attach_warm"]["median_ms"])
    row("load_file + copy / attach fresh", lambda r: f"{r['load_copy_over_attach_fresh']}x")
    return "\n".join(rows)


def fill_paths(ckpts: dict[str, Path], rounds: int) -> dict:
    from wcached.loaders.safetensors import SafetensorsLoader, SafetensorsModel
    from wcached.memory.host import HostBackend, HostSegmentWriter
    from wcached.protocol.wire import close_fds

    kernel_copy = HostSegmentWriter._send_fd
    samples: dict[str, list[float]] = {}
    try:
        for _ in range(rounds):
            for digest in (True, False):
                for path in ("mapping", "kernel copy"):
                    HostSegmentWriter._send_fd = kernel_copy if path == "kernel copy" else (lambda self: -1)
                    for name, ckpt in ckpts.items():
                        model = SafetensorsModel(name="m", path=str(ckpt), digest=digest).parsed()
                        t0 = time.perf_counter()
                        filled = SafetensorsLoader().fill(model, HostBackend(), "cpu0", lambda *a: None)
                        dt = time.perf_counter() - t0
                        close_fds(filled.fds)
                        key = f"{name}, digest {'on' if digest else 'off'}, {path}"
                        samples.setdefault(key, []).append(round(filled.manifest.total_bytes / dt / 1e9, 2))
    finally:
        HostSegmentWriter._send_fd = kernel_copy
    return samples


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--paths", action="store_true", help="the host backend's two fill paths side by side")
    args = p.parse_args()
    ckpts = {"llama-1g": DATA / "llama-1g", "many": DATA / "many-host"}
    if not (ckpts["llama-1g"] / "model.safetensors.index.json").exists():
        generate_llama(ckpts["llama-1g"], BENCH_LLAMA, shards=4, seed=1)
    generate_many(ckpts["many"])
    if args.paths:
        samples = fill_paths(ckpts, args.rounds)
        text = "| fill | GB/s, each round |\n|---|---|\n" + "\n".join(
            f"| {k} | {' '.join(map(str, v))} |" for k, v in sorted(samples.items())
        )
        path = write_result("host-fill-paths", {"results": samples, "rounds": args.rounds}, text + "\n")
        print(text)
        print("written", path)
        return
    results = {name: bench_checkpoint(name, ckpt, args.rounds) for name, ckpt in ckpts.items()}
    text = table(results) + (
        f"\n\n{os.cpu_count()} cores; every figure with the page cache warm, each checkpoint's side by side "
        "in one run. Track the ratios, not the seconds.\n"
    )
    path = write_result("host-fill", {"results": results, "rounds": args.rounds}, text)
    print(text)
    print("written", path)


if __name__ == "__main__":
    main()
