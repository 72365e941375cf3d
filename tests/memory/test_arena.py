"""The arena's placement, over chunks that are plain numbers."""

from __future__ import annotations

import itertools
import random

import pytest

from wcached.memory.arena import OVERFLOW_CHUNK, PLACEMENT_ALIGN, Arena, ArenaError

MiB = 1 << 20
GRAIN = 2 * MiB


class FakeDevice:
    """Chunks at addresses that leave a gap between them, so that an address
    one past a chunk is in none."""

    def __init__(self, limit: int | None = None):
        self.next = 1 << 40
        self.live: dict[int, int] = {}
        self.made: list[int] = []
        self.limit = limit

    def create(self, nbytes: int) -> tuple[int, str]:
        if self.limit is not None and sum(self.live.values()) + nbytes > self.limit:
            raise MemoryError("out of device memory")
        base = self.next
        self.next += nbytes + (1 << 30)
        self.live[base] = nbytes
        self.made.append(nbytes)
        return base, f"handle-{len(self.made)}"


def arena(chunk: int = 64 * MiB, **kw) -> tuple[Arena, FakeDevice]:
    dev = FakeDevice(**kw)
    return Arena(chunk, GRAIN, dev.create), dev


def test_small_requests_share_one_chunk_back_to_back():
    a, dev = arena()
    first = a.alloc(2 * MiB)
    second = a.alloc(20 * MiB)
    third = a.alloc(1)  # rounded up to the placement step
    assert dev.made == [64 * MiB]
    assert second == first + 2 * MiB
    assert third == second + 20 * MiB
    assert third % PLACEMENT_ALIGN == first % PLACEMENT_ALIGN


def test_a_request_that_does_not_fit_opens_a_new_chunk_and_later_ones_fill_earlier_tails():
    a, dev = arena()
    first = a.alloc(30 * MiB)
    a.alloc(30 * MiB)
    third = a.alloc(30 * MiB)  # 4 MiB left in the first chunk: a new one
    assert dev.made == [64 * MiB, 64 * MiB]
    assert not (first <= third < first + 64 * MiB)
    fourth = a.alloc(4 * MiB)  # fits the first chunk's tail
    assert fourth == first + 60 * MiB


def test_half_a_chunk_or_more_gets_an_exact_chunk_of_its_own():
    a, dev = arena()
    a.alloc(32 * MiB)  # exactly half
    a.alloc(100 * MiB + 1)  # larger than a chunk: rounded to the granularity
    assert dev.made == [32 * MiB, 102 * MiB]
    small = a.alloc(2 * MiB)  # never placed in an exact chunk's tail
    assert dev.made == [32 * MiB, 102 * MiB, 64 * MiB]
    assert [c.nbytes for c in a.chunks if c.base == small] == [64 * MiB]


def test_a_big_request_goes_into_a_shared_chunks_room_where_it_fits():
    a, dev = arena()
    first = a.alloc(2 * MiB)
    big = a.alloc(40 * MiB)  # more than half a chunk, and the first chunk has room
    assert dev.made == [64 * MiB]
    assert big == first + 2 * MiB


def test_without_expected_bytes_every_shared_chunk_is_a_whole_chunk():
    a, dev = arena()
    for _ in range(5):
        a.alloc(30 * MiB)
    assert dev.made == [64 * MiB, 64 * MiB, 64 * MiB]


def test_the_last_chunk_is_sized_to_what_is_left_of_the_expected_bytes():
    # 200 MiB expected in chunks of 64: whole chunks while more than two
    # chunks' worth is left, then one chunk of the rest.
    dev = FakeDevice()
    a = Arena(64 * MiB, GRAIN, dev.create, expected_bytes=200 * MiB, max_chunk_bytes=1 << 30)
    for _ in range(10):
        a.alloc(20 * MiB)
    assert dev.made == [64 * MiB, 64 * MiB, 80 * MiB]  # 3, 3 and 4 requests of 20
    sealed = a.seal([(c.base, c.top) for c in a.chunks])
    assert sealed.dead_bytes == 8 * MiB  # the whole chunks' tails; none in the last


