"""build_views: zero-copy views from manifest entries."""

from __future__ import annotations

import pytest
import torch

from wcached.errors import ProtocolError
from wcached.keys import CacheKey
from wcached.protocol.messages import Manifest, SegmentInfo, TensorInfo

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
