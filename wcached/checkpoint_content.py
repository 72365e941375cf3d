"""Every byte of a checkpoint, hashed: ``fingerprint = "content"`` for loaders
whose tensors are not the checkpoint's bytes (vLLM fuses and transforms them),
and what ``wcached verify`` recomputes to compare."""

from __future__ import annotations

import os

from wcached.loaders.safetensors import DIGEST_ALGORITHM, checkpoint_files

CHUNK = 64 << 20


def content_digest(path: str) -> str:
    """``xxh3_128:<hex>`` over the checkpoint's safetensors files in name order
    (each file's name and size, then its bytes)."""
    import xxhash

    h = xxhash.xxh3_128()
    for f in sorted(checkpoint_files(path)):
        h.update(f"{os.path.basename(f)}:{os.path.getsize(f)}\n".encode())
        with open(f, "rb") as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
    return f"{DIGEST_ALGORITHM}:{h.hexdigest()}"
