"""How a filled tensor's bytes are hashed, by the fill and by ``wcached verify``.

Two algorithms, named in a manifest's ``digest`` attribute:

- ``xxh3_128`` (:data:`HOST`): bytes in host memory, hashed by the CPU as
  they are copied (the safetensors loader, vLLM fills on the host).
- ``wmix128`` (:data:`DEVICE`): bytes that live on a GPU, hashed there with
  torch integer kernels, so that a vLLM fill of a GPU model records a digest
  of every tensor without copying a byte back to the host. The bytes are
  read as little-endian 64-bit words (the last one zero-padded); word ``i``
  with value ``w`` adds ``mix(w + key1(i))`` to one sum and ``mix(w ^
  key2(i))`` to another (mod 2**64), where ``mix`` is splitmix64's finaliser
  and ``key1``/``key2`` are ``mix`` of ``i`` and two seeds; both sums start
  at the byte count. Integer sums are exact in any order, so a CPU and a GPU,
  one chunk or many, give the same digest; a flipped bit, a moved word or a
  truncated tail each change both sums. Like xxh3 here, it identifies
  content and catches corruption; it is not a security boundary (sealed
  memfds and read-only mappings are).

Both hash a tensor's storage span (its ``nbytes`` from its first byte), the
bytes a fill copied.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

HOST = "xxh3_128"
DEVICE = "wmix128"
ALGORITHMS = (HOST, DEVICE)
# Device bytes are hashed this many at a time (a multiple of 8): its
# temporaries (a few int64 tensors of CHUNK/8 words) stay small beside a model.
CHUNK = 32 << 20
# Host copies of device bytes (xxh3 over GPU memory) go through buffers of this size.
HOST_CHUNK = 64 << 20

_MASK = (1 << 64) - 1
_SEED1 = 0x9E3779B97F4A7C15
_SEED2 = 0xD1B54A32D192ED03
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def _signed(x: int) -> int:
    x &= _MASK
    return x - (1 << 64) if x >> 63 else x


def _srl(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 words (torch's >> is arithmetic)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 words (wrapping arithmetic)."""
    z = (z ^ _srl(z, 30)) * _signed(_M1)
    z = (z ^ _srl(z, 27)) * _signed(_M2)
    return z ^ _srl(z, 31)


def span_of(t: torch.Tensor, nbytes: int | None = None) -> torch.Tensor:
    """The ``nbytes`` (default: its elements' bytes) from ``t``'s first byte
    as a 1-D uint8 tensor on its device: its storage span. A view made over
    exactly its elements (no storage behind it reaching that far) gives its
    elements' bytes in order."""
    import torch

    n = t.numel() * t.element_size() if nbytes is None else nbytes
    offset = t.storage_offset() * t.element_size()
    if offset + n <= t.untyped_storage().nbytes():
        span = torch.empty(0, dtype=torch.uint8, device=t.device)
        return span.set_(t.untyped_storage(), offset, (n,))
    return t.detach().reshape(-1).view(torch.uint8)[:n]


def device_digest(span: torch.Tensor) -> str:
    """:data:`DEVICE` of a 1-D uint8 tensor, computed where it lives."""
    import torch

    n = span.numel()
    sums = torch.full((2,), _signed(n), dtype=torch.int64, device=span.device)
    for start in range(0, n, CHUNK):
        piece = span[start : start + CHUNK]
        if piece.numel() % 8 or piece.data_ptr() % 8:
            # An odd tail or an unaligned start: a padded, aligned copy.
            padded = torch.zeros(-(-piece.numel() // 8) * 8, dtype=torch.uint8, device=span.device)
            padded[: piece.numel()] = piece
            piece = padded
        words = piece.view(torch.int64)
        index = torch.arange(start // 8, start // 8 + words.numel(), dtype=torch.int64, device=span.device)
        sums[0] += _mix(words + _mix(index ^ _signed(_SEED1))).sum()
        sums[1] += _mix(words ^ _mix(index ^ _signed(_SEED2))).sum()
    a, b = (int(x) & _MASK for x in sums.tolist())
    return f"{a:016x}{b:016x}"


def host_digest(span: torch.Tensor) -> str:
    """:data:`HOST` of a 1-D uint8 tensor; device bytes are copied to the
    host :data:`HOST_CHUNK` at a time."""
    import ctypes

    import xxhash

    h = xxhash.xxh3_128()
    for start in range(0, span.numel(), HOST_CHUNK):
        piece = span[start : start + HOST_CHUNK]
        if piece.device.type != "cpu":
            piece = piece.cpu()
        h.update((ctypes.c_char * piece.numel()).from_address(piece.data_ptr()))
    return h.hexdigest()


def digest(t: torch.Tensor, algorithm: str, nbytes: int | None = None) -> str:
    """The ``algorithm`` digest of ``t``'s storage span (see :func:`span_of`)."""
    span = span_of(t, nbytes)
    if algorithm == DEVICE:
        return device_digest(span)
    if algorithm == HOST:
        return host_digest(span)
    raise ValueError(f"unknown digest algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
