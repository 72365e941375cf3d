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

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

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


def formula_digest(data: bytes) -> str:
    """:data:`DEVICE` of ``data`` in plain integers, word by word, as the
    module's docstring states it: slow, for checking a fast implementation
    on a few words (the CUDA kernel checks itself with it when loaded)."""

    def mix(z: int) -> int:
        z = ((z ^ (z >> 30)) * _M1) & _MASK
        z = ((z ^ (z >> 27)) * _M2) & _MASK
        return z ^ (z >> 31)

    a = b = len(data)
    padded = data + b"\0" * (-len(data) % 8)
    for i in range(len(padded) // 8):
        w = int.from_bytes(padded[8 * i : 8 * i + 8], "little")
        a += mix((w + mix(i ^ _SEED1)) & _MASK)
        b += mix(w ^ mix(i ^ _SEED2))
    return f"{a & _MASK:016x}{b & _MASK:016x}"


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
    """:data:`DEVICE` of a 1-D uint8 tensor, computed where it lives: on a
    GPU by one kernel (:mod:`wcached.memory.cuda_digest`) where it can be
    built, else by torch's integer kernels (:func:`torch_digest`)."""
    if span.device.type == "cuda" and span.numel():
        got = _kernel_digests([span])
        if got is not None:
            return got[0]
    return torch_digest(span)


_kernel_refused: list[str] = []


def _kernel_digests(spans: list[torch.Tensor]) -> list[str] | None:
    """The CUDA kernel's digests of ``spans`` (non-empty, all on one GPU) in
    one launch, or None (said once) where the kernel cannot be built (no
    NVRTC): torch's reference does it then."""
    import torch

    from wcached.errors import DeviceError

    if _kernel_refused:
        return None
    try:
        from wcached.memory import cuda_digest

        with torch.cuda.device(spans[0].device):
            stream = torch.cuda.current_stream().cuda_stream
            return cuda_digest.digest_spans([(s.data_ptr(), s.numel()) for s in spans], stream)
    except (DeviceError, ImportError) as e:
        import logging

        _kernel_refused.append(str(e))
        logging.getLogger("wcached.digest").warning("GPU digests use torch's kernels (slower): %s", e)
        return None


def torch_digest(span: torch.Tensor) -> str:
    """:data:`DEVICE` of a 1-D uint8 tensor with torch's integer kernels, on
    whatever device it lives: the algorithm's reference."""
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
        sums += _word_sums(piece.view(torch.int64), start // 8)
    return _hex(sums)


def _word_sums(words: torch.Tensor, first: int) -> torch.Tensor:
    """The two sums' terms of int64 ``words`` whose first is word ``first``."""
    import torch

    index = torch.arange(first, first + words.numel(), dtype=torch.int64, device=words.device)
    return torch.stack(
        [_mix(words + _mix(index ^ _signed(_SEED1))).sum(), _mix(words ^ _mix(index ^ _signed(_SEED2))).sum()]
    )


def _hex(sums: torch.Tensor) -> str:
    a, b = (int(x) & _MASK for x in sums.tolist())
    return f"{a:016x}{b:016x}"


class _DeviceStream:
    """:data:`DEVICE` of bytes given piece by piece, hashed with torch on
    ``device`` (each piece copied there)."""

    def __init__(self, device: str) -> None:
        import torch

        self.device = device
        self.sums = torch.zeros(2, dtype=torch.int64, device=device)
        self.words = 0  # whole words hashed so far
        self.tail = b""  # bytes after them, fewer than 8

    def update(self, data: Any, /) -> None:
        import torch

        buf = self.tail + bytes(data)
        whole = len(buf) // 8 * 8
        self.tail = buf[whole:]
        for start in range(0, whole, CHUNK):
            piece = bytearray(buf[start : min(whole, start + CHUNK)])
            words = torch.frombuffer(piece, dtype=torch.int64).to(self.device)
            self.sums += _word_sums(words, self.words)
            self.words += words.numel()

    def hexdigest(self) -> str:
        import torch

        n = self.words * 8 + len(self.tail)
        sums = self.sums + _signed(n)
        if self.tail:
            last = bytearray(self.tail + b"\0" * (8 - len(self.tail)))
            sums += _word_sums(torch.frombuffer(last, dtype=torch.int64).to(self.device), self.words)
        return _hex(sums)


def stream(algorithm: str, device: str = "cpu") -> Any:
    """A hasher (``update(bytes)``, ``hexdigest()``) of ``algorithm`` for
    bytes read piece by piece (``wcached verify`` reading a checkpoint):
    xxh3 on the host, or wmix128 with torch on ``device``."""
    if algorithm == HOST:
        import xxhash

        return xxhash.xxh3_128()
    if algorithm == DEVICE:
        return _DeviceStream(device)
    raise ValueError(f"unknown digest algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")


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
    return digests([(t, nbytes)], algorithm)[0]


def digests(items: Sequence[tuple[torch.Tensor, int | None]], algorithm: str) -> list[str]:
    """:func:`digest` of each ``(tensor, nbytes)``, in order. GPU tensors
    under :data:`DEVICE` are digested in one kernel launch per GPU: a launch
    per tensor cost a 13 GiB vLLM fill 0.13 s, one launch 0.012 s."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown digest algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})")
    spans = [span_of(t, n) for t, n in items]
    if algorithm == HOST:
        return [host_digest(s) for s in spans]
    out = [""] * len(spans)
    on_gpu: dict[torch.device, list[int]] = {}
    for i, s in enumerate(spans):
        if s.device.type == "cuda" and s.numel():
            on_gpu.setdefault(s.device, []).append(i)
        else:
            out[i] = device_digest(s)
    for members in on_gpu.values():
        got = _kernel_digests([spans[i] for i in members])
        for k, i in enumerate(members):
            out[i] = got[k] if got is not None else torch_digest(spans[i])
    return out
