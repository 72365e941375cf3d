"""The checkpoint's facts, asked of one owner: its files, stamps,
readability, fingerprints, headers and a tensor's bytes."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
import torch
import xxhash

from tests.helpers import write_sharded
from wcached.dtypes import DTYPES
from wcached.errors import CheckpointCorrupt, CheckpointMissing, CheckpointUnreadable, FillError, TooManyFiles
from wcached.loaders.checkpoint import (
    Checkpoint,
    StoredTensor,
    cast_pieces,
    read_pieces,
)


def _raw_file(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_files_are_every_visible_file_and_stamps_follow_them(tmp_path: Path) -> None:
    ckpt = write_sharded(tmp_path / "c", {"a": torch.ones(2), "b": torch.ones(3)}, shards=2)
    (ckpt / ".lock").write_text("")  # a download tool's
    (ckpt / "original").mkdir()
    (ckpt / "original" / "params.json").write_text("{}")
    files = Checkpoint(ckpt).files()
    names = [os.path.relpath(f, ckpt) for f in files]
    assert ".lock" not in names and "original/params.json" in names
    assert names == sorted(names, key=lambda n: (n.count("/"), n))
    stamps = {s.path: s for s in Checkpoint(ckpt).stamps()}
    assert set(stamps) == set(names)
    shard = next(ckpt.glob("*.safetensors"))
    assert stamps[shard.name].size == shard.stat().st_size
    # A single file is stamped under its own name.
    assert [s.path for s in Checkpoint(shard).stamps()] == [shard.name]


def test_missing_is_retried_and_too_many_files_is_refused(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(CheckpointMissing, match=r"does not exist \(not mounted yet"):
        Checkpoint(tmp_path / "nope").check_readable()
    monkeypatch.setattr("wcached.loaders.checkpoint.MAX_FILES", 3)
    for i in range(5):
        (tmp_path / f"f{i}").write_text("")
    with pytest.raises(TooManyFiles, match="more than 3 files"):
        Checkpoint(tmp_path).files()
    # A hub id (a loader that resolves one) has nothing to open here.
    Checkpoint("org/model", hub_ok=True).check_readable()
    with pytest.raises(CheckpointMissing):
        Checkpoint("org/model").check_readable()


def test_an_unopenable_shard_is_named(tmp_path: Path, monkeypatch) -> None:
    """Readability is decided by opening each file (as root, ACLs and a
    squashing NFS server decide at open, not at access(2)): simulated here,
    as another user in tests/cli/test_cli.py."""
    ckpt = write_sharded(tmp_path / "c", {"a": torch.ones(2), "b": torch.ones(3)}, shards=2)
    victim = sorted(ckpt.glob("*.safetensors"))[1]
    real_open = os.open

    def open_(path, flags, *a):
        if str(path) == str(victim):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *a)

    monkeypatch.setattr(os, "open", open_)
    with pytest.raises(CheckpointUnreadable, match=f"checkpoint file {victim} cannot be read by user") as e:
        Checkpoint(ckpt).check_readable()
    assert e.value.exit_status == 78


def test_fingerprint_of_other_formats_samples_them(tmp_path: Path) -> None:
    d = tmp_path / "bin"
    d.mkdir()
    (d / "pytorch_model.bin").write_bytes(b"\1" * 100)
    (d / "config.json").write_text("{}")
    fp = Checkpoint(d).fingerprint(("*.bin",))
    assert fp.startswith("sampled:")
    (d / "config.json").write_text('{"x": 1}')  # not a weight file: same
    assert Checkpoint(d).fingerprint(("*.bin",)) == fp
    (d / "pytorch_model.bin").write_bytes(b"\2" * 100)
    assert Checkpoint(d).fingerprint(("*.bin",)) != fp
    st = write_sharded(tmp_path / "st", {"w": torch.ones(2)}, shards=1)
    assert Checkpoint(st).fingerprint(("*.bin",)) == Checkpoint(st).header_fingerprint()


def test_content_digest_sees_every_byte(tmp_path: Path) -> None:
    ckpt = write_sharded(tmp_path / "c", {"w": torch.zeros(64)}, shards=1)
    before = Checkpoint(ckpt).content_digest()
    assert before.startswith("xxh3_128:")
    shard = next(ckpt.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    assert Checkpoint(ckpt).content_digest() != before


def _tensor(path: Path, n: int, dtype: str = "F32") -> StoredTensor:
    return StoredTensor("big", str(path), DTYPES[dtype], (n,), 0, n * DTYPES[dtype].itemsize)


@pytest.mark.parametrize("chunk", [4, 12, 4096])
def test_read_pieces_read_a_tensor_of_any_size_in_order(tmp_path: Path, chunk: int) -> None:
    data = torch.arange(100, dtype=torch.float32).numpy().tobytes()
    f = tmp_path / "raw"
    f.write_bytes(data)
    fd = os.open(f, os.O_RDONLY)
    try:
        got = b"".join(bytes(p) for p in read_pieces(fd, _tensor(f, 100), chunk))
        assert got == data
        cast = b"".join(bytes(p) for p in cast_pieces(fd, _tensor(f, 100), DTYPES["BF16"], chunk))
        assert (
            cast
            == torch.arange(100, dtype=torch.float32).to(torch.bfloat16).view(torch.uint8).numpy().tobytes()
        )
        with pytest.raises(CheckpointCorrupt, match=r"truncated: tensor 'big' ended after 400 of 404 bytes"):
            for _ in read_pieces(fd, _tensor(f, 101), chunk):
                pass
    finally:
        os.close(fd)


def test_a_cast_holds_pieces_not_the_tensor(tmp_path: Path) -> None:
    """The cast reads a piece at a time into one reused buffer."""
    f = tmp_path / "raw"
    f.write_bytes(b"\0" * 4096)
    fd = os.open(f, os.O_RDONLY)
    try:
        seen = set()
        h = xxhash.xxh3_128()
        for piece in read_pieces(fd, _tensor(f, 1024), 256):
            seen.add(id(piece.obj))
            assert len(piece) == 256
            h.update(piece)
        assert len(seen) == 1
    finally:
        os.close(fd)


@pytest.mark.parametrize(
    ("header", "data", "match"),
    [
        ({"w": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}, b"\0", "unsupported dtype 'F4'"),
        ({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4, "needs 8"),
        ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8, "truncated: tensor 'w'"),
        ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, b"\0" * 4, "negative dimension"),
        ({"w": {"dtype": "F32"}}, b"", "malformed header entry"),
    ],
)
def test_header_errors_name_file_and_tensor(tmp_path: Path, header: dict, data: bytes, match: str) -> None:
    f = _raw_file(tmp_path / "x.safetensors", header, data)
    with pytest.raises(FillError, match=match) as e:
        Checkpoint(str(f)).headers()
    assert str(f) in str(e.value)


def test_corrupt_and_tiny_files(tmp_path: Path) -> None:
    tiny = tmp_path / "tiny.safetensors"
    tiny.write_bytes(b"\x01\x02")
    with pytest.raises(FillError, match="not even a header length"):
        Checkpoint(str(tiny)).headers()
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(FillError, match="header of 1099511627776 bytes"):
        Checkpoint(str(huge)).headers()
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(FillError, match="corrupt header"):
        Checkpoint(str(bad)).headers()


def test_index_inconsistencies(tmp_path: Path) -> None:
    ckpt = write_sharded(tmp_path / "c", {"a": torch.ones(2), "b": torch.ones(3)}, shards=2)
    index = ckpt / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"]["ghost"] = "model-00001-of-00002.safetensors"
    index.write_text(json.dumps(doc))
    with pytest.raises(FillError, match=r"'ghost' is listed .* but stored nowhere"):
        Checkpoint(str(ckpt)).headers()
    doc["weight_map"] = {"a": "model-00009-of-00009.safetensors"}
    index.write_text(json.dumps(doc))
    with pytest.raises(FillError, match="does not exist"):
        Checkpoint(str(ckpt)).headers()


def test_duplicate_tensor_across_shards(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    d = tmp_path / "c"
    d.mkdir()
    save_file({"a": torch.ones(2)}, str(d / "one.safetensors"))
    save_file({"a": torch.ones(2)}, str(d / "two.safetensors"))
    with pytest.raises(FillError, match="'a' is also stored in"):
        Checkpoint(str(d)).headers()


def test_missing_and_empty_paths(tmp_path: Path) -> None:
    with pytest.raises(FillError, match="does not exist"):
        Checkpoint(str(tmp_path / "nope")).headers()
    with pytest.raises(FillError, match=r"no \*\.safetensors"):
        Checkpoint(str(tmp_path)).headers()


@pytest.mark.parametrize(
    ("offsets", "data_bytes", "match"),
    [
        ([-8, 0], 8, r"data_offsets \[-8, 0\]"),  # starts in the header
        ([8, 0], 16, r"data_offsets \[8, 0\] hold -8 bytes"),  # ends before it begins
        ([0, 16], 16, r"data_offsets \[0, 16\] hold 16 bytes, but F32\[2\] needs 8"),  # more than the shape
        ([0, 8], 7, r"truncated: tensor 'w' needs bytes up to \d+, the file has"),  # one byte past the file
    ],
    ids=["into_header", "end_before_begin", "more_than_shape", "one_byte_past_end"],
)
def test_offsets_outside_the_data_section_are_a_corrupt_checkpoint(
    tmp_path: Path, offsets: list[int], data_bytes: int, match: str
) -> None:
    """A header whose offsets point outside the file's data, or hold other than
    dtype times shape bytes, is a corrupt checkpoint (exit 65) naming file and tensor."""
    from wcached.exits import EX_DATAERR

    f = _raw_file(
        tmp_path / "x.safetensors",
        {"w": {"dtype": "F32", "shape": [2], "data_offsets": offsets}},
        b"\1" * data_bytes,
    )
    with pytest.raises(CheckpointCorrupt, match=match) as e:
        Checkpoint(str(f)).headers()
    assert type(e.value) is CheckpointCorrupt and e.value.exit_status == EX_DATAERR
    assert str(f) in str(e.value) and "'w'" in str(e.value)


def test_a_tensor_ending_at_the_files_last_byte_is_read_whole(tmp_path: Path) -> None:
    """A tensor whose bytes end exactly where the file ends is whole, not truncated."""
    data = struct.pack("<2f", 1.5, -2.0)
    f = _raw_file(
        tmp_path / "x.safetensors", {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, data
    )
    (t,) = Checkpoint(str(f)).headers().tensors
    assert t.data_start + t.nbytes == f.stat().st_size
    fd = os.open(f, os.O_RDONLY)
    try:
        assert b"".join(bytes(p) for p in read_pieces(fd, t)) == data
    finally:
        os.close(fd)
