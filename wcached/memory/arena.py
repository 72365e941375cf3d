"""Where an arena places the memory torch's caching allocator asks of it.

A vLLM fill on a GPU builds the model's weights straight in exportable
memory: torch's caching allocator, pointed at a pool whose allocator is an
arena (:mod:`wcached.memory.cuda_arena`), asks the arena for segments of its
own (2 MiB for small tensors, 20 MiB for those below 10 MiB, the rounded
size above), and the arena places them in a few large chunks, each one
exportable handle. Once loaded, each chunk that holds a weight becomes one
segment of the manifest, and a weight's place is its chunk and offset: no
second copy of the model, and no copy step.

This module is the placement alone, over chunks that a ``create`` callback
makes (CUDA VMM in the worker, plain numbers in the tests):

- a request goes into the first shared chunk made so far with room at its
  end;
- else, of half a chunk or more, it gets a chunk of its own, of its size
  (rounded up to the handle granularity), so big tensors waste nothing;
- else a new shared chunk of ``chunk_bytes``; or, where the fill said how
  many bytes the model is expected to take, of what is left of them once
  that is at most ``LAST_CHUNKS`` chunks (so the last chunk ends about where
  the weights do, instead of holding up to a chunk that no tensor uses), and
  once that is used up (torch's rounding, an estimate that was low) of sizes
  doubling from ``OVERFLOW_CHUNK``, so an overrun costs few segments.

Nothing is given back before the seal: torch returns a pool's segments to
its allocator only once the pool itself is gone, and keeps what the load
freed (a layer quantized from bf16, say) cached for the load's next requests.

:meth:`Arena.seal` then says which chunks hold the given byte spans (the
model's storages) and counts the bytes of those chunks that no span uses
(torch's rounding, the load's freed temporaries, the last chunk's tail),
which are exported with them.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# Requests are placed at multiples of this (torch asks for multiples of it).
PLACEMENT_ALIGN = 2 << 20
# The last shared chunk takes what is left of the expected bytes up to this
# many chunks' worth, so that a big tensor that comes last (an untied
# lm_head) goes into its room instead of a chunk of its own beside a last
# chunk that holds little.
LAST_CHUNKS = 2
# The first chunk made past the expected bytes; each next one doubles (up to
# the chunk size): an overrun of R bytes costs about log2(R / this) chunks
# and leaves at most half of the last one unused.
OVERFLOW_CHUNK = 32 << 20


class ArenaError(Exception):
    """A request the arena cannot place (sealed, or of no bytes)."""


@dataclass
class Chunk:
    """One exportable allocation, handed out front to back."""

    base: int  # device address of its first byte
    nbytes: int
    handle: Any  # what ``create`` returned beside the address
    exact: bool  # made for one request (half a chunk or more)
    top: int = 0  # bytes handed out from its start

    def take(self, nbytes: int) -> int | None:
        """The address of ``nbytes`` more at the chunk's end, if they fit."""
        if self.nbytes - self.top < nbytes:
            return None
        address = self.base + self.top
        self.top += nbytes
        return address

    def contains(self, address: int, nbytes: int) -> bool:
        return self.base <= address and address + nbytes <= self.base + self.nbytes


@dataclass(frozen=True)
class SealedArena:
    """What :meth:`Arena.seal` decided."""

    chunks: list[Chunk]  # those holding a span, in address order: the segments
    # Per span given: (index into chunks, offset in it), or None where the
    # span is not inside one chunk of the arena (memory torch got elsewhere).
    places: list[tuple[int, int] | None]
    live_bytes: int  # bytes of the kept chunks that the spans cover
    dead_bytes: int  # bytes of the kept chunks that none covers
    # Chunks holding no span: not exported, and not released either (a
    # tensor torch still has may live in one; the worker's exit frees them).
    unexported: int


