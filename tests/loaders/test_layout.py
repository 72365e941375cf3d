import itertools
import os

import pytest

from tests.helpers import fds_opened_since, open_fds
from wcached.loaders.layout import plan_layout


def test_packs_aligned_and_splits_at_segment_size() -> None:
    placements, sizes = plan_layout([("a", 10), ("b", 100), ("c", 200), ("d", 0)], 512, 256)
    assert [(p.name, p.segment, p.offset) for p in placements] == [
        ("a", 0, 0),
        ("b", 0, 256),
        ("c", 1, 0),
        ("d", 1, 256),
    ]
    assert sizes == [356, 256]


def test_oversized_tensor_gets_its_own_segment() -> None:
    placements, sizes = plan_layout([("small", 8), ("big", 5000), ("after", 8)], 1024, 64)
    assert [(p.segment, p.offset) for p in placements] == [(0, 0), (1, 0), (2, 0)]
    assert sizes == [8, 5000, 8]
    placements, sizes = plan_layout([("big", 5000)], 1024, 64)
    assert sizes == [5000]


def _reference_layout(sizes: list[tuple[str, int]], segment_bytes: int, alignment: int):
    """The packing rule, spelled out: each tensor at the next aligned offset
    of the current segment if it ends within ``segment_bytes``; else at 0 of
    a new one, unless the current one holds no byte yet (a tensor larger
    than a segment gets one of its own size, never an empty one before it)."""
    placed, ends = [], []
    for name, nbytes in sizes:
        if ends:
            start = -(-ends[-1] // alignment) * alignment
            if start + nbytes <= segment_bytes or ends[-1] == 0:
                placed.append((name, len(ends) - 1, start, nbytes))
                ends[-1] = start + nbytes
                continue
        placed.append((name, len(ends), 0, nbytes))
        ends.append(nbytes)
    return placed, ends


def test_any_sizes_pack_tightly_aligned_and_never_overlap() -> None:
    import random

    rng = random.Random(23)
    for case in range(500):
        alignment = rng.choice([1, 2, 64, 256])
        segment_bytes = rng.choice([256, 512, 1000, 1024])
        sizes = [
            (f"t{i}", rng.choice([0, 1, alignment - 1, alignment, alignment + 1, rng.randrange(1, 1500)]))
            for i in range(rng.randint(1, 12))
        ]
        placements, seg_sizes = plan_layout(sizes, segment_bytes, alignment)
        expected, ends = _reference_layout(sizes, segment_bytes, alignment)
        assert [(p.name, p.segment, p.offset, p.nbytes) for p in placements] == expected, (case, sizes)
        assert seg_sizes == ends, (case, sizes)
        # What a fill relies on, whatever the rule: aligned, within its
        # segment, and no two tensors sharing a byte.
        for p in placements:
            assert p.offset % alignment == 0 and p.offset + p.nbytes <= seg_sizes[p.segment]
        for seg in range(len(seg_sizes)):
            spans = sorted((p.offset, p.offset + p.nbytes) for p in placements if p.segment == seg)
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), (case, sizes)


def test_exact_fit_and_empty_first_tensors() -> None:
    # A tensor that ends on the segment's last byte stays in it.
    placements, sizes = plan_layout([("a", 256), ("b", 256)], 512, 256)
    assert [(p.segment, p.offset) for p in placements] == [(0, 0), (0, 256)] and sizes == [512]
    # An empty tensor first: the oversized one after it shares its segment.
    placements, sizes = plan_layout([("empty", 0), ("big", 5000)], 1024, 64)
    assert [(p.segment, p.offset) for p in placements] == [(0, 0), (0, 0)] and sizes == [5000]
    # One byte used: a tensor that no longer fits opens the next segment.
    placements, sizes = plan_layout([("byte", 1), ("fill", 1024)], 1024, 64)
    assert [(p.segment, p.offset) for p in placements] == [(0, 0), (1, 0)] and sizes == [1, 1024]


def test_phase_clock_adds_up_each_phase(monkeypatch) -> None:
    from wcached.loaders import layout

    now = [1000.0]
    monkeypatch.setattr(layout.time, "monotonic", lambda: now[0])
    clock = layout.PhaseClock()
    for phase, took in (("allocate", 0.5), ("copy", 2.25), ("seal", 0.125), ("copy", 1.0)):
        now[0] += took
        clock.lap(phase)
    now[0] += 0.123456789
    assert clock.phases == {"allocate": 0.5, "copy": 3.25, "seal": 0.125}
    assert clock.total() == pytest.approx(0.5 + 2.25 + 0.125 + 1.0 + 0.123456789, abs=1e-9)
    now[0] += 0.0000123
    clock.lap("post")
    assert clock.phases["post"] == 0.1235  # to 0.1 ms, as the log prints it


def test_an_alias_is_its_targets_placement_under_its_own_name() -> None:
    from wcached.loaders.layout import alias_entries
    from wcached.protocol.messages import TensorInfo

    embed = TensorInfo(
        name="embed.weight", dtype="bfloat16", shape=(4, 2), stride=(2, 1), segment=1, offset=512, nbytes=16
    )
    other = TensorInfo(
        name="norm.weight", dtype="bfloat16", shape=(2,), stride=(1,), segment=0, offset=0, nbytes=4
    )
    [lm_head] = alias_entries([other, embed], {"lm_head.weight": "embed.weight"})
    assert lm_head.name == "lm_head.weight" and lm_head.alias_of == "embed.weight"
    assert (lm_head.segment, lm_head.offset, lm_head.nbytes, lm_head.shape) == (1, 512, 16, (4, 2))
    assert embed.alias_of is None  # the target itself is left as it was


