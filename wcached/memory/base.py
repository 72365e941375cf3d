"""The backend interface shared by the host-memory and CUDA backends.

Loader-worker side: :meth:`MemoryBackend.allocate` gives a
:class:`SegmentWriter`; the loader writes tensor bytes at offsets (from several
threads, disjoint ranges), then :meth:`SegmentWriter.finish` makes the segment
read-only for everyone else and returns the fd that carries it.

Client side: :meth:`MemoryBackend.map_segments` turns received fds into
read-only byte tensors, one per segment, on which tensor views are built.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from wcached.protocol.messages import SegmentInfo


# The most bytes one write_run() copies, unless a backend says otherwise
# (MemoryBackend.run_bytes): large enough for full-speed reads.
MAX_RUN_BYTES = 16 << 20


class Hasher(Protocol):
    def update(self, data: Any, /) -> None: ...


def preadv_full(fd: int, views: list[memoryview], offset: int) -> int:
    """``preadv`` until every view is full or the file ends; returns bytes read."""
    total = 0
    views = [v for v in views if len(v)]
    while views:
        got = os.preadv(fd, views, offset + total)
        if got == 0:
            break
        total += got
        while views and got >= len(views[0]):
            got -= len(views.pop(0))
        if got:
            views[0] = views[0][got:]
    return total


def contiguous_copies(pieces: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """``(offset, nbytes)`` places of tensors read back to back into one
    buffer, as the fewest ``(destination, buffer position, nbytes)`` copies:
    neighbours in the buffer (all are) that are neighbours in the segment
    too are one copy."""
    copies: list[tuple[int, int, int]] = []
    pos = 0
    for offset, nbytes in pieces:
        if nbytes:
            if copies and copies[-1][0] + copies[-1][2] == offset:
                dst, src, n = copies[-1]
                copies[-1] = (dst, src, n + nbytes)
            else:
                copies.append((offset, pos, nbytes))
        pos += nbytes
    return copies


class SegmentWriter(abc.ABC):
    nbytes: int

    @abc.abstractmethod
    def write_from_file(
        self, src_fd: int, file_offset: int, offset: int, nbytes: int, hasher: Hasher | None
    ) -> int:
        """Copy ``nbytes`` of ``src_fd`` at ``file_offset`` to ``offset``;
        returns the bytes copied (short only at end of file)."""

    def write_run(
        self,
        src_fd: int,
        file_offset: int,
        pieces: Sequence[tuple[int, int]],
        hashers: Sequence[Hasher | None],
    ) -> int:
        """Copy tensors stored back to back in the file from ``file_offset``
        to their ``(offset, nbytes)`` places; one read for all of them (at most
        the backend's :attr:`MemoryBackend.run_bytes`). Returns the bytes read."""
        done = 0
        for (offset, nbytes), hasher in zip(pieces, hashers, strict=True):
            got = self.write_from_file(src_fd, file_offset + done, offset, nbytes, hasher)
            done += got
            if got < nbytes:
                break
        return done

    @abc.abstractmethod
    def write_bytes(self, offset: int, data: memoryview, hasher: Hasher | None) -> None:
        """Copy ``data`` to ``offset``."""

    @abc.abstractmethod
    def copy_from_pointer(self, offset: int, src: int, nbytes: int, hasher: Hasher | None) -> None:
        """Copy ``nbytes`` at address ``src`` (host, or device where the
        backend is a device) to ``offset``; used by loaders that build tensors
        themselves (vLLM)."""

    def digest_spans(self, spans: Sequence[tuple[int, int]]) -> list[str]:
        """The backend's :meth:`MemoryBackend.after_fill_digest` of each
        ``(offset, nbytes)`` of this segment, once every write has landed
        (only where the backend names one)."""
        raise NotImplementedError(f"{type(self).__name__} hashes while copying")

    @abc.abstractmethod
    def finish(self) -> int:
        """Seal or export the segment; returns the fd that now owns it."""

    @abc.abstractmethod
    def abort(self) -> None:
        """Free everything after a failed fill."""


class MappedSegments(Protocol):
    """Read-only byte tensors, one per segment, and how to let them go."""

    tensors: list[torch.Tensor]

    def close(self) -> None: ...


class MemoryBackend(abc.ABC):
    name: str
    # Segment sizes are rounded up to this.
    granularity: int
    # The most bytes one SegmentWriter.write_run() takes (a staging buffer's
    # worth where the backend stages).
    run_bytes: int = MAX_RUN_BYTES
    # Reader threads that read_threads = "auto" gives a fill, at most.
    auto_readers: int = 16

    @abc.abstractmethod
    def allocate(self, nbytes: int, label: str) -> SegmentWriter: ...

    @abc.abstractmethod
    def map_segments(self, fds: Sequence[int], infos: Sequence[SegmentInfo]) -> MappedSegments: ...

    def prepare_fill(self) -> None:  # noqa: B027 - an optional hook
        """One-time setup before filling (a CUDA context); nothing by default."""

    def prepare_staging(self, threads: int) -> None:  # noqa: B027 - an optional hook
        """A fill is about to copy through ``threads`` reader threads: a
        backend that stages bytes may start preparing its buffers now, while
        the loader reads headers and allocates segments. Nothing by default."""

    def after_fill_digest(self) -> str | None:
        """The digest algorithm (:mod:`wcached.tensor_digest`) this backend
        computes over its own filled memory, off the copy path
        (:meth:`SegmentWriter.digest_spans`); None: loaders hash the bytes
        on the host as they copy them (``xxh3_128``)."""
        return None

    def round_up(self, nbytes: int) -> int:
        g = self.granularity
        return max(g, (nbytes + g - 1) // g * g)


# progress(done_bytes, total_bytes=0): how much of the model's checkpoint a
# fill has read so far, out of how much (0: not known; a loader written for
# progress(done) alone still works).
ProgressFn = Callable[..., None]
