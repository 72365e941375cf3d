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


def _raw_file(path: Path, header: dict | bytes, data: bytes) -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
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


# -- the rules at their edges, each failure told whole ---------------------------


def _denied(path: object) -> PermissionError:
    return PermissionError(13, "Permission denied", str(path))


def test_a_models_checkpoint_is_a_hub_id_only_for_a_loader_that_resolves_one() -> None:
    from wcached.loaders.safetensors import SafetensorsModel
    from wcached.loaders.vllm import VllmModel

    assert Checkpoint.of(VllmModel(name="m", path="org/model")).is_hub_id
    assert not Checkpoint.of(SafetensorsModel(name="m", path="org/model")).is_hub_id
    assert not Checkpoint.of(VllmModel(name="m", path="/models/m")).is_hub_id


def test_a_path_this_user_cannot_search_or_list_is_told_as_such(tmp_path: Path, monkeypatch) -> None:
    from wcached.daemon.lock import user_name

    me = user_name(os.geteuid())
    real_stat, real_scandir = os.stat, os.scandir
    ckpt = tmp_path / "c"
    (ckpt / "sub").mkdir(parents=True)

    def stat_(path, *a, **kw):
        if str(path) == str(tmp_path / "hidden"):
            raise _denied(path)
        return real_stat(path, *a, **kw)

    def scandir_(path="."):
        if str(path) == str(ckpt / "sub"):
            raise _denied(path)
        return real_scandir(path)

    monkeypatch.setattr(os, "stat", stat_)
    monkeypatch.setattr(os, "scandir", scandir_)
    with pytest.raises(CheckpointUnreadable) as e:
        Checkpoint(tmp_path / "hidden").files()
    assert str(e.value) == (
        f"checkpoint {tmp_path / 'hidden'} cannot be read by user {me!r} "
        "(Permission denied: can it search every directory above it?)"
    )
    with pytest.raises(CheckpointUnreadable) as e:
        Checkpoint(ckpt).files()
    assert str(e.value) == (
        f"checkpoint directory {ckpt / 'sub'} cannot be read by user {me!r} "
        "(Permission denied: it may not list it)"
    )


def test_hidden_directories_are_left_out_and_the_file_limit_is_inclusive(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / ".cache" / "x").mkdir(parents=True)
    (tmp_path / ".cache" / "x" / "blob").write_text("")
    for i in range(3):
        (tmp_path / f"f{i}").write_text("")
    monkeypatch.setattr("wcached.loaders.checkpoint.MAX_FILES", 3)
    assert [os.path.basename(f) for f in Checkpoint(tmp_path).files()] == ["f0", "f1", "f2"]


def test_a_file_that_vanishes_between_listing_and_opening_or_stat_is_missing(
    tmp_path: Path, monkeypatch
) -> None:
    """Missing (retried: a mount coming and going), not unreadable."""
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"")
    ckpt = Checkpoint(f)
    real_open, real_stat = os.open, os.stat

    def gone_open(path, flags, *a):
        raise FileNotFoundError(2, "No such file or directory", str(path))

    monkeypatch.setattr(os, "open", gone_open)
    with pytest.raises(CheckpointMissing) as e:
        ckpt.check_readable()
    assert str(e.value) == f"checkpoint file {f} vanished while it was checked"
    monkeypatch.setattr(os, "open", real_open)

    calls = []

    def stat_once(path, *a, **kw):  # files() stats the path, stamps() each file
        calls.append(path)
        if len(calls) > 1:
            raise failure
        return real_stat(path, *a, **kw)

    monkeypatch.setattr(os, "stat", stat_once)
    failure: OSError = FileNotFoundError(2, "No such file or directory", str(f))
    with pytest.raises(CheckpointMissing) as e:
        ckpt.stamps()
    assert str(e.value) == f"checkpoint file {f} vanished while it was stamped"
    calls.clear()
    failure = OSError(5, "Input/output error", str(f))
    with pytest.raises(CheckpointUnreadable) as e:
        ckpt.stamps()
    assert str(e.value) == f"cannot stat {f}: Input/output error"


