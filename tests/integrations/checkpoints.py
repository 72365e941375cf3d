"""Checkpoints the vLLM tests need beyond wcached.cli.demo's bf16 Llama."""

from __future__ import annotations

import json
import math
import random
import struct
from pathlib import Path

from wcached.cli.demo import LLAMA_TINY, llama_shapes, write_safetensors


def generate_awq_llama(out: Path, group: int = 128, seed: int = 0) -> Path:
    """The tiny Llama as an AutoAWQ (GEMM, 4-bit, zero point) checkpoint:
    random packed weights, constant zeros and scales. vLLM's CPU build loads
    it with AutoAWQMarlinLinearMethod, whose post-processing repacks."""
    cfg = dict(LLAMA_TINY, intermediate_size=768, torch_dtype="float16")
    cfg["quantization_config"] = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group,
        "zero_point": True,
        "version": "gemm",
    }
    rng = random.Random(seed)

    def half(n: int, value: float | None = None) -> bytes:
        if value is not None:
            return struct.pack("<e", value) * n
        return b"".join(struct.pack("<e", rng.uniform(-0.05, 0.05)) for _ in range(n))

    entries = []
    for name, shape in llama_shapes(cfg):
        base = name.removesuffix(".weight")
        if name.endswith("_proj.weight"):
            out_f, in_f = shape
            groups = in_f // group
            entries.append((base + ".qweight", "I32", (in_f, out_f // 8), rng.randbytes(in_f * out_f // 2)))
            entries.append((base + ".qzeros", "I32", (groups, out_f // 8), b"\x88" * (groups * out_f // 2)))
            entries.append((base + ".scales", "F16", (groups, out_f), half(groups * out_f, 0.01)))
        else:
            n = math.prod(shape)
            entries.append((name, "F16", shape, half(n, 1.0) if name.endswith("norm.weight") else half(n)))
    out.mkdir(parents=True, exist_ok=True)
    write_safetensors(out / "model.safetensors", entries)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return out
