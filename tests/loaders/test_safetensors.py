from __future__ import annotations

import json
import mmap
import os
import struct
from pathlib import Path

import pytest
import torch
import xxhash

from tests.helpers import as_bytes, load_reference, multi_dtype_tensors, write_sharded
from wcached.errors import FillError
from wcached.loaders.checkpoint import Checkpoint, StoredTensor
from wcached.loaders.safetensors import SafetensorsLoader, SafetensorsModel
from wcached.memory.host import HostBackend


def _raw_file(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def _fingerprint(path: Path) -> str:
    return Checkpoint(path).header_fingerprint()


def _fill(model: SafetensorsModel):
    progress: list[tuple[int, int]] = []
    filled = SafetensorsLoader().fill(model, HostBackend(), "cpu0", lambda d, t: progress.append((d, t)))
    return filled, progress


def _views(filled):
    from wcached.client.attach import build_views

    maps = [
        mmap.mmap(fd, s.nbytes, mmap.MAP_SHARED, mmap.PROT_READ)
        for fd, s in zip(filled.fds, filled.manifest.segments, strict=True)
    ]
    segs = [torch.frombuffer(bytearray(m), dtype=torch.uint8) for m in maps]
    for fd in filled.fds:
        os.close(fd)
    return build_views(filled.manifest, segs)


def test_fill_matches_load_file_and_reports_progress(tmp_path: Path) -> None:
    ckpt = write_sharded(tmp_path / "c", multi_dtype_tensors(), shards=3)
    filled, progress = _fill(SafetensorsModel(name="m", path=str(ckpt), segment_size=8192, read_threads=2))
    assert len(filled.manifest.segments) > 2
    for t in filled.manifest.tensors:
        assert t.offset % 256 == 0
        assert t.offset + t.nbytes <= filled.manifest.segments[t.segment].nbytes
        assert len(t.digest) == 32
    views = _views(filled)
    digests = {t.name: t.digest for t in filled.manifest.tensors}
    for name, ref in load_reference(ckpt).items():
        assert torch.equal(as_bytes(views[name]), as_bytes(ref)), name
        assert digests[name] == xxhash.xxh3_128(bytes(as_bytes(ref).tolist())).hexdigest(), name
    assert filled.manifest.attrs == {"digest": "xxh3_128"}
    # From the total up front to all of it read.
    assert progress[0] == (0, filled.manifest.total_bytes)
    assert progress[-1] == (filled.manifest.total_bytes, filled.manifest.total_bytes)
    assert filled.manifest.key.fingerprint == _fingerprint(ckpt)


def test_dtype_policy_casts_floats_only(tmp_path: Path) -> None:
    ckpt = write_sharded(tmp_path / "c", multi_dtype_tensors(), shards=1)
    filled, _ = _fill(SafetensorsModel(name="m", path=str(ckpt), dtype="float32"))
    views = _views(filled)
    ref = load_reference(ckpt)
    assert views["embed.weight"].dtype == torch.float32
    assert torch.equal(views["embed.weight"], ref["embed.weight"].float())
    assert views["layer.0.fp8_e4m3"].dtype == torch.float8_e4m3fn
    assert views["layer.0.int8"].dtype == torch.int8
    assert filled.manifest.key.dtype == "float32"


def test_header_fingerprint_sees_rewrites_content_fingerprint_sees_bytes(tmp_path: Path) -> None:
    import shutil

    a = write_sharded(tmp_path / "a", {"w": torch.zeros(4, 4)}, shards=1)
    (shard,) = a.glob("*.safetensors")
    before = _fingerprint(a)
    fa, _ = _fill(SafetensorsModel(name="m", path=str(a), fingerprint="content", digest=False))
    assert fa.manifest.key.fingerprint.startswith("content:")
    st = shard.stat()
    # The same header, other tensor bytes, written in place (a fine-tune step).
    with open(shard, "r+b") as f:
        f.seek(st.st_size - 4)
        f.write(b"\x00\x00\x80\x3f")
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert _fingerprint(a) != before  # its modification time changed
    # A rewrite that hides its time is invisible to the header fingerprint,
    # not to the content fingerprint.
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert _fingerprint(a) == before
    fb, _ = _fill(SafetensorsModel(name="m", path=str(a), fingerprint="content", digest=False))
    assert fa.manifest.key.fingerprint != fb.manifest.key.fingerprint
    # A copy put in place (same bytes and time, a new inode) is seen too.
    shutil.copy2(shard, tmp_path / "copy")
    os.replace(tmp_path / "copy", shard)
    assert _fingerprint(a) != before
    c = write_sharded(tmp_path / "c", {"w": torch.zeros(4, 5)}, shards=1)
    assert _fingerprint(c) != _fingerprint(a)


def test_alias_errors(tmp_path: Path) -> None:
    ckpt = write_sharded(tmp_path / "c", {"a": torch.ones(2)}, shards=1)
    with pytest.raises(FillError, match="names missing tensor 'b'"):
        _fill(SafetensorsModel(name="m", path=str(ckpt), aliases={"tied": "b"}))
    with pytest.raises(FillError, match="is itself a stored tensor"):
        _fill(SafetensorsModel(name="m", path=str(ckpt), aliases={"a": "a"}))


def test_runs_group_back_to_back_tensors_of_one_file_and_segment() -> None:
    from wcached.dtypes import DTYPES
    from wcached.loaders.layout import Placement
    from wcached.loaders.safetensors import _runs

    f32 = DTYPES["F32"]

    def t(name, file, start, n):
        return StoredTensor(name, file, f32, (n // 4,), start, n)

    tensors = [
        t("a", "x", 8, 16),
        t("b", "x", 24, 16),
        t("c", "x", 48, 16),
        t("d", "y", 8, 16),
        t("e", "y", 24, 16),
    ]
    placements = [Placement(x.name, 0 if x.name != "e" else 1, 0, 16) for x in tensors]
    assert _runs(tensors, placements, [False] * 5, 1 << 20) == [[0, 1], [2], [3], [4]]
    assert _runs(tensors, placements, [False, True, False, False, False], 1 << 20) == [
        [0],
        [1],
        [2],
        [3],
        [4],
    ]
    # The backend's run size bounds a run: two 16-byte tensors fit in 32, not in 31.
    assert _runs(tensors, placements, [False] * 5, 32) == [[0, 1], [2], [3], [4]]
    assert _runs(tensors, placements, [False] * 5, 31) == [[0], [1], [2], [3], [4]]
    # A tensor as large as a run is a run of its own.
    assert _runs(tensors, placements, [False] * 5, 16) == [[0], [1], [2], [3], [4]]


def test_runs_at_their_edges() -> None:
    """A tensor as large as a run stands alone even before an empty one; a
    run after a lone tensor, and after a cut, starts from zero bytes (two
    tensors that together make the limit share a run); a run holds at most
    MAX_RUN_TENSORS tensors (one iovec each)."""
    from wcached.dtypes import DTYPES
    from wcached.loaders.layout import Placement
    from wcached.loaders.safetensors import MAX_RUN_TENSORS, _runs

    f32 = DTYPES["F32"]

    def back_to_back(sizes):
        out, at = [], 8
        for i, n in enumerate(sizes):
            out.append(StoredTensor(f"t{i}", "x", f32, (n // 4,), at, n))
            at += n
        return out, [Placement(t.name, 0, t.data_start, t.nbytes) for t in out]

    tensors, placements = back_to_back([32, 0])
    assert _runs(tensors, placements, [False, False], 32) == [[0], [1]]
    # After a cast tensor cuts a run, and after a full run, 16 + 16 bytes fit in 32.
    tensors, placements = back_to_back([16, 16, 16, 16])
    assert _runs(tensors, placements, [False, True, False, False], 32) == [[0], [1], [2, 3]]
    tensors, placements = back_to_back([24, 16, 16])
    assert _runs(tensors, placements, [False] * 3, 32) == [[0], [1, 2]]
    n = MAX_RUN_TENSORS + 1
    tensors, placements = back_to_back([4] * n)
    assert _runs(tensors, placements, [False] * n, 1 << 20) == [
        list(range(MAX_RUN_TENSORS)),
        [MAX_RUN_TENSORS],
    ]


def test_streams_are_cut_once_a_stretch_reaches_its_share() -> None:
    """A stream is closed when it holds at least the total over the count
    (whole bytes), a new one starts from zero bytes, and there are never
    more streams than asked for."""
    from wcached.loaders.safetensors import _split_streams

    runs = [[i] for i in range(4)]
    # 7 bytes over 2: a share of 3 (not 3.5), reached by the first run.
    assert _split_streams(runs[:3], [3, 3, 1], 2) == [[[0]], [[1], [2]]]
    # The first stream counts from zero: 1 + 1 reaches a share of 2.
    assert _split_streams(runs[:3], [1, 1, 2], 2) == [[[0], [1]], [[2]]]
    # So does each later one: 1 + 1 reaches 2 before the last run.
    assert _split_streams(runs, [2, 1, 1, 2], 3) == [[[0]], [[1], [2]], [[3]]]
    # Never more than the count, however the bytes fall.
    assert _split_streams(runs[:3], [1, 1, 1], 2) == [[[0]], [[1], [2]]]
    assert _split_streams(runs[:3], [5, 5, 5], 1) == [[[0], [1], [2]]]


def test_a_fills_streams_copy_at_the_same_time(tmp_path: Path) -> None:
    """read_threads = N gives N streams, all copying at once: each stream's
    first copy waits (10 s at most) until every other stream's has begun.
    N is more than a default thread pool's workers on this machine."""
    import threading

    n = (os.cpu_count() or 1) + 5
    started = threading.Barrier(n, timeout=10)
    seen: set[int] = set()

    def meet() -> None:
        if threading.get_ident() not in seen:
            seen.add(threading.get_ident())
            started.wait()

    class Meeting(HostBackend):
        run_bytes = 200  # each 200-byte tensor is a run of its own

        def allocate(self, nbytes, label):
            writer = super().allocate(nbytes, label)
            inner = writer.write_from_file

            def write_from_file(src_fd, file_offset, offset, nbytes, hasher):
                meet()
                return inner(src_fd, file_offset, offset, nbytes, hasher)

            writer.write_from_file = write_from_file
            return writer

    tensors = {f"t{i}": torch.full((50,), float(i)) for i in range(n)}
    ckpt = write_sharded(tmp_path / "c", tensors, shards=1)
    model = SafetensorsModel(name="m", path=str(ckpt), alignment=8, read_threads=n)
    filled = SafetensorsLoader().fill(model, Meeting(), "cpu0", lambda *a: None)
    assert len(seen) == n
    views = _views(filled)
    for name, t in tensors.items():
        assert torch.equal(views[name], t), name


def test_a_fill_reads_runs_no_larger_than_its_backend_takes(tmp_path: Path) -> None:
    seen: list[int] = []

    class SmallRuns(HostBackend):
        run_bytes = 1000

        def allocate(self, nbytes, label):
            writer = super().allocate(nbytes, label)
            inner = writer.write_run

            def write_run(src_fd, file_offset, pieces, hashers):
                seen.append(sum(n for _, n in pieces))
                return inner(src_fd, file_offset, pieces, hashers)

            writer.write_run = write_run
            return writer

    tensors = {f"t{i}": torch.full((50,), float(i)) for i in range(20)}  # 200 bytes each
    ckpt = write_sharded(tmp_path / "c", tensors, shards=1)
    model = SafetensorsModel(name="m", path=str(ckpt), alignment=8)
    filled = SafetensorsLoader().fill(model, SmallRuns(), "cpu0", lambda *a: None)
    assert seen and max(seen) <= 1000 and sum(seen) == 20 * 200
    views = _views(filled)
    for name, t in tensors.items():
        assert torch.equal(views[name], t), name


def test_contiguous_copies_join_neighbours_in_segment_and_buffer() -> None:
    from wcached.memory.base import contiguous_copies

    # Read back to back: 0..16, 16..32, 32..48, 48..48 (empty), 48..56.
    pieces = [(1024, 16), (1040, 16), (2048, 16), (9999, 0), (2064, 8)]
    assert contiguous_copies(pieces) == [(1024, 0, 32), (2048, 32, 24)]
    assert contiguous_copies([(0, 8), (16, 8)]) == [(0, 0, 8), (16, 8, 8)]  # a gap in the segment
    assert contiguous_copies([]) == []


def test_truncation_during_fill_names_the_tensor(tmp_path: Path, monkeypatch) -> None:
    ckpt = write_sharded(
        tmp_path / "c", {"a": torch.ones(64), "b": torch.ones(64), "c": torch.ones(64)}, shards=1
    )
    real = Checkpoint(ckpt).headers()
    shard = real.files[0].path
    # The file shrinks between the header check and the copy.
    monkeypatch.setattr(Checkpoint, "headers", lambda self: real)
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) - 300)
    with pytest.raises(FillError, match=r"truncated: tensor 'b' ended after 212 of 256 bytes"):
        _fill(SafetensorsModel(name="m", path=str(ckpt)))


def test_streams_cut_runs_in_file_order_by_bytes() -> None:
    from wcached.loaders.safetensors import _split_streams

    runs = [[i] for i in range(8)]
    streams = _split_streams(runs, [10, 10, 10, 10, 40, 10, 5, 5], 3)
    assert [r for s in streams for r in s] == runs  # every run once, in order
    assert len(streams) == 3
    assert streams[0] == [[0], [1], [2], [3]]
    assert _split_streams([], [], 4) == []
    assert len(_split_streams(runs, [1] * 8, 16)) == 8


def test_a_daemon_given_offsets_into_the_header_exits_65_without_a_socket(work: Path) -> None:
    """A checkpoint whose header points a tensor into the header itself stops the
    daemon for good (exit 65, file and tensor in the journal); no socket, no READY."""
    from tests.helpers import one_model_config, start_daemon
    from wcached.exits import EX_DATAERR

    ckpt = work / "ckpt"
    ckpt.mkdir()
    header = {
        "ok": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "w": {"dtype": "F32", "shape": [4], "data_offsets": [-16, 0]},
    }
    shard = _raw_file(ckpt / "model.safetensors", header, b"\0" * 16)
    d = start_daemon(one_model_config(work, ckpt))
    try:
        rc = d.wait_exit(30)
        log = d.log()
        assert rc == EX_DATAERR, log
        assert str(shard) in log and "tensor 'w'" in log and "data_offsets [-16, 0]" in log, log
        assert not os.path.exists(d.socket_path)
        assert not any(m.startswith("READY=1") for m in d.notify.messages)
    finally:
        if d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()
        d.notify.close()


def test_tensors_of_any_rank_are_described_with_row_major_strides(tmp_path: Path) -> None:
    """A 3-D expert stack, dims of 1 and 0, a scalar: the manifest's strides
    are those of a contiguous tensor of that shape, and the views read the
    stored bytes."""
    from safetensors.torch import save_file

    tensors = {
        "experts": torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4),
        "ones": torch.arange(5, dtype=torch.float32).reshape(1, 5, 1),
        "empty": torch.zeros(3, 0, 2),
        "scalar": torch.tensor(7.0),
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    filled, _ = _fill(SafetensorsModel(name="m", path=str(tmp_path / "model.safetensors")))
    by_name = {t.name: t for t in filled.manifest.tensors}
    for name, ref in tensors.items():
        assert by_name[name].stride == ref.contiguous().stride(), name
    views = _views(filled)
    for name, ref in tensors.items():
        assert torch.equal(views[name], ref), name


@pytest.mark.parametrize(("digest", "fingerprint"), [(True, "header"), (False, "header"), (False, "content")])
def test_digests_are_recorded_exactly_when_asked_or_needed(
    tmp_path: Path, digest: bool, fingerprint: str
) -> None:
    """digest = false leaves every entry's digest empty and the manifest
    unmarked; a content fingerprint is made of the digests, so it records
    them whatever digest says."""
    ckpt = write_sharded(tmp_path / "c", multi_dtype_tensors(), shards=2)
    model = SafetensorsModel(name="m", path=str(ckpt), digest=digest, fingerprint=fingerprint)
    filled, _ = _fill(model)
    recorded = digest or fingerprint == "content"
    # Host digests are taken while reading: no phase of their own.
    from wcached.loaders.layout import READ

    assert READ in filled.phases and "digest" not in filled.phases
    views = _views(filled)
    for t in filled.manifest.tensors:
        want = xxhash.xxh3_128(as_bytes(views[t.name]).numpy().tobytes()).hexdigest() if recorded else ""
        assert t.digest == want, t.name
    assert filled.manifest.attrs == ({"digest": "xxh3_128"} if recorded else {})


def test_a_fill_reports_its_header_phase_and_the_engines_fingerprint_matches_the_key(tmp_path: Path) -> None:
    from wcached.loaders.safetensors import checkpoint_fingerprint

    ckpt = write_sharded(tmp_path / "c", multi_dtype_tensors(), shards=2)
    filled, _ = _fill(SafetensorsModel(name="m", path=str(ckpt)))
    assert "headers" in filled.phases and filled.phases["headers"] >= 0
    # Its reading of the checkpoint is a phase of its own, over the bytes
    # the checkpoint stores (what the rate in the log and status is over).
    from wcached.loaders.checkpoint import Checkpoint
    from wcached.loaders.layout import READ

    assert filled.phases[READ] > 0
    assert filled.read_bytes == sum(t.nbytes for t in Checkpoint(ckpt).headers().tensors) > 0
    assert checkpoint_fingerprint(str(ckpt)) == filled.manifest.key.fingerprint


def test_a_backend_that_digests_its_own_memory_does_so_after_the_copy_and_not_on_it(tmp_path: Path) -> None:
    """The CUDA backend's way (its kernel over the filled segments), with the
    host backend's memory: nothing is hashed while copying, each tensor's
    digest is the backend's of its placed bytes, the manifest names that
    algorithm, and the fill times the digest apart from its reading."""
    from wcached import tensor_digest
    from wcached.loaders.layout import READ

    hashed_on_copy: list[object] = []
    labels: list[str] = []
    short: list[bool] = [False]  # the backend's digests one short (a bug of its)

    class DigestsAfter(HostBackend):
        def after_fill_digest(self):
            return tensor_digest.DEVICE

        def allocate(self, nbytes, label):
            labels.append(label)
            writer = super().allocate(nbytes, label)
            inner_run, inner_one = writer.write_run, writer.write_from_file

            def write_run(src_fd, file_offset, pieces, hashers):
                hashed_on_copy.extend(h for h in hashers if h is not None)
                return inner_run(src_fd, file_offset, pieces, hashers)

            def write_from_file(src_fd, file_offset, offset, nbytes, hasher):
                hashed_on_copy.extend([hasher] if hasher is not None else [])
                return inner_one(src_fd, file_offset, offset, nbytes, hasher)

            def digest_spans(spans):
                seg = torch.frombuffer(bytearray(writer._map), dtype=torch.uint8)
                got = [tensor_digest.torch_digest(seg[o : o + n]) for o, n in spans]
                return got[:-1] if short[0] else got

            writer.write_run, writer.write_from_file, writer.digest_spans = (
                write_run,
                write_from_file,
                digest_spans,
            )
            return writer

    tensors = {f"t{i}": torch.full((50 + i,), float(i)) for i in range(40)}
    ckpt = write_sharded(tmp_path / "c", tensors, shards=2)
    model = SafetensorsModel(name="m", path=str(ckpt), alignment=64, segment_size=4096)
    filled = SafetensorsLoader().fill(model, DigestsAfter(), "cpu0", lambda *a: None)
    assert not hashed_on_copy
    assert len(filled.manifest.segments) > 1  # a call per segment, each placed right
    assert filled.manifest.attrs == {"digest": tensor_digest.DEVICE}
    views = _views(filled)
    for t in filled.manifest.tensors:
        assert t.digest == tensor_digest.digest(views[t.name], tensor_digest.DEVICE), t.name
    assert len({t.digest for t in filled.manifest.tensors}) == len(tensors)
    assert filled.phases[READ] > 0 and filled.phases["digest"] >= 0
    # Each segment is allocated under the model's name (the memory's label).
    assert labels == [f"m.{i}" for i in range(len(filled.manifest.segments))]
    # A backend that answers for fewer spans than asked fails the fill
    # rather than leaving a tensor without its digest.
    short[0] = True
    with pytest.raises(ValueError, match="zip"):
        SafetensorsLoader().fill(model, DigestsAfter(), "cpu0", lambda *a: None)


def test_a_fill_announces_its_readers_to_the_backend_before_reading_headers(
    tmp_path: Path, monkeypatch
) -> None:
    """So that a backend that stages can prepare its buffers while the headers
    are read and the segments allocated, for as many readers as the fill will
    run (the CUDA backend's pinned buffers: written, held back until a GPU
    run checks them)."""
    import wcached.loaders.safetensors as st

    ckpt = write_sharded(tmp_path / "c", multi_dtype_tensors(), shards=2)
    events: list[object] = []

    class Announced(HostBackend):
        def prepare_staging(self, threads: int) -> None:
            events.append(threads)

    real = st.Checkpoint.headers
    monkeypatch.setattr(st.Checkpoint, "headers", lambda self: events.append("headers") or real(self))
    backend = Announced()
    for read_threads in (3, "auto"):
        events.clear()
        model = SafetensorsModel(name="m", path=str(ckpt), read_threads=read_threads).parsed()
        filled = SafetensorsLoader().fill(model, backend, "cpu0", lambda *a: None)
        for fd in filled.fds:
            os.close(fd)
        assert events == [model.reader_count(backend.auto_readers), "headers"]
    assert events[0] == min(backend.auto_readers, os.cpu_count() or 1)
