"""Placing tensors at aligned offsets inside a few large segments.

One attach then opens a handful of fds instead of one handle per tensor (the
reason wcached's attach beats per-tensor CUDA IPC by an order of magnitude).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import msgspec

from wcached.protocol.messages import Manifest, TensorInfo
from wcached.protocol.wire import close_fds

if TYPE_CHECKING:
    from wcached.memory.base import MemoryBackend, SegmentWriter

T = TypeVar("T")


@dataclass(frozen=True)
class Placement:
    name: str
    segment: int
    offset: int
    nbytes: int


@dataclass
class SegmentPlan:
    index: int
    used: int = 0
    names: list[str] = field(default_factory=list)


def plan_layout(
    sizes: Iterable[tuple[str, int]], segment_bytes: int, alignment: int
) -> tuple[list[Placement], list[int]]:
    """Pack tensors in the given order; returns placements and segment sizes.

    A tensor larger than ``segment_bytes`` gets a segment of its own size so
    that no tensor ever spans two segments.
    """
    placements: list[Placement] = []
    segments: list[SegmentPlan] = []
    for name, nbytes in sizes:
        seg = segments[-1] if segments else None
        offset = _align(seg.used, alignment) if seg else 0
        if seg is None or (offset + nbytes > segment_bytes and seg.used > 0):
            seg = SegmentPlan(len(segments))
            segments.append(seg)
            offset = 0
        seg.used = offset + nbytes
        seg.names.append(name)
        placements.append(Placement(name, seg.index, offset, nbytes))
    return placements, [s.used for s in segments]


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


@dataclass
class FilledModel:
    """What a loader hands the worker: the manifest and the segment fds (owned)."""

    manifest: Manifest
    fds: list[int]
    fill_seconds: float
    # Seconds per phase ("headers", "allocate", READ, ...), for the log and
    # status.
    phases: dict[str, float] = field(default_factory=dict)
    # Device memory the fill used at its peak (GPU fills that measure it).
    peak_device_bytes: int | None = None
    # Checkpoint bytes read in the READ phase (0: no such phase).
    read_bytes: int = 0


# The phase of a fill that reads the checkpoint: its throughput is quoted over
# this phase alone (a vLLM fill's import and set-up, and any post-processing,
# are phases of their own).
READ = "read"


def describe_fill(total_bytes: int, seconds: float, phases: dict[str, float], read_bytes: int) -> str:
    """A fill's speed as the daemon's log and ``wcached status`` say it: over
    the reading alone where the fill timed it, with every phase."""
    reading = reading_rate(phases, read_bytes)
    if reading is None:
        return f"{total_bytes / 1e9 / max(seconds, 1e-9):.2f} GB/s"
    return f"read {read_bytes / 1e9:.2f} GB in {reading[0]:.2f} s, {reading[1]:.2f} GB/s; " + ", ".join(
        f"{k} {v:.2f} s" for k, v in phases.items()
    )


def reading_rate(phases: dict[str, float], read_bytes: int) -> tuple[float, float] | None:
    """Seconds the fill spent reading the checkpoint and the GB/s over them,
    or None where it has no reading phase (a fill from before it was timed)."""
    seconds = phases.get(READ, 0.0)
    if seconds <= 0 or read_bytes <= 0:
        return None
    return seconds, read_bytes / 1e9 / seconds


class PhaseClock:
    """Seconds spent in consecutive phases of a fill."""

    def __init__(self) -> None:
        self.start = self.last = time.monotonic()
        self.phases: dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self.phases[name] = round(self.phases.get(name, 0.0) + now - self.last, 4)
        self.last = now

    def total(self) -> float:
        return time.monotonic() - self.start


def alias_entries(entries: list[TensorInfo], aliases: dict[str, str]) -> list[TensorInfo]:
    """Manifest entries for tied names: the target's placement under another
    name, marked ``alias_of`` so that clients bind one shared object."""
    by_name = {e.name: e for e in entries}
    return [
        msgspec.structs.replace(by_name[target], name=alias, alias_of=target)
        for alias, target in sorted(aliases.items())
    ]


def fill_segments(
    backend: MemoryBackend,
    label: str,
    sizes: list[int],
    clock: PhaseClock,
    copy: Callable[[list[SegmentWriter]], T],
    phase: str = "copy",
) -> tuple[T, list[SegmentWriter], list[int]]:
    """Allocate the segments, let ``copy`` fill them (timed as ``phase``),
    then seal or export them; on any failure every segment is freed. Returns
    what ``copy`` returned, the writers and the fds that now own the
    segments."""
    writers: list[SegmentWriter] = []
    try:
        for i, size in enumerate(sizes):
            writers.append(backend.allocate(size, f"{label}.{i}"))
        clock.lap("allocate")
        result = copy(writers)
        clock.lap(phase)
        fds = [w.finish() for w in writers]
        clock.lap("seal")
    except BaseException:
        for w in writers:
            w.abort()
        raise
    return result, writers, fds


def fill_segments_in_order(
    backend: MemoryBackend,
    label: str,
    sizes: list[int],
    clock: PhaseClock,
    fill_one: Callable[[int, SegmentWriter], None],
) -> tuple[list[SegmentWriter], list[int]]:
    """Allocate, fill and seal one segment at a time, so that ``fill_one`` can
    free what it copied before the next segment is allocated (a loader whose
    source is already in device memory then needs one segment more, not the
    model twice). On any failure every segment is freed."""
    writers: list[SegmentWriter] = []
    fds: list[int] = []
    try:
        for i, size in enumerate(sizes):
            writers.append(backend.allocate(size, f"{label}.{i}"))
            clock.lap("allocate")
            fill_one(i, writers[-1])
            clock.lap("copy")
            fds.append(writers[-1].finish())
            clock.lap("seal")
    except BaseException:
        if len(writers) > len(fds):  # the one being filled
            writers[-1].abort()
        close_fds(fds)
        raise
    return writers, fds
