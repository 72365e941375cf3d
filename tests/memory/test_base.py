"""The backend-independent parts of a segment writer: what a backend that
has no faster way gets (the CUDA writer's run of tensors, for one)."""

from __future__ import annotations

import os
from pathlib import Path

import xxhash

from wcached.memory.base import SegmentWriter


class _BytesWriter(SegmentWriter):
    """A writer into a bytearray: only write_from_file of its own."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.data = bytearray(nbytes)
        self.reads: list[tuple[int, int, int]] = []

    def write_from_file(self, src_fd, file_offset, offset, nbytes, hasher) -> int:
        self.reads.append((file_offset, offset, nbytes))
        got = os.pread(src_fd, nbytes, file_offset)
        self.data[offset : offset + len(got)] = got
        if hasher is not None:
            hasher.update(got)
        return len(got)

    def write_bytes(self, offset, data, hasher) -> None:
        raise NotImplementedError

    def copy_from_pointer(self, offset, src, nbytes, hasher) -> None:
        raise NotImplementedError

    def finish(self) -> int:
        return -1

    def abort(self) -> None:
        pass


def test_a_run_is_copied_tensor_by_tensor_to_its_places_and_hashed(tmp_path: Path) -> None:
    data = os.urandom(300)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    w = _BytesWriter(1024)
    hashers = [xxhash.xxh3_128(), None, xxhash.xxh3_128()]
    fd = os.open(src, os.O_RDONLY)
    try:
        # Three tensors stored back to back from file offset 20, placed apart.
        got = w.write_run(fd, 20, [(512, 100), (0, 30), (900, 50)], hashers)
    finally:
        os.close(fd)
    assert got == 180
    assert w.reads == [(20, 512, 100), (120, 0, 30), (150, 900, 50)]
    assert w.data[512:612] == data[20:120] and w.data[0:30] == data[120:150]
    assert w.data[900:950] == data[150:200]
    assert hashers[0].hexdigest() == xxhash.xxh3_128(data[20:120]).hexdigest()
    assert hashers[2].hexdigest() == xxhash.xxh3_128(data[150:200]).hexdigest()


def test_a_run_past_the_files_end_stops_there_and_says_how_much(tmp_path: Path) -> None:
    data = os.urandom(130)
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    w = _BytesWriter(1024)
    fd = os.open(src, os.O_RDONLY)
    try:
        got = w.write_run(fd, 20, [(0, 100), (200, 30), (400, 50)], [None, None, None])
    finally:
        os.close(fd)
    # 110 bytes were there: the second tensor is short, the third not read.
    assert got == 110
    assert w.reads == [(20, 0, 100), (120, 200, 30)]
    assert w.data[200:210] == data[120:130] and w.data[210:230] == bytes(20)