def test_a_big_tensor_that_comes_last_goes_into_the_last_chunk_not_beside_it():
    # An untied lm_head after the layers: the last shared chunk, sized to
    # what is left, has room for it instead of holding the last layer alone.
    dev = FakeDevice()
    a = Arena(64 * MiB, GRAIN, dev.create, expected_bytes=180 * MiB, max_chunk_bytes=1 << 30)
    for _ in range(7):
        a.alloc(20 * MiB)
    head = a.alloc(40 * MiB)
    assert dev.made == [64 * MiB, 120 * MiB]
    assert a.chunks[1].contains(head, 40 * MiB)


def test_the_last_chunk_stays_within_the_largest_segment():
    dev = FakeDevice()
    a = Arena(64 * MiB, GRAIN, dev.create, expected_bytes=120 * MiB, max_chunk_bytes=100 * MiB)
    a.alloc(20 * MiB)
    assert dev.made == [100 * MiB]


def test_past_the_expected_bytes_chunks_double_from_the_overflow_size():
    dev = FakeDevice()
    a = Arena(1 << 30, GRAIN, dev.create, expected_bytes=10 * MiB, max_chunk_bytes=1 << 30)
    a.alloc(10 * MiB)  # the expected bytes, exactly
    for _ in range(4):  # each fills its chunk: the next one doubles
        a.alloc(a.chunks[-1].nbytes - a.chunks[-1].top or OVERFLOW_CHUNK)
    assert dev.made[0] == 10 * MiB
    assert dev.made[1:] == [OVERFLOW_CHUNK, 2 * OVERFLOW_CHUNK, 4 * OVERFLOW_CHUNK]


def test_an_overrun_chunk_is_never_smaller_than_its_request():
    dev = FakeDevice()
    a = Arena(1 << 30, GRAIN, dev.create, expected_bytes=2 * MiB, max_chunk_bytes=1 << 30)
    a.alloc(2 * MiB)
    a.alloc(300 * MiB)
    assert dev.made == [2 * MiB, 300 * MiB]


def test_a_create_that_fails_leaves_the_arena_as_it_was():
    a, _ = arena(limit=100 * MiB)
    a.alloc(64 * MiB)
    with pytest.raises(MemoryError):
        a.alloc(40 * MiB)
    assert len(a.chunks) == 1 and a.held_bytes == 64 * MiB


def test_seal_exports_the_chunks_holding_spans_and_keeps_the_rest_unexported():
    a, dev = arena()
    w1 = a.alloc(40 * MiB)  # exact chunk
    scratch = a.alloc(40 * MiB)  # exact chunk, no weight in it
    w2 = a.alloc(4 * MiB)
    w3 = a.alloc(2 * MiB)  # same chunk as w2
    sealed = a.seal([(w2 + 512, 1000), (w1, 40 * MiB), (w3, 2 * MiB), (w2 + 512, 100), (1, 10)])
    assert [c.base for c in sealed.chunks] == sorted([w1, w2])
    i1 = [c.base for c in sealed.chunks].index(w1)
    i2 = 1 - i1
    assert sealed.places == [(i2, 512), (i1, 0), (i2, 4 * MiB), (i2, 512), None]
    # The scratch chunk is neither exported nor freed: a tensor torch still
    # has may live in it, and the worker's exit frees it.
    assert sealed.unexported == 1 and scratch in dev.live
    # Overlapping spans are counted once; the rest of the kept chunks is dead.
    assert sealed.live_bytes == 1000 + 40 * MiB + 2 * MiB
    assert sealed.dead_bytes == 40 * MiB + 64 * MiB - sealed.live_bytes
    with pytest.raises(ArenaError, match="sealed"):
        a.alloc(2 * MiB)


