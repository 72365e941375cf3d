"""Host-memory backend: memfd segments, sealed so every mapping is read-only.

The loader fills a segment (bytes from a checkpoint are copied by the kernel,
page cache to memfd; other bytes go through a writable shared mapping), unmaps
it, then adds F_SEAL_WRITE|F_SEAL_GROW|F_SEAL_SHRINK|F_SEAL_SEAL. From then on the kernel
refuses any writable shared mapping or write(2) of that memfd, for every
process that receives the fd: an engine bug cannot corrupt the cache that the
next engine attaches to.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import threading
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from wcached.errors import ProtocolError
from wcached.memory.base import Hasher, MemoryBackend, SegmentWriter, contiguous_copies, preadv_full

if TYPE_CHECKING:
    import torch

    from wcached.protocol.messages import SegmentInfo

REQUIRED_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
# preadv chunk: large enough for full-speed reads, small enough that progress
# and digests interleave with copies.
_CHUNK = 64 << 20
# What sendfile(2) answers when the source or the memfd cannot be spliced
# (some FUSE and network filesystems): the copy goes through the mapping
# instead. Any other error (EIO, ...) is the file's own and is raised.
_SENDFILE_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV})


class HostSegmentWriter(SegmentWriter):
    def __init__(self, nbytes: int, label: str):
        self.nbytes = nbytes
        self.fd = os.memfd_create(f"wcache:{label}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, nbytes)
            self._map = mmap.mmap(self.fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        self._view = memoryview(self._map)
        # An exported pointer to the mapping, dropped before unmapping.
        self._anchor: ctypes.c_char | None = ctypes.c_char.from_buffer(self._map)
        self._base = ctypes.addressof(self._anchor)
        # Each filling thread's own open file description of the memfd (its
        # own file position, which sendfile writes at); -1 where none.
        self._local = threading.local()
        self._send_fds: list[int] = []
        self._lock = threading.Lock()
        # Cleared once sendfile says it cannot copy from this checkpoint's
        # filesystem: the rest of the segment goes through the mapping.
        self._sendfile_works = True

    def _send_fd(self) -> int:
        if not self._sendfile_works:
            return -1
        fd = getattr(self._local, "fd", None)
        if fd is None:
            try:
                fd = os.open(f"/proc/self/fd/{self.fd}", os.O_WRONLY | os.O_CLOEXEC)
            except OSError:  # no /proc: the mapping does it all
                fd = -1
            self._local.fd = fd
            if fd >= 0:
                with self._lock:
                    self._send_fds.append(fd)
        return fd

    def _send(self, src_fd: int, file_offset: int, offset: int, nbytes: int) -> tuple[int, bool]:
        """Copy file bytes to ``offset`` inside the kernel: how many it
        copied, and whether it stopped because the kernel cannot (the caller
        copies the rest through the mapping) rather than at the file's end.
        The memfd's write path allocates whole pages without zeroing them,
        where a read into the mapping faults in a zeroed page at a time:
        1.15-1.5x a fill without digests on a 2-core machine, the same with
        them (bench/fill_host.py --paths, bench/results/host-fill-paths-20261202)."""
        out = self._send_fd()
        if out < 0:
            return 0, True
        os.lseek(out, offset, os.SEEK_SET)
        done = 0
        while done < nbytes:
            try:
                got = os.sendfile(out, src_fd, file_offset + done, nbytes - done)
            except OSError as e:
                if e.errno not in _SENDFILE_UNSUPPORTED:
                    raise
                self._sendfile_works = False
                return done, True
            if got == 0:
                break
            done += got
        return done, False

    def write_from_file(
        self, src_fd: int, file_offset: int, offset: int, nbytes: int, hasher: Hasher | None
    ) -> int:
        done, unsupported = self._send(src_fd, file_offset, offset, nbytes)
        if hasher is not None and done:
            hasher.update(self._view[offset : offset + done])
        if not unsupported:
            return done
        while done < nbytes:
            want = min(_CHUNK, nbytes - done)
            dst = self._view[offset + done : offset + done + want]
            got = os.preadv(src_fd, [dst], file_offset + done)
            if got == 0:
                break
            if hasher is not None:
                hasher.update(dst[:got])
            done += got
        return done

    def write_run(
        self,
        src_fd: int,
        file_offset: int,
        pieces: Sequence[tuple[int, int]],
        hashers: Sequence[Hasher | None],
    ) -> int:
        if self._send_fd() >= 0:
            got = 0
            unsupported = False
            for dst, src, n in contiguous_copies(pieces):
                if got < src:  # the file ended in an earlier copy
                    break
                sent, unsupported = self._send(src_fd, file_offset + src, dst, n)
                got += sent
                if unsupported:
                    break
            if not unsupported:
                for (o, n), hasher in zip(pieces, hashers, strict=True):
                    if hasher is not None:
                        hasher.update(self._view[o : o + n])
                return got
        # One scattered read straight into the tensors' places (the whole run
        # again where the kernel gave up part way: the same bytes land twice).
        views = [self._view[o : o + n] for o, n in pieces]
        got = preadv_full(src_fd, views, file_offset)
        for view, hasher in zip(views, hashers, strict=True):
            if hasher is not None:
                hasher.update(view)
        return got

    def write_bytes(self, offset: int, data: memoryview, hasher: Hasher | None) -> None:
        self._view[offset : offset + len(data)] = data
        if hasher is not None:
            hasher.update(data)

    def copy_from_pointer(self, offset: int, src: int, nbytes: int, hasher: Hasher | None) -> None:
        ctypes.memmove(self._base + offset, src, nbytes)
        if hasher is not None:
            hasher.update(self._view[offset : offset + nbytes])

    def _close_send_fds(self) -> None:
        with self._lock:
            fds, self._send_fds = self._send_fds, []
        for fd in fds:
            os.close(fd)

    def finish(self) -> int:
        self._close_send_fds()
        self._anchor = None
        self._view.release()
        self._map.close()  # a writable mapping would make F_SEAL_WRITE fail
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, REQUIRED_SEALS | fcntl.F_SEAL_SEAL)
        return self.fd

    def abort(self) -> None:
        self._close_send_fds()
        try:
            self._anchor = None
            self._view.release()
            self._map.close()
        except (BufferError, ValueError):
            pass
        os.close(self.fd)


class HostMappedSegments:
    def __init__(self, maps: list[mmap.mmap], tensors: list[torch.Tensor]):
        self._maps = maps
        self.tensors = tensors

    def close(self) -> None:
        # Tensors handed out keep their mapping alive through the buffer
        # protocol; dropping our references is all that is needed.
        self.tensors = []
        self._maps = []


class HostBackend(MemoryBackend):
    name = "host"
    granularity = mmap.PAGESIZE

    def allocate(self, nbytes: int, label: str) -> HostSegmentWriter:
        return HostSegmentWriter(self.round_up(nbytes), label)

    def map_segments(self, fds: Sequence[int], infos: Sequence[SegmentInfo]) -> HostMappedSegments:
        import torch

        maps: list[mmap.mmap] = []
        tensors: list[torch.Tensor] = []
        for fd, info in zip(fds, infos, strict=True):
            check_sealed(fd, info.nbytes)
            m = mmap.mmap(fd, info.nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
            maps.append(m)
            with warnings.catch_warnings():
                # torch warns that the buffer is not writable: that is the point.
                warnings.simplefilter("ignore", UserWarning)
                tensors.append(torch.frombuffer(m, dtype=torch.uint8))
        return HostMappedSegments(maps, tensors)


def check_sealed(fd: int, nbytes: int) -> None:
    """Refuse a segment that is not a sealed memfd of at least ``nbytes``."""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as e:
        raise ProtocolError(f"segment fd is not a sealable memfd: {e}") from None
    if seals & REQUIRED_SEALS != REQUIRED_SEALS:
        raise ProtocolError(f"segment memfd is not sealed read-only (seals={seals:#x})")
    size = os.fstat(fd).st_size
    if size < nbytes:
        raise ProtocolError(f"segment memfd holds {size} bytes, manifest says {nbytes}")
