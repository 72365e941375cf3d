from __future__ import annotations

import errno
import fcntl
import mmap
import os
from pathlib import Path

import pytest

from tests.helpers import fds_opened_since, open_fds
from wcached.errors import ProtocolError
from wcached.memory.host import HostBackend, check_sealed
from wcached.protocol.messages import SegmentInfo


def _filled(data: bytes) -> int:
    w = HostBackend().allocate(len(data), "test")
    w.write_bytes(0, memoryview(data), None)
    return w.finish()


def test_segment_is_sealed_read_only() -> None:
    fd = _filled(b"hello world")
    try:
        assert os.fstat(fd).st_size == mmap.PAGESIZE  # rounded to the granularity
        check_sealed(fd, 11)
        with pytest.raises(PermissionError):
            mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        with pytest.raises(PermissionError):
            os.pwrite(fd, b"x", 0)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 1 << 20)
        with pytest.raises(PermissionError):  # seals cannot be removed or added
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)
        m = mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ)
        assert m[:11] == b"hello world"
        m.close()
    finally:
        os.close(fd)


def test_client_refuses_unsealed_memfd() -> None:
    fd = os.memfd_create("x", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, 4096)
    try:
        with pytest.raises(ProtocolError, match="not sealed"):
            check_sealed(fd, 4096)
    finally:
        os.close(fd)
    r, w = os.pipe()
    with pytest.raises(ProtocolError, match="not a sealable memfd"):
        check_sealed(r, 1)
    os.close(r)
    os.close(w)


def test_write_from_file_hashes_and_reports_short_reads(tmp_path) -> None:
    import hashlib

    src = tmp_path / "src"
    src.write_bytes(bytes(range(256)) * 10)
    w = HostBackend().allocate(5000, "t")
    with open(src, "rb") as f:
        h = hashlib.blake2b(digest_size=16)
        assert w.write_from_file(f.fileno(), 100, 8, 1000, h) == 1000
        assert (
            h.hexdigest() == hashlib.blake2b((bytes(range(256)) * 10)[100:1100], digest_size=16).hexdigest()
        )
        assert w.write_from_file(f.fileno(), 2500, 0, 100, None) == 60  # end of file
    w.abort()


def test_map_segments_gives_read_only_bytes() -> None:
    import torch

    fd = _filled(b"\x01\x02\x03")
    mapped = HostBackend().map_segments(
        [fd], [SegmentInfo(index=0, nbytes=4096, backend="host", device="cpu0")]
    )
    os.close(fd)  # the mapping holds the memory now
    (t,) = mapped.tensors
    assert t.dtype == torch.uint8 and t[:3].tolist() == [1, 2, 3]
    # The mapping itself is read-only (a write would fault, see the daemon
    # tests): its permissions in /proc/self/maps have no "w".
    addr = t.data_ptr()
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= addr < hi:
            perms = line.split()[1]
            assert perms.startswith("r") and "w" not in perms, line
            break
    else:
        raise AssertionError("mapping not found in /proc/self/maps")
    mapped.close()
    assert t[:3].tolist() == [1, 2, 3]


def test_write_run_scatters_one_read_and_reports_short_files(tmp_path) -> None:
    import hashlib

    data = bytes(range(256)) * 4
    src = tmp_path / "src"
    src.write_bytes(data)
    w = HostBackend().allocate(8192, "t")
    pieces = [(0, 100), (256, 0), (512, 300), (1024, 124)]
    hashers = [hashlib.blake2b(digest_size=16) for _ in pieces]
    with open(src, "rb") as f:
        assert w.write_run(f.fileno(), 10, pieces, hashers) == 524
        assert w.write_run(f.fileno(), 900, [(4096, 100), (4352, 100)], [None, None]) == 124
    fd = w.finish()
    m = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ)
    assert m[0:100] == data[10:110]
    assert m[512:812] == data[110:410]
    assert m[1024:1148] == data[410:534]
    assert hashers[2].digest() == hashlib.blake2b(data[110:410], digest_size=16).digest()
    assert m[4096:4196] == data[900:1000]
    assert m[4352:4376] == data[1000:1024]
    m.close()
    os.close(fd)