class Arena:
    """Chunks, and the ranges torch's allocator was given in them."""

    def __init__(
        self,
        chunk_bytes: int,
        granularity: int,
        create: Callable[[int], tuple[int, Any]],
        expected_bytes: int | None = None,
        max_chunk_bytes: int | None = None,
    ):
        if chunk_bytes < granularity or chunk_bytes % granularity:
            raise ValueError(f"chunk of {chunk_bytes} bytes is not a multiple of {granularity}")
        self.chunk_bytes = chunk_bytes
        self.granularity = granularity
        self._create = create
        # What the model's tensors are expected to take (None: not known).
        self.expected_bytes = expected_bytes
        # The largest chunk a shared one may grow to (the model's segment_size).
        self.max_chunk_bytes = max(chunk_bytes, max_chunk_bytes or 0) // granularity * granularity
        self._overruns = 0  # chunks made past the expected bytes
        self.chunks: list[Chunk] = []  # sorted by base
        self.sealed = False

    @property
    def held_bytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)

    @property
    def handed_out(self) -> int:
        """Bytes given to torch's allocator so far."""
        return sum(c.top for c in self.chunks)

    def alloc(self, nbytes: int) -> int:
        """The device address of ``nbytes`` for torch's allocator."""
        if self.sealed:
            raise ArenaError("the arena is sealed: its chunks are exported")
        if nbytes <= 0:
            raise ArenaError(f"a request of {nbytes} bytes")
        want = _round_up(nbytes, PLACEMENT_ALIGN)
        # Room left in a shared chunk takes any request that fits (the last
        # chunk, sized to what is left of the expected bytes, holds the big
        # ones that come last: an untied lm_head).
        for chunk in self.chunks:
            if not chunk.exact:
                address = chunk.take(want)
                if address is not None:
                    return address
        if want * 2 < self.chunk_bytes:
            size, overrun = self._shared_chunk_bytes(want)
            chunk = self._new_chunk(size, exact=False)
            self._overruns += overrun
        else:
            chunk = self._new_chunk(_round_up(want, self.granularity), exact=True)
        address = chunk.take(want)
        assert address == chunk.base  # a new chunk is empty
        return address

    def seal(self, spans: Sequence[tuple[int, int]]) -> SealedArena:
        """No more requests; which chunks hold ``spans`` (address, nbytes):
        those are exported, in address order."""
        self.sealed = True
        holding: dict[int, Chunk] = {}
        located: list[Chunk | None] = []
        for address, nbytes in spans:
            chunk = self._chunk_at(address)
            if chunk is not None and not chunk.contains(address, nbytes):
                chunk = None
            located.append(chunk)
            if chunk is not None:
                holding[id(chunk)] = chunk
        kept = [c for c in self.chunks if id(c) in holding]
        index = {id(c): i for i, c in enumerate(kept)}
        live = _covered([(a, n) for (a, n), c in zip(spans, located, strict=True) if c is not None and n > 0])
        return SealedArena(
            chunks=kept,
            places=[
                None if c is None else (index[id(c)], a - c.base)
                for (a, _), c in zip(spans, located, strict=True)
            ],
            live_bytes=live,
            dead_bytes=sum(c.nbytes for c in kept) - live,
            unexported=len(self.chunks) - len(kept),
        )

    def _shared_chunk_bytes(self, want: int) -> tuple[int, bool]:
        """The size of a new chunk for requests of less than half a chunk,
        the first of them ``want`` bytes, and whether it is made past the
        expected bytes."""
        if self.expected_bytes is None:
            return self.chunk_bytes, False
        left = self.expected_bytes - self.handed_out
        overrun = left < want
        if overrun:
            left = OVERFLOW_CHUNK << min(self._overruns, 32)
            return min(self.chunk_bytes, _round_up(max(left, want), self.granularity)), True
        # What is left, in one chunk where it is at most LAST_CHUNKS chunks'
        # worth (and within the largest segment): the last chunk ends where
        # the weights are expected to.
        cap = self.chunk_bytes if left > LAST_CHUNKS * self.chunk_bytes else self.max_chunk_bytes
        return min(cap, _round_up(max(left, want), self.granularity)), False

    def _new_chunk(self, nbytes: int, exact: bool) -> Chunk:
        base, handle = self._create(nbytes)
        chunk = Chunk(base, nbytes, handle, exact)
        bisect.insort(self.chunks, chunk, key=lambda c: c.base)
        return chunk

    def _chunk_at(self, address: int) -> Chunk | None:
        i = bisect.bisect_right([c.base for c in self.chunks], address) - 1
        if i >= 0 and address < self.chunks[i].base + self.chunks[i].nbytes:
            return self.chunks[i]
        return None


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def _covered(spans: list[tuple[int, int]]) -> int:
    """Bytes covered by the union of ``spans`` (views of one storage, ties
    and neighbours may overlap)."""
    total = 0
    end = -1
    for address, nbytes in sorted(spans):
        if address >= end:
            total += nbytes
            end = address + nbytes
        elif address + nbytes > end:
            total += address + nbytes - end
            end = address + nbytes
    return total