def test_a_span_crossing_a_chunks_end_is_not_placed():
    a, _ = arena()
    p = a.alloc(4 * MiB)
    sealed = a.seal([(p + 64 * MiB - 10, 20)])
    assert sealed.places == [None] and sealed.chunks == [] and sealed.unexported == 1


def test_a_chunk_size_off_the_granularity_is_refused():
    with pytest.raises(ValueError, match="multiple"):
        Arena(3 * MiB, GRAIN, FakeDevice().create)


def test_a_request_of_no_bytes_is_refused():
    a, _ = arena()
    with pytest.raises(ArenaError, match="request of 0 bytes"):
        a.alloc(0)


def test_random_requests_never_overlap_and_stay_inside_their_chunks():
    rng = random.Random(7)
    a, dev = arena()
    given: list[tuple[int, int]] = []
    for _ in range(2000):
        n = rng.choice([2 * MiB, 20 * MiB, rng.randrange(1, 80 * MiB)])
        p = a.alloc(n)
        assert p % PLACEMENT_ALIGN == 0
        given.append((p, -(-n // PLACEMENT_ALIGN) * PLACEMENT_ALIGN))
    given.sort()
    for (p1, n1), (p2, _) in itertools.pairwise(given):
        assert p1 + n1 <= p2
    for p, n in given:
        assert sum(1 for c in a.chunks if c.contains(p, n)) == 1
    assert sum(dev.live.values()) == a.held_bytes


def test_a_chunk_of_exactly_the_granularity_is_allowed():
    a = Arena(GRAIN, GRAIN, FakeDevice().create)
    assert a.alloc(1) and a.held_bytes == GRAIN


def test_a_largest_segment_off_the_granularity_is_rounded_down_to_it():
    dev = FakeDevice()
    a = Arena(64 * MiB, GRAIN, dev.create, expected_bytes=120 * MiB, max_chunk_bytes=101 * MiB)
    a.alloc(20 * MiB)
    assert dev.made == [100 * MiB] and isinstance(dev.made[0], int)


def test_with_exactly_two_chunks_left_the_last_chunk_takes_them_all():
    dev = FakeDevice()
    a = Arena(64 * MiB, GRAIN, dev.create, expected_bytes=128 * MiB, max_chunk_bytes=1 << 30)
    a.alloc(20 * MiB)
    assert dev.made == [128 * MiB]


def test_an_exact_chunks_tail_takes_no_small_request():
    # A handle granularity above the placement step leaves an exact chunk a
    # tail; it is the big tensor's alone (not a shared chunk's room).
    dev = FakeDevice()
    a = Arena(64 * MiB, 8 * MiB, dev.create)
    big = a.alloc(34 * MiB)  # half a chunk or more: a chunk of 40 MiB, 6 MiB of tail
    small = a.alloc(2 * MiB)
    assert dev.made == [40 * MiB, 64 * MiB]
    assert not (big <= small < big + 40 * MiB)


def test_a_sealed_chunk_keeps_the_handle_its_create_returned():
    a, _ = arena()
    p = a.alloc(2 * MiB)
    sealed = a.seal([(p, 2 * MiB)])
    assert [c.handle for c in sealed.chunks] == ["handle-1"]


def test_a_one_byte_span_is_live():
    a, _ = arena()
    p = a.alloc(2 * MiB)
    assert a.seal([(p, 1)]).live_bytes == 1


def test_covered_bytes_are_the_union_of_overlapping_and_nested_spans():
    from wcached.memory.arena import _covered

    assert _covered([(0, 10)]) == 10
    assert _covered([(0, 10), (5, 10), (12, 2)]) == 15
    assert _covered([(0, 10), (10, 5)]) == 15


def test_an_arena_that_made_no_chunk_places_no_span():
    a, _ = arena()
    sealed = a.seal([(1 << 40, 10)])
    assert sealed.places == [None] and sealed.chunks == [] and sealed.live_bytes == 0