def _fill_from_file(tmp_path: Path, monkeypatch=None) -> tuple[bytes, bytes, int]:
    """A segment filled from a file, one tensor and a run of two with a gap
    between them in the segment; returns the file's bytes, the segment's and
    the fds this process had open before minus after (the writer's own)."""
    import xxhash

    data = os.urandom(3 * 4096 + 100)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    before = open_fds()
    fd_src = os.open(src, os.O_RDONLY)
    w = HostBackend().allocate(4 * 4096 + 512, "t")
    hashers = [xxhash.xxh3_128(), xxhash.xxh3_128(), xxhash.xxh3_128()]
    try:
        assert w.write_from_file(fd_src, 0, 0, 4096, hashers[0]) == 4096
        pieces = [(4096, 4096), (8192 + 256, len(data) - 8192)]
        assert w.write_run(fd_src, 4096, pieces, hashers[1:]) == len(data) - 4096
    except BaseException:
        w.abort()  # a failing copy leaves no fd to disturb a later test's count
        raise
    finally:
        os.close(fd_src)
    fd = w.finish()
    with mmap.mmap(fd, 4 * 4096 + 512, mmap.MAP_SHARED, mmap.PROT_READ) as m:
        seg = bytes(m)
    os.close(fd)
    leaked = len(fds_opened_since(before))
    assert hashers[0].hexdigest() == xxhash.xxh3_128(data[:4096]).hexdigest()
    assert hashers[1].hexdigest() == xxhash.xxh3_128(data[4096:8192]).hexdigest()
    assert hashers[2].hexdigest() == xxhash.xxh3_128(data[8192:]).hexdigest()
    return data, seg, leaked


def test_a_segment_filled_from_a_file_holds_its_bytes_and_leaves_no_fd(tmp_path: Path) -> None:
    data, seg, leaked = _fill_from_file(tmp_path)
    assert seg[:8192] == data[:8192]
    assert seg[8192:8448] == bytes(256)  # the gap stays zero
    assert seg[8448 : 8448 + len(data) - 8192] == data[8192:]
    assert leaked == 0


def _without_proc(monkeypatch) -> None:
    """/proc/self/fd cannot be opened from here on, as in a sandbox without /proc."""
    real_open = os.open

    def no_proc(path, *a, **k):
        if str(path).startswith("/proc/self/fd/"):
            raise FileNotFoundError(path)
        return real_open(path, *a, **k)

    monkeypatch.setattr(os, "open", no_proc)


def test_without_proc_a_segment_is_filled_through_its_mapping(tmp_path: Path, monkeypatch) -> None:
    """Where /proc/self/fd cannot be opened (a sandbox without /proc), the
    kernel-side copy is not available and the mapping is written instead."""
    _without_proc(monkeypatch)
    data, seg, leaked = _fill_from_file(tmp_path)
    assert seg[:8192] == data[:8192] and seg[8448 : 8448 + len(data) - 8192] == data[8192:]
    assert leaked == 0


def _sendfile_that_gives_up(monkeypatch, err: int, after: int) -> list[int]:
    """os.sendfile copying at most ``after`` bytes in all, then failing with
    ``err`` on every call, as a filesystem that cannot splice answers; returns
    the list its calls are counted in."""
    real = os.sendfile
    calls: list[int] = []
    budget = [after]

    def sendfile(out, src, offset, count):
        calls.append(count)
        if budget[0] <= 0:
            calls.append(-1)  # a refusal
            raise OSError(err, os.strerror(err))
        got = real(out, src, offset, min(count, budget[0]))
        budget[0] -= got
        return got

    monkeypatch.setattr(os, "sendfile", sendfile)
    return calls


