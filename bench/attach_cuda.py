"""CUDA benchmark (H200): attach vs per-tensor legacy CUDA IPC vs load_file,
and daemon fill throughput vs raw reads. One run measures everything side by
side for each checkpoint:

  (a) "llama8b": an 8B Llama in bf16 (~16 GB, 291 tensors, 4 shards);
  (b) "many":    ~4 GB in 5,000 tensors (2 shards).

  attach_fresh:  a fresh client process (torch and CUDA already initialised)
                 times connect -> every tensor usable on the GPU (views built,
                 one element of the last tensor read back);
  attach_warm:   the same, repeated inside one process;
  ipc_fresh:     the per-tensor legacy CUDA IPC of vLLM's and SGLang's daemons:
                 reduce_tensor() in a holder process, rebuild_cuda_tensor() of
                 every tensor plus the name binding in a fresh client process;
  load_file:     safetensors.torch.load_file(device="cuda"), warm and with the
                 page cache dropped;
  fill:          the daemon's fill (cold and warm) against one sequential
                 reader of the same files (cold).

Run from the repo root: python3 bench/attach_cuda.py [--only a|b].
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
from common import DATA, LLAMA8B, REPO, copy_to_out, summary, write_result

from tests.helpers import run_daemon, write_config
from wcached.cli.demo import llama_shapes


def many_shapes() -> list[tuple[str, tuple[int, ...]]]:
    # 5,000 tensors of 400 x 1024 bf16 (800 KiB): ~4.1 GB.
    return [(f"blocks.{i // 10}.w{i % 10}", (400, 1024)) for i in range(5000)]


def generate(out: Path, shapes: list[tuple[str, tuple[int, ...]]], shards: int) -> None:
    import torch
    from safetensors.torch import save_file

    if (out / "model.safetensors.index.json").exists():
        return
    out.mkdir(parents=True, exist_ok=True)
    # On the GPU where there is one (fast); on the CPU for the host path.
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(0)
    per = -(-len(shapes) // shards)
    weight_map = {}
    for s in range(shards):
        part = shapes[s * per : (s + 1) * per]
        tensors = {
            n: (torch.randn(shape, generator=g, device=dev, dtype=torch.bfloat16) * 0.02).cpu()
            for n, shape in part
        }
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, str(out / name))
        weight_map.update(dict.fromkeys(tensors, name))
        del tensors
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def drop_caches() -> bool:
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")
        return True
    except OSError:
        return False


def raw_read(files: list[Path]) -> float:
    """One sequential reader, 16 MiB at a time."""
    buf = bytearray(16 << 20)
    t0 = time.perf_counter()
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            while os.readv(fd, [buf]):
                pass
        finally:
            os.close(fd)
    return time.perf_counter() - t0


def load_file_cuda(files: list[Path]) -> float:
    import torch
    from safetensors.torch import load_file

    t0 = time.perf_counter()
    out = {}
    for f in files:
        out.update(load_file(str(f), device="cuda"))
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    del out
    torch.cuda.empty_cache()
    return dt


ATTACH_CLIENT = """
import sys, time, torch
torch.cuda.init(); torch.empty(1, device="cuda")
from wcached.client import attach
# Import the backend ahead, as an engine does when it loads the plugin (the
# IPC client likewise imports rebuild_cuda_tensor before timing).
from wcached.memory.cuda import driver
driver()
# The GPU named by its UUID, as the vLLM plugin names it (an index would be
# resolved through NVML, 0.4 ms that no engine spends; until 2026-12-07
# this bench named GPU 0 by index).
gpu = "GPU-" + str(torch.cuda.get_device_properties(0).uuid)
t0 = time.perf_counter()
a = attach("default", gpu, socket_dir=sys.argv[1])
# The last view, found without reading manifest.tensors (which a protocol-3
# client makes from the runs only when asked: 5,000 entries, ~3 ms, that
# binding the views does not need).
last = a.tensors[next(reversed(a.tensors))]
last.view(-1)[0].item()
print(time.perf_counter() - t0, len(a.tensors))
"""

IPC_HOLDER = """
import pickle, sys, torch
from safetensors.torch import load_file
from torch.multiprocessing.reductions import reduce_tensor
tensors = {}
for f in sys.argv[2:]:
    tensors.update(load_file(f, device="cuda"))
torch.cuda.synchronize()
handles = [(n, reduce_tensor(t)[1]) for n, t in tensors.items()]
with open(sys.argv[1], "wb") as out:
    pickle.dump(handles, out)
