"""A manifest's tensors as runs (protocol version 3), and back.

A run is a stretch of consecutive manifest entries that differ only in name,
offset and digest, with offsets at a constant step (the experts of a layer,
the gate and up projections of a Llama layer; any tensor alone is a run of
one). Sending runs instead of one struct per tensor is what lets a client of
a 5,000-tensor model decode its manifest and build its views without a
Python object per tensor on the attach path: the entries themselves are made
only when someone reads ``manifest.tensors``.

The round trip is exact: ``expand(to_runs(entries)) == entries``, order
included, so whatever reads entries (the vLLM bind, ``wcached verify``, the
lease's "same fill" comparison) sees what the daemon holds.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import msgspec

from wcached.errors import ProtocolError
from wcached.protocol.messages import Manifest, TensorInfo, TensorRun

# The first version whose attached manifests carry runs.
RUNS_VERSION = 3


def to_runs(entries: Sequence[TensorInfo]) -> list[TensorRun]:
    """The entries as the fewest runs that keep their order."""
    runs: list[TensorRun] = []
    n = len(entries)
    i = 0
    while i < n:
        t = entries[i]
        j = i + 1
        step = 0
        if t.alias_of is None and j < n:
            step = entries[j].offset - t.offset
            # A step of 0 or less would make views overlap or run backwards:
            # such entries stay runs of one.
            if step > 0:
                while (
                    j < n and _same_layout(entries[j], t) and entries[j].offset == t.offset + (j - i) * step
                ):
                    j += 1
        if j == i + 1:
            step = 0
        members = entries[i:j]
        digests = [e.digest for e in members]
        runs.append(
            TensorRun(
                dtype=t.dtype,
                shape=t.shape,
                stride=t.stride,
                segment=t.segment,
                offset=t.offset,
                step=step,
                nbytes=t.nbytes,
                kind=t.kind,
                names=[e.name for e in members],
                digests=digests if any(digests) else [],
                alias_of=t.alias_of,
            )
        )
        i = j
    return runs


def _same_layout(u: TensorInfo, t: TensorInfo) -> bool:
    return (
        u.alias_of is None
        and u.segment == t.segment
        and u.dtype == t.dtype
        and u.shape == t.shape
        and u.stride == t.stride
        and u.nbytes == t.nbytes
        and u.kind == t.kind
    )


def check_run(run: TensorRun) -> None:
    """What a client refuses before it trusts a run from the wire."""
    count = len(run.names)
    where = f"run of {run.names[0]!r}" if run.names else "a run"
    if not count:
        raise ProtocolError(f"{where} names no tensor")
    if run.digests and len(run.digests) != count:
        raise ProtocolError(f"{where}: {len(run.digests)} digests for {count} tensors")
    if count > 1 and (run.step <= 0 or run.alias_of is not None):
        raise ProtocolError(f"{where}: {count} tensors need a positive step and no alias")


def expand(runs: Sequence[TensorRun]) -> list[TensorInfo]:
    """The entries the runs stand for, in order."""
    out: list[TensorInfo] = []
    for run in runs:
        check_run(run)
        digests = run.digests or [""] * len(run.names)
        for k, (name, digest) in enumerate(zip(run.names, digests, strict=True)):
            out.append(
                TensorInfo(
                    name=name,
                    dtype=run.dtype,
                    shape=run.shape,
                    stride=run.stride,
                    segment=run.segment,
                    offset=run.offset + k * run.step,
                    nbytes=run.nbytes,
                    kind=run.kind,
                    alias_of=run.alias_of,
                    digest=digest,
                )
            )
    return out


class RunEntries(Sequence[TensorInfo]):
    """``Manifest.tensors`` of a manifest that arrived as runs: a sequence of
    entries made from the runs the first time one is read."""

    __slots__ = ("_entries", "_len", "runs")

    def __init__(self, runs: list[TensorRun]):
        self.runs = runs
        self._len = sum(len(r.names) for r in runs)
        self._entries: list[TensorInfo] | None = None

    def _all(self) -> list[TensorInfo]:
        if self._entries is None:
            self._entries = expand(self.runs)
        return self._entries

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> TensorInfo: ...
    @overload
    def __getitem__(self, i: slice) -> list[TensorInfo]: ...
    def __getitem__(self, i: int | slice) -> TensorInfo | list[TensorInfo]:
        return self._all()[i]

    def __iter__(self) -> Iterator[TensorInfo]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RunEntries):
            return self.runs == other.runs
        if isinstance(other, Sequence):
            return self._all() == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        raise TypeError("RunEntries is not hashable")

    def __repr__(self) -> str:
        return f"RunEntries({self._len} tensors in {len(self.runs)} runs)"


def for_version(manifest: Manifest, version: int) -> Manifest:
    """The manifest as a daemon sends it to a client of ``version``: runs in
    place of entries from version 3 on (the daemon caches the result)."""
    if version < RUNS_VERSION:
        return manifest
    return msgspec.structs.replace(manifest, tensors=[], runs=to_runs(manifest.tensors))


def received(manifest: Manifest) -> Manifest:
    """The manifest a client works with: one that came as runs gets a
    :class:`RunEntries` as its ``tensors`` and no ``runs`` of its own, so it
    equals the same fill sent as entries by an earlier daemon (the lease's
    "same fill" test after a restart compares manifests)."""
    if not manifest.runs:
        return manifest
    if manifest.tensors:
        raise ProtocolError("a manifest must carry tensors or runs, not both")
    for run in manifest.runs:
        check_run(run)
    entries: Any = RunEntries(manifest.runs)
    return msgspec.structs.replace(manifest, tensors=entries, runs=[])


def runs_of(manifest: Manifest) -> list[TensorRun]:
    """The manifest's tensors as runs, made from its entries only when it
    did not arrive as runs."""
    if isinstance(manifest.tensors, RunEntries):
        return manifest.tensors.runs
    return manifest.runs or to_runs(manifest.tensors)
