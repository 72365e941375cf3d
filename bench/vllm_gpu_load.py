"""vLLM on a GPU: model load and time to first token, wcache against disk.

An 8B-shaped Llama in bf16 (random weights, about 16 GB) on GPU 0:
- a disk engine with the page cache warm, then dropped (POSIX_FADV_DONTNEED
  on every checkpoint file);
- the daemon's fill through vLLM (seconds to READY, and its peak GPU memory);
- an engine with ``--load-format wcache`` (fallback off), page cache warm and
  dropped.
Each engine is a fresh process; vLLM's own "Model loading took" and the time
from ``LLM(...)`` to the first generated token are recorded. Engines run with
``enforce_eager`` (no graph capture), so the first-token time is start-up
without compilation.

    PYTHONPATH=/var/tmp/site python3 bench/vllm_gpu_load.py [--rounds 1]
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import LLAMA8B, drop_page_cache, warm_page_cache, write_result

from tests.helpers import run_daemon
from tests.integrations.test_vllm_gpu import _config, engine
from wcached.cli.demo import llama_shapes


def generate_on_gpu(out: Path, cfg: dict, shard_bytes: int = 4 << 30) -> Path:
    """Random bf16 weights made on the GPU and written shard by shard
    (the pure-Python generator of wcached.cli.demo would take minutes at 16 GB);
    host memory holds one shard at a time."""
    import json

    import torch
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = list(llama_shapes(cfg))
    groups: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in shapes:
        if size >= shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append((name, shape))
        size += 2 * math.prod(shape)
    weight_map = {}
    for i, group in enumerate(groups):
        part = {}
        for name, shape in group:
            if name.endswith("norm.weight"):
                t = torch.ones(shape, dtype=torch.bfloat16, device="cuda")
            else:
                t = torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) * 0.02
            part[name] = t.cpu()
        fname = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file(part, str(out / fname))
        weight_map.update(dict.fromkeys(part, fname))
    index = {"metadata": {}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def gpu_name() -> str:
    r = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True
    )
    return r.stdout.strip().splitlines()[0] if r.returncode == 0 else "unknown GPU"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--dir", default=None, help="where to write the checkpoint (default: a temp dir)")
    args = p.parse_args()
    import vllm

    work = Path(args.dir or tempfile.mkdtemp(prefix="wcached-vllm-gpu-bench-"))
    t0 = time.perf_counter()
    model = generate_on_gpu(work / "model", {**LLAMA8B, "max_position_embeddings": 8192})
    gen_s = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    print(f"checkpoint: {size / 1e9:.1f} GB in {gen_s:.0f} s", flush=True)
    rows: dict[str, list[float]] = {}

    def run(label: str, **kw) -> None:
        out = engine(model, gpu_memory_utilization=0.5, max_model_len=2048, **kw)
        if out["rc"] != 0:
            raise SystemExit(out["log"][-4000:])
        figures = {
            "load_s": out["vllm_load_s"],
            "first_token_s": out["first_token_s"],
            "kv_gib": out["kv_gib"],
        }
        for k, v in figures.items():
            rows.setdefault(f"{label}.{k}", []).append(v)
        print(label, figures, flush=True)

    for _ in range(args.rounds):
        warm_page_cache(model)
        run("disk_warm")
        drop_page_cache(model)
        run("disk_cold")
    cfg = _config(work, model, engine_args={"max_model_len": 2048}, segment_size="4GiB")
    drop_page_cache(model)
    t0 = time.perf_counter()
    with run_daemon(cfg, "0", timeout=900) as d:
        ready_s = time.perf_counter() - t0
        log = d.log()
        fill = re.search(r"filled default: .* in ([0-9.]+) s", log)
        peak = re.search(r"peak device memory ([0-9.]+) GiB \(([0-9.]+)x the model\)", log)
        print(f"daemon READY after {ready_s:.1f} s; {fill.group(0) if fill else log[-2000:]}", flush=True)
        extra = {"socket_dir": d.socket_dir, "fallback": False}
        for _ in range(args.rounds):
            warm_page_cache(model)
            run("wcache_warm", load_format="wcache", model_loader_extra_config=extra)
            drop_page_cache(model)
            run("wcache_cold", load_format="wcache", model_loader_extra_config=extra)
    med = {k: statistics.median(v) for k, v in rows.items()}
    result = {
        "gpu": gpu_name(),
        "vllm": vllm.__version__,
        "checkpoint_bytes": size,
        "engine": {"enforce_eager": True, "max_model_len": 2048, "gpu_memory_utilization": 0.5},
        "fill": {
            "ready_s": round(ready_s, 2),
            "fill_s": float(fill.group(1)) if fill else None,
            "peak_gib": float(peak.group(1)) if peak else None,
            "peak_x_model": float(peak.group(2)) if peak else None,
            "page_cache": "dropped before the daemon started",
        },
        "runs": rows,
        "median": med,
    }
    lines = [
        f"vLLM {vllm.__version__} on one {result['gpu']} (PYTHONPATH=/var/tmp/site), "
        f"{size / 1e9:.1f} GB bf16 8B-shaped Llama",
        "",
        "| engine | model load (vLLM) | LLM() to first token |",
        "|---|---|---|",
    ]
    for label in ("disk_warm", "disk_cold", "wcache_warm", "wcache_cold"):
        lines.append(f"| {label} | {med[label + '.load_s']:.2f} s | {med[label + '.first_token_s']:.1f} s |")
    lines += [
        "",
        f"load ratio disk/wcache: warm {med['disk_warm.load_s'] / med['wcache_warm.load_s']:.0f}x, "
        f"cold {med['disk_cold.load_s'] / med['wcache_cold.load_s']:.0f}x",
        f"daemon fill (cold page cache): READY after {ready_s:.1f} s, peak GPU memory "
        f"{result['fill']['peak_gib']} GiB = {result['fill']['peak_x_model']}x the model",
    ]
    write_result("vllm-gpu-load", result, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
