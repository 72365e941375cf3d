"""How many segments, and how many bytes no tensor holds, a vLLM fill built in
place gets for a chunk size: the real :class:`wcached.memory.arena.Arena`
fed the requests torch's caching allocator makes for a Llama's parameters
(vLLM's fused qkv and gate_up, bf16; tensors under 1 MiB share 2 MiB
segments, larger ones ask for their size rounded to 2 MiB), in the order
vLLM constructs them. No GPU: on the H200 the 8B-shaped fill at 1 GiB chunks
held 1.00 GiB that no tensor used (bench/results/vllm-gpu-fill-memory-20261203),
which this model of the requests gives too (0.998 GiB).

Each chunk size is packed without an expectation of the model's bytes, and
with one: the fill's estimate (the checkpoint's bytes and a margin), the
model's bytes exactly, and 5 % low and high, to show what an estimate that
is off costs.

    python3 bench/arena_packing.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import LLAMA8B, write_result

from wcached.loaders.vllm.fill import EXPECTED_MARGIN, EXPECTED_SLACK
from wcached.memory.arena import Arena

MiB = 1 << 20
SMALL_SEGMENT = 2 * MiB
LLAMA70B = {**LLAMA8B, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80}
LLAMA70B |= {"num_attention_heads": 64, "num_key_value_heads": 8}


def requests(cfg: dict) -> list[int]:
    """Parameter bytes in construction order (bf16)."""
    h, inter, heads, kv = (
        cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")
    )
    head = h // heads
    embed = cfg["vocab_size"] * h * 2
    layer = [(heads + 2 * kv) * head * h * 2, h * h * 2, 2 * inter * h * 2, inter * h * 2, h * 2, h * 2]
    return [embed] + layer * cfg["num_hidden_layers"] + [h * 2, embed]


def estimate(model: int, how: str | None) -> int | None:
    """The expected bytes an arena is given: none, the model's exactly, the
    fill's estimate (wcached.loaders.vllm.fill.expected_bytes's margin over
    the checkpoint's bytes), or an estimate 5 % off either way."""
    if how is None:
        return None
    if how == "fill":
        return int(model * (1 + EXPECTED_MARGIN)) + EXPECTED_SLACK
    return int(model * float(how.rstrip("x")))


def pack(sizes: list[int], chunk: int, expected: str | None = None) -> dict:
    bases = [1 << 40]

    def create(n: int) -> tuple[int, None]:
        base = bases[0]
        bases[0] += n + (1 << 30)
        return base, None

    model = sum(sizes)
    # The last chunk may grow to segment_size (4 GiB, as the GPU benchmark's).
    arena = Arena(chunk, SMALL_SEGMENT, create, estimate(model, expected), 4 << 30)
    spans: list[tuple[int, int]] = []
    small_left = 0
    for n in sizes:
        if n < MiB:  # sub-allocated by torch from a shared 2 MiB segment
            if small_left < n:
                spans.append((arena.alloc(SMALL_SEGMENT), SMALL_SEGMENT))
                small_left = SMALL_SEGMENT
            small_left -= n
        else:
            spans.append((arena.alloc(-(-n // SMALL_SEGMENT) * SMALL_SEGMENT), n))
    sealed = arena.seal(spans)
    held = sum(c.nbytes for c in sealed.chunks)
    return {
        "chunk_mib": chunk // MiB,
        "expected": expected or "-",
        "segments": len(sealed.chunks),
        "model_gib": round(model / 2**30, 3),
        "held_gib": round(held / 2**30, 3),
        "unused_gib": round((held - model) / 2**30, 3),
        "held_x_model": round(held / model, 4),
    }


def main() -> None:
    rows = {}
    for name, cfg in (("llama8b", LLAMA8B), ("llama70b", LLAMA70B)):
        rows[name] = [
            pack(requests(cfg), c * MiB, e)
            for c in (256, 512, 1024, 2048)
            for e in (None, "fill", "1.00x", "0.95x", "1.05x")
        ]
    lines = [
        "| model | chunk | expected bytes | segments | model GiB | held GiB | unused GiB | held / model |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, results in rows.items():
        for r in results:
            lines.append(
                f"| {name} | {r['chunk_mib']} MiB | {r['expected']} | {r['segments']} | {r['model_gib']} "
                f"| {r['held_gib']} | {r['unused_gib']} | {r['held_x_model']} |"
            )
    write_result("arena-packing", {"rows": rows}, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