class _Writer:
    def __init__(self, log: list[str], label: str):
        self.log, self.label = log, label
        log.append(f"allocate {label}")

    def finish(self) -> int:
        self.log.append(f"finish {self.label}")
        return os.open("/dev/null", os.O_RDONLY)

    def abort(self) -> None:
        self.log.append(f"abort {self.label}")


class _Backend:
    def __init__(self, fail_allocate_at: int | None = None):
        self.log: list[str] = []
        self.fail_allocate_at = fail_allocate_at

    def allocate(self, nbytes: int, label: str) -> _Writer:
        if self.fail_allocate_at == len([e for e in self.log if e.startswith("allocate")]):
            raise MemoryError(f"no memory for {label}")
        return _Writer(self.log, label)


def test_in_order_a_failure_frees_the_segment_being_filled_and_closes_the_sealed_ones() -> None:
    """Segments are named ``<model>.<index>`` (the memfd's name an operator
    sees in /proc/<pid>/maps); a fill that fails in its third segment aborts
    that one only (the first two are sealed: their fds are closed, none
    leaks), and one failing at allocating its third aborts none twice."""
    from wcached.loaders.layout import PhaseClock, fill_segments_in_order

    def fill_one(i: int, writer: _Writer) -> None:
        if i == 2:
            raise OSError(f"read failed in segment {i}")

    before = open_fds()
    backend = _Backend()
    with pytest.raises(OSError, match="segment 2"):
        fill_segments_in_order(backend, "m", [64, 64, 64, 64], PhaseClock(), fill_one)
    assert backend.log == [
        *("allocate m.0", "finish m.0", "allocate m.1", "finish m.1"),
        *("allocate m.2", "abort m.2"),
    ]
    assert fds_opened_since(before) == {}
    backend = _Backend(fail_allocate_at=2)
    with pytest.raises(MemoryError, match=r"m\.2"):
        fill_segments_in_order(backend, "m", [64, 64, 64], PhaseClock(), lambda i, w: None)
    assert backend.log == ["allocate m.0", "finish m.0", "allocate m.1", "finish m.1"]
    assert fds_opened_since(before) == {}
    backend = _Backend()
    with pytest.raises(OSError, match="segment 0"):
        fill_segments_in_order(backend, "m", [64], PhaseClock(), lambda i, w: _fail(i))
    assert backend.log == ["allocate m.0", "abort m.0"]


def _fail(i: int) -> None:
    raise OSError(f"read failed in segment {i}")


def test_all_at_once_a_failure_frees_every_segment_and_phases_are_named() -> None:
    from wcached.loaders.layout import PhaseClock, fill_segments

    backend = _Backend()
    clock = PhaseClock()
    result, writers, fds = fill_segments(backend, "m", [64, 64], clock, lambda ws: len(ws))
    assert result == 2 and [w.label for w in writers] == ["m.0", "m.1"] and len(fds) == 2
    assert list(clock.phases) == ["allocate", "copy", "seal"]
    for fd in fds:
        os.close(fd)
    backend = _Backend()
    with pytest.raises(OSError, match="segment 1"):
        fill_segments(backend, "m", [64, 64], PhaseClock(), lambda ws: _fail(1))
    assert backend.log == ["allocate m.0", "allocate m.1", "abort m.0", "abort m.1"]


def test_in_order_phases_are_named_per_segment() -> None:
    from wcached.loaders.layout import PhaseClock, fill_segments_in_order

    clock = PhaseClock()
    writers, fds = fill_segments_in_order(_Backend(), "m", [64, 64], clock, lambda i, w: None)
    assert list(clock.phases) == ["allocate", "copy", "seal"] and [w.label for w in writers] == ["m.0", "m.1"]
    for fd in fds:
        os.close(fd)


def test_a_fills_rate_is_over_its_reading_where_it_timed_one() -> None:
    from wcached.loaders.layout import READ, describe_fill, reading_rate

    phases = {"vllm_setup": 15.0, READ: 2.0, "vllm_post": 1.0}
    assert reading_rate(phases, 8_000_000_000) == (2.0, 4.0)
    text = describe_fill(4_000_000_000, 18.0, phases, 8_000_000_000)
    assert text.startswith("read 8.00 GB in 2.00 s, 4.00 GB/s; ")
    assert "vllm_setup 15.00 s" in text and "vllm_post 1.00 s" in text
    # No reading phase, or no bytes counted: the whole fill's rate.
    assert reading_rate({"copy": 2.0}, 8_000_000_000) is None
    assert reading_rate(phases, 0) is None
    assert reading_rate({READ: 0.5}, 1) == (0.5, 2e-9)  # a byte is something read
    assert describe_fill(4_000_000_000, 0.5, {"copy": 0.5}, 0) == "8.00 GB/s"
    assert describe_fill(5_000_000, 1.0, {}, 0) == "0.01 GB/s"  # decimal GB, exactly: 0.005 rounds up
