"""A vLLM fill's peak GPU memory and time: weights built in place against copied.

An 8B-shaped Llama in bf16 (random weights made on the GPU, about 16 GB,
written to /dev/shm when it has room) is filled by a daemon on GPU 0 through
vLLM, in bf16 and with ``quantization = "fp8"``, once with
``build_in_place = true`` (the weights born in the chunks wcached exports)
and once with ``false`` (built in vLLM's memory, copied segment by segment),
alternating, each in a fresh daemon and worker, at the operator's default
``segment_size``. Recorded from the worker's own log lines: seconds to READY,
the fill's seconds and phases, its peak GPU memory (device-wide
cuMemGetInfo samples and torch's peak, above what was in use when it began)
and that peak over the model's bytes, the segments, and the bytes held by no
tensor.

    PYTHONPATH=/var/tmp/site python3 bench/vllm_gpu_fill_memory.py [--rounds 1] [--layers 32]
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import LLAMA8B, copy_to_out, write_result
from vllm_gpu_load import generate_on_gpu, gpu_name

from tests.helpers import run_daemon
from tests.integrations.test_vllm_gpu import _config

FILLED = re.compile(
    r"filled in ([0-9.]+) s: ([^;\n]*); peak device memory ([0-9.]+) GiB \(([0-9.]+)x the model\)"
)
IN_PLACE = re.compile(
    r"built in place: (\d+) segments of ([0-9.]+) GiB, ([0-9.]+) GiB of it held by no tensor"
    r".*?(\d+) storages to copy"
)
MEDIANS = ("ready_s", "fill_s", "peak_gib", "peak_x_model")


def fill_once(work: Path, model: Path, quantization: str | None, in_place: bool) -> dict:
    q = {"quantization": quantization} if quantization else {}
    cfg = _config(
        work,
        model,
        engine_args={"max_model_len": 2048, **q},
        segment_size="4GiB",
        build_in_place=in_place,
    )
    t0 = time.perf_counter()
    with run_daemon(cfg, "0", timeout=900) as d:
        ready_s = time.perf_counter() - t0
        log = d.log()
    m = FILLED.search(log)
    if not m:
        raise SystemExit(log[-4000:])
    phases = {k: float(v.removesuffix(" s")) for k, v in (p.split(" ", 1) for p in m.group(2).split(", "))}
    row = {
        "ready_s": round(ready_s, 2),
        "fill_s": float(m.group(1)),
        "phases": phases,
        "peak_gib": float(m.group(3)),
        "peak_x_model": float(m.group(4)),
    }
    placed = IN_PLACE.search(log)
    if placed:
        row |= {
            "segments": int(placed.group(1)),
            "segments_gib": float(placed.group(2)),
            "unused_gib": float(placed.group(3)),
            "storages_copied": int(placed.group(4)),
        }
    elif in_place:
        raise SystemExit("no 'built in place' line in an in-place fill:\n" + log[-4000:])
    return row


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--layers", type=int, default=LLAMA8B["num_hidden_layers"])
    p.add_argument("--dir", default=None, help="where to write the checkpoint (default: /dev/shm if it fits)")
    args = p.parse_args()
    import vllm

    cfg = {**LLAMA8B, "num_hidden_layers": args.layers, "max_position_embeddings": 8192}
    base = args.dir
    if base is None and shutil.disk_usage("/dev/shm").free > 40 << 30:
        base = "/dev/shm"
    work = Path(tempfile.mkdtemp(prefix="wcached-fill-memory-", dir=base))
    t0 = time.perf_counter()
    model = generate_on_gpu(work / "model", cfg)
    size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    print(f"checkpoint: {size / 1e9:.2f} GB in {time.perf_counter() - t0:.0f} s under {work}", flush=True)
    runs: dict[str, list[dict]] = {}
    try:
        for _ in range(args.rounds):
            for quantization in (None, "fp8"):
                for in_place in (True, False):
                    label = f"{quantization or 'bf16'}.{'in_place' if in_place else 'copied'}"
                    row = fill_once(work, model, quantization, in_place)
                    runs.setdefault(label, []).append(row)
                    print(label, row, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {label: {k: statistics.median(r[k] for r in rows) for k in MEDIANS} for label, rows in runs.items()}
    result = {
        "gpu": gpu_name(),
        "vllm": vllm.__version__,
        "checkpoint_bytes": size,
        "layers": args.layers,
        "segment_size": "4GiB",
        "rounds": args.rounds,
        "runs": runs,
        "median": med,
    }
    lines = [
        f"vLLM {vllm.__version__} on one {result['gpu']}, {size / 1e9:.2f} GB bf16 8B-shaped Llama "
        f"({args.layers} layers), segment_size 4GiB, {args.rounds} round(s), medians",
        "",
        "| fill | peak GPU memory | x the model | fill s | READY s | segments | held by no tensor |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, rows in runs.items():
        last = rows[-1]
        segs = last.get("segments", "-")
        unused = f"{last['unused_gib']:.2f} GiB" if "unused_gib" in last else "-"
        m = med[label]
        lines.append(
            f"| {label} | {m['peak_gib']:.2f} GiB | {m['peak_x_model']:.2f} | {m['fill_s']:.1f} "
            f"| {m['ready_s']:.1f} | {segs} | {unused} |"
        )
    for q in ("bf16", "fp8"):
        a, b = med.get(f"{q}.in_place"), med.get(f"{q}.copied")
        if a and b:
            lines.append(
                f"\n{q}: peak in place / copied {a['peak_gib'] / b['peak_gib']:.2f}; "
                f"fill seconds {a['fill_s'] / b['fill_s']:.2f}"
            )
    copy_to_out(write_result("vllm-gpu-fill-memory", result, "\n".join(lines)))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
