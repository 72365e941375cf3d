"""build_views: zero-copy views from manifest entries."""

from __future__ import annotations

import msgspec
import pytest
import torch

from wcached.errors import ProtocolError
from wcached.keys import CacheKey
from wcached.protocol.messages import Manifest, SegmentInfo, TensorInfo
from wcached.protocol.runs import for_version, received

KEY = CacheKey(model="m", loader="safetensors", fingerprint="f", dtype="auto")


def _manifest(entries: list[TensorInfo], seg_bytes: int) -> Manifest:
    return Manifest(
        model="m",
        key=KEY,
        segments=[SegmentInfo(index=0, nbytes=seg_bytes, backend="host", device="cpu0")],
        tensors=entries,
        total_bytes=0,
        filled_at=0.0,
    )


def _entry(name: str, offset: int, shape=(2, 3), dtype="float32", size=4) -> TensorInfo:
    stride = (shape[1], 1) if len(shape) == 2 else (1,) * len(shape)
    n = size
    for d in shape:
        n *= d
    return TensorInfo(name=name, dtype=dtype, shape=shape, stride=stride, segment=0, offset=offset, nbytes=n)


def test_runs_of_same_layout_and_irregular_entries_view_the_right_bytes() -> None:
    from wcached.client.attach import build_views

    seg = torch.arange(4096, dtype=torch.float32)
    raw = seg.view(torch.uint8)
    entries = [_entry(f"e{i}", 256 * i) for i in range(5)]  # an even run
    entries += [_entry("odd", 256 * 5 + 64, shape=(3, 2))]
    entries += [_entry("h", 2048, shape=(4,), dtype="float16", size=2)]
    entries += [_entry("empty", 3000, shape=(0, 3))]
    entries += [_entry("gap0", 4096), _entry("gap1", 4096 + 512)]  # run with a wider step
    views = build_views(_manifest(entries, raw.numel()), [raw])
    for e in entries:
        v = views[e.name]
        assert tuple(v.shape) == e.shape and str(v.dtype) == f"torch.{e.dtype}"
        start = e.offset
        expected = raw[start : start + e.nbytes].view(getattr(torch, e.dtype)).reshape(e.shape)
        assert torch.equal(v, expected), e.name
        assert v.untyped_storage().data_ptr() == raw.untyped_storage().data_ptr()


def test_entries_outside_the_segment_are_refused() -> None:
    from wcached.client.attach import build_views

    raw = torch.zeros(1024, dtype=torch.uint8)
    for bad in (_entry("far", 1008), _entry("neg", -4), _entry("misaligned", 2)):
        with pytest.raises(ProtocolError, match=bad.name):
            build_views(_manifest([bad], 1024), [raw])
    run = [_entry("a", 0), _entry("b", 512), _entry("c", 1024)]
    with pytest.raises(ProtocolError, match="'c' lies outside"):
        build_views(_manifest(run, 1024), [raw])
    # A run of exactly two, its second member 8 bytes past the end.
    pair = [_entry("p", 0), _entry("q", 1008)]
    with pytest.raises(ProtocolError, match="'q' lies outside"):
        build_views(_manifest(pair, 1024), [raw])


def test_a_missing_segment_or_an_unknown_dtype_is_refused_naming_the_tensor() -> None:
    from wcached.client.attach import build_views

    raw = torch.zeros(1024, dtype=torch.uint8)
    elsewhere = msgspec.structs.replace(_entry("w", 0), segment=1)
    with pytest.raises(ProtocolError, match="tensor 'w' names missing segment 1"):
        build_views(_manifest([elsewhere], 1024), [raw])
    for dtype in ("float128", "Tensor"):  # not torch's, or torch's but no dtype
        odd = _entry("x", 0, dtype=dtype)
        with pytest.raises(ProtocolError, match=f"tensor 'x': unknown dtype '{dtype}'"):
            build_views(_manifest([odd], 1024), [raw])


