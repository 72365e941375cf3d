"""A torch memory pool whose segments are CUDA VMM chunks wcached exports.

Around vLLM's model construction and weight loading, the loader worker
routes this thread's allocations into a ``torch.cuda.MemPool`` whose
allocator is an :class:`~wcached.memory.arena.Arena` of exportable VMM
chunks (as ModelExpress's VMM arena and Dynamo's GPU Memory Service route
theirs). The weights are then born in the memory that is exported: the fill
needs the model's memory once, and makes no copy.

torch resolves a pluggable allocator to two C function pointers
(``torch._C._cuda_customAllocator``, what ``CUDAPluggableAllocator`` calls
with symbols of a compiled library); ctypes callbacks are such pointers, so
nothing is compiled. The callback runs under torch's allocator lock and
takes the GIL, so a second thread that held the GIL while it waited for that
lock (allocating or freeing CUDA memory) would deadlock the two: the loader
worker runs no other thread that touches CUDA.

torch gives a pool's segments back to its allocator only once the pool is
gone, and a fill's pool lives as long as its process (the worker exits once
it has filled): so the free function is one that does nothing and needs no
Python (libc's ``getpid``, whose result is ignored). A Python callback there
would be called as the interpreter shuts down, after ctypes freed it, and
the worker would die of SIGSEGV on its way out (a test process with one did,
on the H200). A fill
that fails leaves its chunks to the process's exit, which the worker makes
at once.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from wcached.errors import DeviceError, OutOfMemory
from wcached.memory.arena import Arena, ArenaError, SealedArena
from wcached.memory.cuda import export_allocation, map_new_allocation, protect_read_only
from wcached.protocol.wire import close_fds

if TYPE_CHECKING:
    from wcached.memory.cuda import CudaBackend


# Chunks of at most this many bytes (and at most the model's segment_size):
# the last chunk's unused tail is the most a fill holds beyond the weights
# and torch's rounding, and each chunk is one fd of an attach.
CHUNK_BYTES = 1 << 30

_ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
# free(ptr, size, device, stream): a C function that touches none of them.
_NO_FREE = ctypes.cast(ctypes.CDLL(None).getpid, ctypes.c_void_p).value

# Every arena of this process, with its pool and callback (see above).
_KEPT: list[Any] = []


def unsupported_reason() -> str | None:
    """Why this torch cannot route allocations to an arena, or None."""
    try:
        import torch
    except ImportError:
        return "torch is not importable"
    missing = [
        name
        for name, where in (
            ("torch.cuda.MemPool", torch.cuda),
            ("torch.cuda.use_mem_pool", torch.cuda),
            ("torch._C._cuda_customAllocator", torch._C),
        )
        if not hasattr(where, name.rsplit(".", 1)[1])
    ]
    return f"this torch ({torch.__version__}) has no {', '.join(missing)}" if missing else None


class CudaArena:
    """One fill's arena on the backend's GPU, and the torch pool over it."""

    def __init__(self, backend: CudaBackend, chunk_bytes: int, label: str, expected_bytes: int | None = None):
        import torch

        self.backend = backend
        self.label = label
        chunk = max(backend.granularity, min(chunk_bytes, CHUNK_BYTES))
        chunk -= chunk % backend.granularity
        # The last chunk may grow to the model's segment_size to end where
        # its expected bytes do.
        self.arena = Arena(chunk, backend.granularity, self._create, expected_bytes, chunk_bytes)
        # What a callback could not do: torch sees a null pointer (and raises
        # its OutOfMemoryError); the fill reports this instead.
        self.error: BaseException | None = None
        self._alloc_fn = _ALLOC(self._alloc)
        self._allocator = torch._C._cuda_customAllocator(
            ctypes.cast(self._alloc_fn, ctypes.c_void_p).value, _NO_FREE
        )
        self.pool = torch.cuda.MemPool(self._allocator)
        _KEPT.append(self)

    @contextlib.contextmanager
    def allocating(self) -> Iterator[None]:
        """This thread's CUDA allocations come from the arena meanwhile."""
        import torch

        self.error = None
        try:
            with torch.cuda.use_mem_pool(self.pool, device=torch.device("cuda", self.backend.ordinal)):
                yield
        except Exception as e:
            # torch's report of the null pointer the callback returned (the
            # error is cleared by every request that succeeds after it).
            if self.error is not None:
                raise self.error from e
            raise

    def seal(self, spans: Sequence[tuple[int, int]]) -> tuple[SealedArena, list[int]]:
        """Export the chunks that hold ``spans`` (one fd each, in the order of
        ``SealedArena.chunks``); this process's own mapping of them becomes
        read-only."""
        import torch

        torch.cuda.synchronize(self.backend.ordinal)
        sealed = self.arena.seal(spans)
        fds: list[int] = []
        try:
            for chunk in sealed.chunks:
                fds.append(export_allocation(self.backend.cu, chunk.handle))
            for chunk in sealed.chunks:
                protect_read_only(self.backend, chunk.base, chunk.nbytes)
        except BaseException:
            close_fds(fds)
            raise
        return sealed, fds

    # -- the allocator's callback (it must not raise) ----------------------

    def _alloc(self, nbytes: int, device: int, stream: Any) -> int:
        try:
            address = self.arena.alloc(nbytes)
            self.error = None  # torch retries after freeing its cache
            return address
        except (OutOfMemory, DeviceError, ArenaError) as e:
            self.error = e
        except Exception as e:  # a bug: reported by the fill, not lost in torch
            self.error = DeviceError(f"arena of {self.label}: {type(e).__name__}: {e}")
        return 0

    def _create(self, nbytes: int) -> tuple[int, Any]:
        handle, va = map_new_allocation(self.backend, nbytes, f"model {self.label}'s weights")
        return va, handle