def test_checking_a_fifo_does_not_wait_for_a_writer(tmp_path: Path) -> None:
    """A path that is a FIFO (a mistake) is opened without blocking."""
    import threading

    fifo = tmp_path / "w.safetensors"
    os.mkfifo(fifo)
    done = threading.Event()

    def check() -> None:
        Checkpoint(fifo).check_readable()
        done.set()

    threading.Thread(target=check, daemon=True).start()
    blocked = not done.wait(10)
    if blocked:  # let the blocked open go (a writer arrives) before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert not blocked, "check_readable blocked opening a FIFO"


def test_a_named_index_a_stray_shard_and_a_tensor_in_the_wrong_shard(tmp_path: Path) -> None:
    """The index decides the shards (a stray file beside them is no part of
    the checkpoint), an index may be given by its own name, and a tensor
    stored in another shard than the index says is a corrupt checkpoint."""
    from safetensors.torch import save_file

    ckpt = write_sharded(tmp_path / "c", {"a": torch.ones(2), "b": torch.ones(3)}, shards=2)
    save_file({"stray": torch.ones(4)}, str(ckpt / "consolidated.safetensors"))
    shards = sorted(str(p) for p in ckpt.glob("model-*.safetensors"))
    assert Checkpoint(ckpt).weight_files() == shards
    headers = Checkpoint(ckpt).headers()
    assert headers.root == str(ckpt)
    assert [t.name for t in headers.tensors] == ["a", "b"]
    named = ckpt / "mine.index.json"
    named.write_text((ckpt / "model.safetensors.index.json").read_text())
    assert Checkpoint(named).weight_files() == shards
    assert [t.name for t in Checkpoint(named).headers().tensors] == ["a", "b"]
    index = ckpt / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    doc["weight_map"] = {"a": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}
    index.write_text(json.dumps(doc))
    with pytest.raises(CheckpointCorrupt) as e:
        Checkpoint(ckpt).headers()
    assert str(e.value) == (
        f"{index}: tensor 'a' is listed for model-00002-of-00002.safetensors "
        f"but stored in {ckpt / 'model-00001-of-00002.safetensors'}"
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("{nope", "not a safetensors index (Expecting property name enclosed in double quotes"),
        ('{"weight_map": []}', "weight_map is empty or not a table"),
        ('{"weight_map": ["a"]}', "weight_map is empty or not a table"),
        ('{"weight_map": {}}', "weight_map is empty or not a table"),
    ],
)
def test_a_broken_index_is_a_corrupt_checkpoint(tmp_path: Path, text: str, problem: str) -> None:
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(text)
    with pytest.raises(CheckpointCorrupt) as e:
        Checkpoint(tmp_path).headers()
    assert str(e.value).startswith(f"{index}: {problem}")


def test_an_index_this_user_cannot_read_is_unreadable(tmp_path: Path, monkeypatch) -> None:
    from wcached.daemon.lock import user_name

    write_sharded(tmp_path, {"a": torch.ones(2)}, shards=1)
    index = tmp_path / "model.safetensors.index.json"

    def read_text(self, *a, **kw):
        raise _denied(self)

    monkeypatch.setattr(Path, "read_text", read_text)
    with pytest.raises(CheckpointUnreadable) as e:
        Checkpoint(tmp_path).headers()
    assert str(e.value) == f"checkpoint file {index} cannot be read by user {user_name(os.geteuid())!r}"


def test_header_lengths_at_their_edges(tmp_path: Path) -> None:
    """Eight bytes are a header length (of an empty, so corrupt, header);
    a length past the file or past the format's limit is told with both
    numbers; a length with its top bit set is a huge one, not negative."""
    from wcached.loaders.checkpoint import MAX_HEADER_BYTES

    eight = tmp_path / "eight.safetensors"
    eight.write_bytes(struct.pack("<Q", 0))
    with pytest.raises(CheckpointCorrupt, match=r": corrupt header: ") as e:
        Checkpoint(eight).headers()
    assert str(e.value).startswith(f"{eight}: corrupt header: ")
    short = tmp_path / "short.safetensors"
    short.write_bytes(struct.pack("<Q", 100) + b"{}" + b"\0" * 10)
    with pytest.raises(CheckpointCorrupt) as e:
        Checkpoint(short).headers()
    assert str(e.value) == f"{short}: truncated or corrupt: header of 100 bytes in a 20-byte file"
    top = tmp_path / "top.safetensors"
    top.write_bytes(struct.pack("<Q", 1 << 63) + b"{}")
    with pytest.raises(CheckpointCorrupt, match=f"header of {1 << 63} bytes in a 10-byte file"):
        Checkpoint(top).headers()
    # A header of exactly the limit is read (and here is no JSON); a byte more is refused.
    at_limit = tmp_path / "limit.safetensors"
    with open(at_limit, "wb") as f:
        f.write(struct.pack("<Q", MAX_HEADER_BYTES))
        f.truncate(8 + MAX_HEADER_BYTES)  # sparse: no disk is spent
    with pytest.raises(CheckpointCorrupt) as e:
        Checkpoint(at_limit).headers()
    assert str(e.value).startswith(f"{at_limit}: corrupt header: ")