print("ready", flush=True)
sys.stdin.read()
"""

IPC_CLIENT = """
import pickle, sys, time, torch
torch.cuda.init(); torch.empty(1, device="cuda")
from torch.multiprocessing.reductions import rebuild_cuda_tensor
with open(sys.argv[1], "rb") as f:
    handles = pickle.load(f)
t0 = time.perf_counter()
bound = {n: rebuild_cuda_tensor(*args) for n, args in handles}
bound[handles[-1][0]].view(-1)[0].item()
print(time.perf_counter() - t0, len(bound))
"""


def fresh(script: str, *args: str) -> float:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(r.stderr)
    return float(r.stdout.split()[0])


def fill_seconds(socket_dir: str, instance: str = "0", phases: dict | None = None) -> float:
    """The daemon's whole fill (headers, allocation, reading, digests,
    export); its phases go into ``phases`` where given."""
    from wcached.client import DaemonConnection
    from wcached.device import resolve_instance

    path = os.path.join(socket_dir, f"{resolve_instance(instance).instance_id}.sock")
    with DaemonConnection(path) as c:
        model = c.status().models[0]
    if phases is not None:
        phases.update(model.phases)
    return model.fill_seconds


def bench_checkpoint(name: str, ckpt: Path, rounds: int, read_threads: int | str) -> dict:
    import torch

    from wcached.client import attach

    files = sorted(ckpt.glob("*.safetensors"))
    nbytes = sum(f.stat().st_size for f in files)
    work = Path(tempfile.mkdtemp(prefix=f"wcached-bench-{name}-"))
    cfg = write_config(
        work / "wcached.toml",
        models=[{"name": "default", "path": str(ckpt), "read_threads": read_threads}],
        daemon={"socket_dir": str(work / "run")},
    )
    res: dict = {"files": len(files), "bytes": nbytes}
    cold = drop_caches()
    res["page_cache_dropped"] = cold
    res["raw_read_cold_s"] = raw_read(files)
    drop_caches()
    with run_daemon(cfg, "0", timeout=900) as d:
        res["fill_cold_s"] = fill_seconds(d.socket_dir)
    # Where warm fill time goes: the same without per-tensor digests.
    nodigest = write_config(
        work / "nodigest.toml",
        models=[{"name": "default", "path": str(ckpt), "read_threads": read_threads, "digest": False}],
        daemon={"socket_dir": str(work / "run")},
    )
    res["fill_warm_nodigest_phases"], res["fill_warm_phases"] = {}, {}
    with run_daemon(nodigest, "0", timeout=900) as d:
        res["fill_warm_nodigest_s"] = fill_seconds(d.socket_dir, phases=res["fill_warm_nodigest_phases"])
    with run_daemon(cfg, "0", timeout=900) as d:
        res["fill_warm_s"] = fill_seconds(d.socket_dir, phases=res["fill_warm_phases"])
        sock_dir = d.socket_dir
        res["load_file_warm_s"] = min(load_file_cuda(files) for _ in range(2))
        drop_caches()
        res["load_file_cold_s"] = load_file_cuda(files)

        with attach("default", "0", socket_dir=sock_dir) as a:
            res["tensors"] = len(a.manifest.tensors)
            res["segments"] = len(a.manifest.segments)
        warm = []
        for _ in range(rounds * 4):
            t0 = time.perf_counter()
            a = attach("default", "0", socket_dir=sock_dir)
            a.tensors[a.manifest.tensors[-1].name].view(-1)[0].item()
            warm.append(time.perf_counter() - t0)
            a.close()
            del a
        res["attach_warm"] = summary(warm)

        with tempfile.NamedTemporaryFile(suffix=".pkl") as handles:
            holder = subprocess.Popen(
                [sys.executable, "-c", IPC_HOLDER, handles.name, *map(str, files)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert holder.stdout.readline().strip() == "ready"
            attach_fresh, ipc_fresh = [], []
            for _ in range(rounds):
                attach_fresh.append(fresh(ATTACH_CLIENT, sock_dir))
                ipc_fresh.append(fresh(IPC_CLIENT, handles.name))
            holder.stdin.close()
            holder.wait()
        res["attach_fresh"] = summary(attach_fresh)
        res["ipc_fresh"] = summary(ipc_fresh)
        res["fill_log"] = [x.split(": ", 1)[-1] for x in d.log().splitlines() if "filled" in x]
    torch.cuda.empty_cache()
    gb = nbytes / 1e9
    res["raw_read_cold_GBps"] = round(gb / res["raw_read_cold_s"], 2)
    res["fill_cold_GBps"] = round(gb / res["fill_cold_s"], 2)
    res["fill_warm_GBps"] = round(gb / res["fill_warm_s"], 2)
    res["fill_warm_nodigest_GBps"] = round(gb / res["fill_warm_nodigest_s"], 2)
    res["fill_warm_read_GBps"] = round(gb / res["fill_warm_phases"].get("read", float("nan")), 2)
    res["fill_warm_digest_s"] = res["fill_warm_phases"].get("digest", 0.0)
    res["fill_cold_vs_raw_read"] = round(res["raw_read_cold_s"] / res["fill_cold_s"], 3)
    res["fill_warm_speedup_vs_load_file_warm"] = round(res["load_file_warm_s"] / res["fill_warm_s"], 2)
    res["ipc_over_attach_fresh"] = round(res["ipc_fresh"]["median_ms"] / res["attach_fresh"]["median_ms"], 1)
    return res


def table(results: dict) -> str:
    rows = [
        "| | " + " | ".join(results) + " |",
        "|---|" + "---|" * len(results),
    ]

    def row(label: str, f) -> None:
        rows.append(f"| {label} | " + " | ".join(str(f(r)) for r in results.values()) + " |")

    row("tensors / segments", lambda r: f"{r['tensors']} / {r['segments']}")
    row("bytes", lambda r: f"{r['bytes'] / 1e9:.2f} GB")
    row("attach, fresh process (median ms)", lambda r: r["attach_fresh"]["median_ms"])
    row("attach, warm process (median ms)", lambda r: r["attach_warm"]["median_ms"])
    row("legacy CUDA IPC rebuild, fresh process (median ms)", lambda r: r["ipc_fresh"]["median_ms"])
    row("IPC / attach (fresh)", lambda r: f"{r['ipc_over_attach_fresh']}x")
    row("load_file cuda, warm (s)", lambda r: round(r["load_file_warm_s"], 3))
    row("load_file cuda, cold (s)", lambda r: round(r["load_file_cold_s"], 3))
    row("raw sequential read, cold (GB/s)", lambda r: r["raw_read_cold_GBps"])
    row("fill cold (GB/s)", lambda r: r["fill_cold_GBps"])
    row("fill cold / raw read", lambda r: f"{r['fill_cold_vs_raw_read']:.0%}")
    row("fill warm (GB/s)", lambda r: r["fill_warm_GBps"])
    row("load_file warm / fill warm", lambda r: f"{r['fill_warm_speedup_vs_load_file_warm']}x")
    row("fill warm without digests (GB/s)", lambda r: r["fill_warm_nodigest_GBps"])
    row("fill warm with / without digests", lambda r: f"{r['fill_warm_nodigest_s'] / r['fill_warm_s']:.0%}")
    row("fill warm, its reading phase alone (GB/s)", lambda r: r["fill_warm_read_GBps"])
    row("fill warm, its GPU digest phase (s)", lambda r: r["fill_warm_digest_s"])
    row("page cache dropped", lambda r: r["page_cache_dropped"])
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--only", choices=["a", "b"])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--read-threads", default="auto")
    p.add_argument("--data", default=str(DATA))
    args = p.parse_args()
    data = Path(args.data)
    sets = {
        "a": ("llama8b", lambda: llama_shapes(LLAMA8B), 4),
        "b": ("many", many_shapes, 2),
    }
    results = {}
    for key, (name, shapes, shards) in sets.items():
        if args.only and key != args.only:
            continue
        ckpt = data / name
        t0 = time.perf_counter()
        generate(ckpt, shapes(), shards)
        print(f"{name}: checkpoint ready in {time.perf_counter() - t0:.1f}s", flush=True)
        threads = args.read_threads if args.read_threads == "auto" else int(args.read_threads)
        results[name] = bench_checkpoint(name, ckpt, args.rounds, threads)
        print(json.dumps(results[name], indent=1), flush=True)
    text = table(results) + (
        "\n\nTargets (issue 19): warm fill >= 40 GB/s (a), >= 25 GB/s (b); cold fill >= 95% of raw read; "
        "attach in a fresh process <= 3 ms (a), <= 5 ms (b), >= 40x legacy IPC on (b).\n"
    )
    path = write_result("cuda-attach", {"results": results, "read_threads": args.read_threads}, text)
    print(text)
    print("written", path)
    copy_to_out(path)


if __name__ == "__main__":
    main()