# Refused inside the single tensor, inside the run's first copy, inside its second.
@pytest.mark.parametrize("after", [1000, 4096 + 1000, 2 * 4096 + 100])
def test_a_filesystem_that_cannot_splice_is_filled_through_the_mapping(
    tmp_path: Path, monkeypatch, after: int
) -> None:
    """sendfile refused part way (EINVAL, as some FUSE mounts answer) costs
    nothing: the bytes it did not copy go through the mapping, and every
    digest is of the bytes in the segment."""
    calls = _sendfile_that_gives_up(monkeypatch, errno.EINVAL, after=after)
    data, seg, leaked = _fill_from_file(tmp_path)
    assert calls, "the kernel copy was not tried"
    # Asked once: the rest of the segment does not try it again.
    assert calls.count(-1) == 1 and calls[-1] == -1, calls
    assert seg[:8192] == data[:8192]
    assert seg[8448 : 8448 + len(data) - 8192] == data[8192:]
    assert leaked == 0


def test_a_read_error_during_a_kernel_copy_is_the_fills_error(tmp_path: Path, monkeypatch) -> None:
    """EIO is the checkpoint's own failure, not the kernel's lack of splice:
    it is raised, not hidden behind a second read."""
    _sendfile_that_gives_up(monkeypatch, errno.EIO, after=0)
    with pytest.raises(OSError) as e:
        _fill_from_file(tmp_path)
    assert e.value.errno == errno.EIO


@pytest.fixture(params=["kernel copy", "mapping"])
def copy_path(request, monkeypatch) -> str:
    """Each test below once through sendfile, once through the mapping (no /proc)."""
    if request.param == "mapping":
        _without_proc(monkeypatch)
    return request.param


def test_a_file_that_ends_early_gives_what_it_had(tmp_path: Path, copy_path: str) -> None:
    """A checkpoint shorter than its header says: the copy reports the bytes
    it got (the loader names the file and tensor), it never loops or raises."""
    data = os.urandom(5000)
    src = tmp_path / "short.bin"
    src.write_bytes(data)
    w = HostBackend().allocate(3 * 4096, "t")
    with open(src, "rb") as f:
        assert w.write_from_file(f.fileno(), 4000, 0, 4096, None) == 1000
        # A run whose file ends inside its first copy: the second is not made.
        assert w.write_run(f.fileno(), 4500, [(4096, 1000), (8192, 100)], [None, None]) == 500
    fd = w.finish()
    with mmap.mmap(fd, 3 * 4096, mmap.MAP_SHARED, mmap.PROT_READ) as m:
        assert m[:1000] == data[4000:] and m[4096 : 4096 + 500] == data[4500:]
        assert m[8192 : 8192 + 100] == bytes(100)
    os.close(fd)


def test_a_kernel_copy_in_short_steps_is_carried_on_to_the_end(tmp_path: Path, monkeypatch) -> None:
    """sendfile may copy less than asked (signals, some filesystems): the
    rest follows from where it stopped."""
    real = os.sendfile
    monkeypatch.setattr(os, "sendfile", lambda out, src, off, n: real(out, src, off, min(n, 1000)))
    data, seg, _ = _fill_from_file(tmp_path)
    assert seg[:8192] == data[:8192] and seg[8448 : 8448 + len(data) - 8192] == data[8192:]


def test_bytes_from_memory_are_copied_and_hashed(tmp_path: Path) -> None:
    """copy_from_pointer: what the vLLM loader uses for tensors it built."""
    import ctypes

    import xxhash

    data = os.urandom(3000)
    buf = ctypes.create_string_buffer(data, len(data))
    w = HostBackend().allocate(4096, "t")
    h = xxhash.xxh3_128()
    w.copy_from_pointer(100, ctypes.addressof(buf), len(data), h)
    assert h.hexdigest() == xxhash.xxh3_128(data).hexdigest()
    fd = w.finish()
    with mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ) as m:
        assert m[100:3100] == data
    os.close(fd)