def test_a_header_that_is_no_object_or_no_file_is_told(tmp_path: Path) -> None:
    arr = _raw_file(tmp_path / "arr.safetensors", [], b"")  # type: ignore[arg-type]
    with pytest.raises(CheckpointCorrupt) as e:
        Checkpoint(arr).headers()
    assert str(e.value) == f"{arr}: corrupt header: not a JSON object"
    d = tmp_path / "dir"
    (d / "x.safetensors").mkdir(parents=True)  # a directory named like a shard
    with pytest.raises(FillError) as e:
        Checkpoint(d).headers()
    assert str(e.value).startswith(f"{d / 'x.safetensors'}: cannot read: ")


def test_metadata_is_skipped_wherever_it_is_and_an_empty_checkpoint_is_refused(tmp_path: Path) -> None:
    from wcached.errors import FillMisconfigured

    entry = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    first = _raw_file(tmp_path / "a.safetensors", {"__metadata__": {"format": "pt"}, "w": entry}, b"\0" * 4)
    assert [t.name for t in Checkpoint(first).headers().tensors] == ["w"]
    empty = _raw_file(tmp_path / "e.safetensors", {"__metadata__": {"format": "pt"}}, b"")
    with pytest.raises(FillMisconfigured) as e:
        Checkpoint(empty).headers()
    assert str(e.value) == f"checkpoint {empty} holds no tensors"


def test_a_shards_stamps_are_its_own_and_a_rewrite_in_place_changes_the_fingerprint(tmp_path: Path) -> None:
    ckpt = write_sharded(tmp_path / "c", {"a": torch.ones(2)}, shards=1)
    shard = next(ckpt.glob("*.safetensors"))
    (cf,) = Checkpoint(ckpt).headers().files
    st = os.stat(shard)
    assert (cf.path, cf.size, cf.ino, cf.mtime_ns) == (str(shard), st.st_size, st.st_ino, st.st_mtime_ns)
    before = Checkpoint(ckpt).header_fingerprint()
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert Checkpoint(ckpt).header_fingerprint() != before


def test_an_empty_dimension_is_a_tensor_and_a_truncation_names_the_end_it_needs(tmp_path: Path) -> None:
    empty = _raw_file(
        tmp_path / "z.safetensors", {"z": {"dtype": "F32", "shape": [0, 4], "data_offsets": [0, 0]}}, b""
    )
    (t,) = Checkpoint(empty).headers().tensors
    assert (t.shape, t.nbytes) == ((0, 4), 0)
    header = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    f = _raw_file(tmp_path / "w.safetensors", header, b"\0" * 8)
    base = 8 + len(json.dumps(header).encode())
    with pytest.raises(CheckpointCorrupt) as e:
        Checkpoint(f).headers()
    assert (
        str(e.value) == f"{f}: truncated: tensor 'w' needs bytes up to {base + 16}, the file has {base + 8}"
    )


def test_a_read_that_got_nothing_says_zero_bytes() -> None:
    from wcached.loaders.checkpoint import check_complete

    t = StoredTensor("w", "/x.safetensors", DTYPES["F32"], (2,), 8, 8)
    check_complete(t, 8)
    for got in (0, -1):
        with pytest.raises(CheckpointCorrupt) as e:
            check_complete(t, got)
        assert str(e.value) == "/x.safetensors: truncated: tensor 'w' ended after 0 of 8 bytes"