def _reference_views(manifest: Manifest, segments: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """What build_views must return, one entry at a time and nothing shared:
    the rule its runs are a faster way of following."""
    views = {}
    for t in manifest.tensors:
        if not 0 <= t.segment < len(segments):
            raise ProtocolError(f"tensor {t.name!r} names missing segment {t.segment}")
        dtype = getattr(torch, t.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ProtocolError(f"tensor {t.name!r}: unknown dtype {t.dtype!r}")
        size = dtype.itemsize
        seg = segments[t.segment]
        usable = seg.numel() // size * size
        if t.offset % size or t.offset < 0 or t.offset + t.nbytes > usable:
            raise ProtocolError(f"tensor {t.name!r} lies outside segment {t.segment}")
        views[t.name] = seg[:usable].view(dtype).as_strided(t.shape, t.stride, t.offset // size)
    return views


def _random_manifest(rng, seg_bytes: list[int]) -> list[TensorInfo]:
    """Runs of experts (even steps, sometimes one entry off the step, in
    another segment, of another shape or stride or dtype), single tensors,
    and now and then an entry no daemon should send."""
    dtypes = {"float32": 4, "bfloat16": 2, "int8": 1, "float64": 8}
    entries: list[TensorInfo] = []
    for _ in range(rng.randint(1, 6)):
        dtype = rng.choice(list(dtypes))
        size = dtypes[dtype]
        rows, cols = rng.randint(1, 3), rng.randint(1, 4)
        transposed = rng.random() < 0.2
        shape, stride = ((cols, rows), (1, cols)) if transposed else ((rows, cols), (cols, 1))
        nbytes = rows * cols * size
        segment = rng.randrange(len(seg_bytes))
        step = rng.choice([nbytes, nbytes + size, 2 * nbytes, -nbytes, 0, nbytes + 1])
        offset = rng.randrange(0, seg_bytes[segment] // 2, size)
        for k in range(rng.randint(1, 5)):
            e = TensorInfo(
                name=f"t{len(entries)}",
                dtype=dtype,
                shape=shape,
                stride=stride,
                segment=segment,
                offset=offset + k * step,
                nbytes=nbytes,
            )
            odd = rng.random()
            if odd < 0.05:
                e = msgspec.structs.replace(e, segment=1 - segment)  # same place, other segment
            elif odd < 0.065:
                e = msgspec.structs.replace(e, shape=(rows * cols,), stride=(1,))  # same bytes, other shape
            elif odd < 0.08:  # one row more, the same strides
                longer = (shape[0] + 1, shape[1])
                e = msgspec.structs.replace(e, shape=longer, nbytes=nbytes + shape[1] * size)
            elif odd < 0.11 and len(shape) == 2:
                e = msgspec.structs.replace(e, stride=(1, shape[0]) if not transposed else (shape[1], 1))
            elif odd < 0.13:
                e = msgspec.structs.replace(e, segment=len(seg_bytes))  # no such segment
            elif odd < 0.15:
                e = msgspec.structs.replace(e, dtype="float99")
            elif odd < 0.18:
                e = msgspec.structs.replace(e, offset=e.offset + 1)  # misaligned for size > 1
            entries.append(e)
    return entries


def test_views_match_one_view_per_entry_for_any_manifest() -> None:
    """Whatever a manifest holds, build_views gives what one as_strided per
    entry gives, or refuses the same first entry with the same reason: runs
    are found only where they change nothing but speed."""
    import random

    from wcached.client.attach import build_views

    rng = random.Random(23)
    seg_bytes = [1024, 512 + 6]  # the second not a multiple of 4 or 8
    segments = [torch.randint(0, 256, (n,), dtype=torch.uint8) for n in seg_bytes]
    outcomes = {"viewed": 0, "refused": 0}
    for case in range(400):
        entries = _random_manifest(rng, seg_bytes)
        manifest = _manifest(entries, seg_bytes[0])
        manifest = msgspec.structs.replace(
            manifest,
            segments=[
                SegmentInfo(index=i, nbytes=n, backend="host", device="cpu0") for i, n in enumerate(seg_bytes)
            ],
        )
        # As an earlier daemon sends it (entries) and as version 3 does (runs).
        as_runs = received(for_version(manifest, 3))
        try:
            expected = _reference_views(manifest, segments)
        except ProtocolError as e:
            for form in (manifest, as_runs):
                with pytest.raises(ProtocolError) as got:
                    build_views(form, segments)
                assert str(got.value) == str(e), (case, entries)
            outcomes["refused"] += 1
            continue
        views = build_views(manifest, segments)
        by_runs = build_views(as_runs, segments)
        assert by_runs.keys() == views.keys(), case
        for name, v in by_runs.items():
            w = views[name]
            assert (v.dtype, v.shape, v.stride(), v.storage_offset()) == (
                w.dtype,
                w.shape,
                w.stride(),
                w.storage_offset(),
            ), (case, name)
        assert views.keys() == expected.keys(), case
        for name, want in expected.items():
            v = views[name]
            assert (v.dtype, v.shape, v.stride()) == (want.dtype, want.shape, want.stride()), (case, name)
            assert v.storage_offset() * v.element_size() + v.untyped_storage().data_ptr() == (
                want.storage_offset() * want.element_size() + want.untyped_storage().data_ptr()
            ), (case, name)
            as_bytes = [x.contiguous().reshape(-1).view(torch.uint8) for x in (v, want)]  # NaN != NaN
            assert torch.equal(*as_bytes), (case, name)
        outcomes["viewed"] += 1
    # Both sides of the rule were exercised, not only one.
    assert min(outcomes.values()) > 50, outcomes