def test_a_segment_that_cannot_be_mapped_leaves_no_fd(monkeypatch) -> None:
    def no_memory(*a, **k):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    before = open_fds()
    monkeypatch.setattr(mmap, "mmap", no_memory)
    with pytest.raises(OSError):
        HostBackend().allocate(4096, "t")
    assert fds_opened_since(before) == {}


def test_one_kernel_copy_fd_per_filling_thread(tmp_path: Path) -> None:
    """The kernel copy writes through a second open file of the memfd (its own
    file position): one per filling thread for the segment's whole fill, not
    one per tensor, and none left once the segment is sealed."""
    import threading

    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(64 * 1024))
    fd_src = os.open(src, os.O_RDONLY)

    base = open_fds()

    def opened() -> int:
        return len(fds_opened_since(base))

    w = HostBackend().allocate(64 * 1024, "t")
    try:
        with_writer = opened()
        w.write_from_file(fd_src, 0, 0, 4096, None)
        after_one = opened()
        for i in range(1, 8):
            w.write_from_file(fd_src, i * 4096, i * 4096, 4096, None)
        w.write_run(fd_src, 8 * 4096, [(8 * 4096, 4096), (9 * 4096, 4096)], [None, None])
        assert opened() == after_one == with_writer + 1
        other = threading.Thread(target=w.write_from_file, args=(fd_src, 10 * 4096, 10 * 4096, 4096, None))
        other.start()
        other.join()
        assert opened() == with_writer + 2
        fd = w.finish()
    finally:
        os.close(fd_src)
    # The sealed memfd is open, the source is closed, no copy fd is left.
    assert list(fds_opened_since(base)) == [fd]
    os.close(fd)


def test_preadv_full_carries_on_after_short_reads(tmp_path: Path, monkeypatch) -> None:
    """A read that returns fewer bytes than asked (a network filesystem, a
    signal) is continued where it stopped, across the views' edges."""
    from wcached.memory import base

    data = os.urandom(100)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    real = os.preadv
    steps: list[int] = []

    def short_preadv(fd, views, offset):
        # At most 7 bytes a call, cut inside a view as often as at its edge.
        budget, cut = 7, []
        for v in views:
            cut.append(v[: min(len(v), budget)])
            budget -= len(cut[-1])
            if not budget:
                break
        got = real(fd, cut, offset)
        steps.append(got)
        return got

    monkeypatch.setattr(base.os, "preadv", short_preadv)
    bufs = [bytearray(10), bytearray(0), bytearray(7), bytearray(30), bytearray(60)]
    fd = os.open(src, os.O_RDONLY)
    try:
        got = base.preadv_full(fd, [memoryview(b) for b in bufs], 3)
    finally:
        os.close(fd)
    assert got == 97 and len(steps) > 10
    assert b"".join(bufs) == data[3:] + bytes(10 + 7 + 30 + 60 - 97)


def test_a_segment_is_a_whole_number_of_pages_and_never_less_than_asked() -> None:
    backend = HostBackend()
    page = mmap.PAGESIZE
    for nbytes, want in ((0, page), (1, page), (page, page), (page + 1, 2 * page), (3 * page, 3 * page)):
        assert backend.round_up(nbytes) == want, nbytes


def test_host_memory_is_hashed_while_copying_not_after() -> None:
    """The host backend names no after-fill digest, and asking its segment
    for one is a programming error that names the writer."""
    backend = HostBackend()
    assert backend.after_fill_digest() is None
    writer = backend.allocate(4096, "m.0")
    try:
        with pytest.raises(NotImplementedError, match=r"^HostSegmentWriter hashes while copying$"):
            writer.digest_spans([(0, 8)])
    finally:
        writer.abort()