def test_open_files_open_each_file_once_close_on_exec_and_advise_only_when_sequential(
    tmp_path: Path, monkeypatch
) -> None:
    import fcntl

    from wcached.loaders.checkpoint import OpenFiles

    f = tmp_path / "w"
    f.write_bytes(b"\0" * 16)
    advice: list[tuple] = []
    real_advise = os.posix_fadvise
    monkeypatch.setattr(os, "posix_fadvise", lambda *a: (advice.append(a[1:]), real_advise(*a))[1])
    with OpenFiles() as plain:
        fd = plain.fd(str(f))
        assert plain.fd(str(f)) == fd
        assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
    assert advice == []
    with OpenFiles(sequential=True) as seq:
        seq.fd(str(f))
        seq.fd(str(f))
    assert advice == [(0, 0, os.POSIX_FADV_SEQUENTIAL)]


def test_open_files_tell_a_denied_and_a_vanished_file(tmp_path: Path, monkeypatch) -> None:
    from wcached.daemon.lock import user_name
    from wcached.loaders.checkpoint import OpenFiles

    f = str(tmp_path / "w")

    def denied(path, flags, *a):
        raise _denied(path)

    with monkeypatch.context() as m:
        m.setattr(os, "open", denied)
        with OpenFiles() as files, pytest.raises(CheckpointUnreadable) as e:
            files.fd(f)
    me = user_name(os.geteuid())
    assert str(e.value) == f"checkpoint file {f} cannot be read by user {me!r} (Permission denied)"
    with OpenFiles() as files, pytest.raises(CheckpointMissing) as e:
        files.fd(f)  # the real open: not there
    assert str(e.value) == f"checkpoint file {f} vanished while it was read"


def test_a_shard_this_user_cannot_open_is_unreadable_when_its_header_is_read(
    tmp_path: Path, monkeypatch
) -> None:
    import builtins

    from wcached.daemon.lock import user_name

    ckpt = write_sharded(tmp_path / "c", {"a": torch.ones(2)}, shards=1)
    shard = next(ckpt.glob("*.safetensors"))
    real_open = builtins.open

    def open_(path, *a, **kw):
        if str(path) == str(shard):
            raise _denied(path)
        return real_open(path, *a, **kw)

    monkeypatch.setattr(builtins, "open", open_)
    with pytest.raises(CheckpointUnreadable) as e:
        Checkpoint(ckpt).headers()
    me = user_name(os.geteuid())
    assert str(e.value) == f"checkpoint file {shard} cannot be read by user {me!r} (Permission denied)"


def _same_stamps(f: Path, write) -> None:
    """Rewrite bytes of ``f`` in place and put its modification time back."""
    st = os.stat(f)
    with open(f, "r+b") as fh:
        write(fh)
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_sampled_fingerprint_reads_each_files_ends_and_nothing_between(tmp_path: Path) -> None:
    """Of a file past two samples, the first and the last SAMPLE_BYTES
    (a byte changed in the middle, stamps kept, is unseen: the fingerprint
    of a 100 GB file reads 2 MiB); a directory without the loader's files is
    fingerprinted by every file at its top."""
    from wcached.loaders.checkpoint import SAMPLE_BYTES

    d = tmp_path / "d"
    d.mkdir()
    big = d / "weights.gguf"
    big.write_bytes(b"\0" * (2 * SAMPLE_BYTES + SAMPLE_BYTES // 2))
    (d / "config.json").write_text("{}")
    base = Checkpoint(d).fingerprint(("*.bin",))
    assert base.startswith("sampled:") and base == Checkpoint(d).fingerprint()
    _same_stamps(big, lambda fh: (fh.seek(SAMPLE_BYTES + SAMPLE_BYTES // 4), fh.write(b"\1")))
    assert Checkpoint(d).fingerprint() == base
    _same_stamps(big, lambda fh: (fh.seek(-1, os.SEEK_END), fh.write(b"\1")))
    tail = Checkpoint(d).fingerprint()
    assert tail != base
    _same_stamps(big, lambda fh: (fh.seek(SAMPLE_BYTES - 1), fh.write(b"\1")))
    assert Checkpoint(d).fingerprint() != tail
    # A single file is sampled the same way, under its own name.
    assert Checkpoint(big).fingerprint().startswith("sampled:")
    assert Checkpoint(big).fingerprint() != Checkpoint(d).fingerprint()


def test_content_digest_is_names_sizes_and_bytes_in_name_order(tmp_path: Path) -> None:
    ckpt = write_sharded(tmp_path / "c", {"a": torch.ones(3), "b": torch.zeros(5)}, shards=2)
    h = xxhash.xxh3_128()
    for f in sorted(ckpt.glob("*.safetensors")):
        h.update(f"{f.name}:{f.stat().st_size}\n".encode() + f.read_bytes())
    assert Checkpoint(ckpt).content_digest() == f"xxh3_128:{h.hexdigest()}"


def test_a_cast_reads_in_the_pieces_it_is_given(tmp_path: Path) -> None:
    f = tmp_path / "raw"
    f.write_bytes(torch.arange(100, dtype=torch.float32).numpy().tobytes())
    fd = os.open(f, os.O_RDONLY)
    try:
        sizes = [len(p) for p in cast_pieces(fd, _tensor(f, 100), DTYPES["BF16"], 64)]
    finally:
        os.close(fd)
    assert sizes == [32] * 6 + [8]  # 64 stored bytes (16 floats) a piece, halved


def test_files_dated_before_1970_are_fingerprinted(tmp_path: Path) -> None:
    """A modification time before the epoch (a tar's or a copy tool's) is a
    stamp like any other: both fingerprints take it, and tell it apart from
    the same file dated after."""
    ckpt = write_sharded(tmp_path / "c", {"w": torch.ones(4)}, shards=1)
    shard = next(ckpt.glob("*.safetensors"))
    other = tmp_path / "o" / "weights.bin"
    other.parent.mkdir()
    other.write_bytes(b"\7" * 64)
    fingerprints = []
    for mtime_ns in (-(10**9) - 1, 10**9 + 1):
        os.utime(shard, ns=(mtime_ns, mtime_ns))
        os.utime(other, ns=(mtime_ns, mtime_ns))
        fingerprints.append((Checkpoint(ckpt).header_fingerprint(), Checkpoint(other.parent).fingerprint()))
    assert fingerprints[0][0] != fingerprints[1][0]
    assert fingerprints[0][1] != fingerprints[1][1]


@pytest.mark.parametrize("extra", [1, "half", "all"])
def test_a_file_between_one_and_two_samples_has_its_last_byte_seen(tmp_path: Path, extra) -> None:
    """Where the head sample does not reach a file's end, its tail is read
    too: a byte changed at the end, stamps kept, changes the fingerprint."""
    from wcached.loaders.checkpoint import SAMPLE_BYTES

    f = tmp_path / "weights.gguf"
    size = SAMPLE_BYTES + {1: 1, "half": SAMPLE_BYTES // 2, "all": SAMPLE_BYTES}[extra]
    f.write_bytes(b"\0" * size)
    before = Checkpoint(f).fingerprint()
    _same_stamps(f, lambda fh: (fh.seek(-1, os.SEEK_END), fh.write(b"\1")))
    assert Checkpoint(f).fingerprint() != before


def _stored(f: Path) -> list[tuple]:
    return [
        (t.name, t.dtype.safetensors, t.shape, t.data_start, t.nbytes)
        for t in Checkpoint(f).headers().tensors
    ]


def test_a_header_written_loosely_reads_as_the_same_tensors(tmp_path: Path) -> None:
    """Numbers written as strings or floats, metadata holding keys named like
    an entry's, metadata that is no object: what ``int()`` takes was always
    accepted, and still is, whichever decoder reads the header."""
    strict = {
        "__metadata__": {"format": "pt"},
        "w": {"dtype": "F32", "shape": [2, 1], "data_offsets": [0, 8]},
    }
    want = _stored(_raw_file(tmp_path / "strict.safetensors", strict, b"\0" * 8))
    assert want == [("w", "F32", (2, 1), 8 + len(json.dumps(strict)), 8)]
    for i, header in enumerate(
        [
            {"w": {"dtype": "F32", "shape": ["2", 1], "data_offsets": [0, 8]}},
            {"w": {"dtype": "F32", "shape": [2.0, 1], "data_offsets": [0.0, 8]}},
            {"__metadata__": {"shape": "rows", "dtype": "none"}, "w": strict["w"]},
            {"__metadata__": "pt", "w": strict["w"]},
        ]
    ):
        f = _raw_file(tmp_path / f"loose{i}.safetensors", header, b"\0" * 8)
        got = _stored(f)
        base = f.stat().st_size - 8
        assert got == [("w", "F32", (2, 1), base, 8)], header


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}, r"unsupported dtype \['F32'\]"),
        ({"dtype": "F32", "shape": [2], "data_offsets": [0, 4, 8]}, "malformed header entry"),
        ({"dtype": "F32", "shape": [2]}, "malformed header entry"),
        ({"shape": [2], "data_offsets": [0, 8]}, "malformed header entry"),
        ({"dtype": "F32", "data_offsets": [0, 8]}, "malformed header entry"),
        ({"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}, "malformed header entry"),
        ({"dtype": "F32", "shape": [2], "data_offsets": [-8, 0]}, r"data_offsets \[-8, 0\] hold 8 bytes"),
    ],
)
def test_an_entry_that_breaks_the_format_is_named_whichever_decoder_met_it(
    tmp_path: Path, entry: dict, problem: str
) -> None:
    """A well-formed header is decoded into structs, anything else by hand:
    each malformed entry is a corrupt checkpoint naming file and tensor (a
    dtype that is not a string included, which could not be looked up)."""
    f = _raw_file(
        tmp_path / "x.safetensors",
        {"ok": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}, "w": entry},
        b"\0" * 8,
    )
    with pytest.raises(CheckpointCorrupt, match=problem) as e:
        Checkpoint(f).headers()
    assert str(e.value).startswith(f"{f}: tensor 'w': ")


def test_a_well_formed_header_is_decoded_without_the_loose_path(tmp_path: Path, monkeypatch) -> None:
    """The speed of a fill of many tensors rests on this (the loose path took
    4x as long over 5,000 entries: bench/attach_cuda.py's headers phase)."""
    import wcached.loaders.checkpoint as checkpoint

    ckpt = write_sharded(tmp_path / "c", {f"t{i}": torch.ones(i + 1) for i in range(20)}, shards=2)
    entry = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    with_metadata = _raw_file(
        tmp_path / "m.safetensors", {"__metadata__": {"format": "pt"}, "w": entry}, b"\0" * 4
    )

    def refuse(*a: object) -> None:
        raise AssertionError("a well-formed header went through the loose path")

    monkeypatch.setattr(checkpoint, "_parse_header_loosely", refuse)
    assert len(Checkpoint(ckpt).headers().tensors) == 20
    assert [t.name for t in Checkpoint(with_metadata).headers().tensors] == ["w"]


_EMPTY = b'{"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}'  # an entry, then the header's end


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        # msgspec skips the metadata without checking its UTF-8
        (
            b'{"__metadata__": {"x": "\xff"}, "w": {"dtype": "U8", "shape": [0], "data_offsets": [0, 0]}}',
            "corrupt header: 'utf-8' codec can't decode byte 0xff",
        ),
        (
            b'{"w": {"dtype": "U8", "shape": [0], "data_offsets": [0, 1e400]}}',
            r"tensor 'w': malformed header entry .*inf",
        ),
        (b'{"__metadata__": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "corrupt header: maximum recursion"),
        # an encoded surrogate, which json.loads would take from bytes
        (b'{"w\xed\xa0\x80": ' + _EMPTY, "corrupt header: 'utf-8'"),
        (b'\xef\xbb\xbf{"w": ' + _EMPTY, "corrupt header: .*BOM"),
        # an escaped lone surrogate: JSON, but no name a tensor can have
        (b'{"w\\ud800": ' + _EMPTY, "the name is not valid Unicode"),
    ],
)
def test_a_header_no_decoder_can_read_is_a_corrupt_checkpoint(
    tmp_path: Path, header: bytes, problem: str
) -> None:
    """Bytes that are not UTF-8, a number past a float, nesting past
    Python's limit: each a corrupt checkpoint naming the file (a fill fails
    with its cause), never a Python error escaping the loader."""
    f = _raw_file(tmp_path / "x.safetensors", header, b"")
    with pytest.raises(CheckpointCorrupt, match=problem) as e:
        Checkpoint(f).headers()
    assert str(e.value).startswith(f"{f}: ")


def test_metadata_in_utf_8_takes_the_fast_path(tmp_path: Path, monkeypatch) -> None:
    import wcached.loaders.checkpoint as checkpoint

    entry = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    f = _raw_file(
        tmp_path / "m.safetensors",
        json.dumps({"__metadata__": {"author": "Zoë"}, "w": entry}, ensure_ascii=False).encode(),
        b"\0" * 4,
    )
    monkeypatch.setattr(checkpoint, "_parse_header_loosely", None)  # any call fails the test
    assert [t.name for t in Checkpoint(f).headers().tensors] == ["w"]
