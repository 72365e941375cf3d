"""The safetensors loader: one file, a directory of shards, or an index.

What the checkpoint holds (its files, headers, fingerprints) is asked of
:class:`~wcached.loaders.checkpoint.Checkpoint`. Byte copies need no torch: on
the host-memory backend a checkpoint goes from the page cache into sealed
memfds with one ``preadv`` per chunk. torch is imported only when the model's
dtype policy casts tensors.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import math
import threading
import time

import xxhash

from wcached import tensor_digest
from wcached.errors import FillMisconfigured
from wcached.keys import CacheKey
from wcached.loaders.base import ModelConfig
from wcached.loaders.checkpoint import (
    Checkpoint,
    Headers,
    OpenFiles,
    StoredTensor,
    cast_pieces,
    check_complete,
    header_fingerprint,
)
from wcached.loaders.layout import READ, FilledModel, PhaseClock, alias_entries, fill_segments, plan_layout
from wcached.memory.base import MemoryBackend, ProgressFn
from wcached.protocol.messages import Manifest, SegmentInfo, TensorInfo


def checkpoint_fingerprint(path: str) -> str:
    """The key's fingerprint of a safetensors checkpoint on disk, as an engine
    computes it to ``expect`` (kept where the README first named it)."""
    return Checkpoint(path).header_fingerprint()


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for d in reversed(shape):
        stride.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(stride))


class SafetensorsModel(ModelConfig, tag="safetensors", frozen=True, kw_only=True):
    """``loader = "safetensors"``: the checkpoint's tensors as stored (or
    cast to ``dtype``), for any engine that reads them by name."""

    # Tied weights the checkpoint stores once: alias name -> stored tensor name.
    aliases: dict[str, str] = {}


class SafetensorsLoader:
    name = "safetensors"
    options = SafetensorsModel

    def key(self, model: SafetensorsModel, fingerprint: str) -> CacheKey:
        """What identifies the filled tensors: the checkpoint (its header or
        content fingerprint, :func:`~wcached.loaders.checkpoint.header_fingerprint`)
        and the cast."""
        return CacheKey(model=model.name, loader=self.name, fingerprint=fingerprint, dtype=model.dtype)

    def environment(self, model: ModelConfig, python: str) -> str:
        return ""  # the fill reads bytes; nothing else changes them

    def fill(
        self, model: SafetensorsModel, backend: MemoryBackend, instance: str, progress: ProgressFn
    ) -> FilledModel:
        clock = PhaseClock()
        backend.prepare_staging(model.reader_count(backend.auto_readers))
        ckpt = Checkpoint(model.path).headers()
        clock.lap("headers")
        names = {t.name for t in ckpt.tensors}
        for alias, target in model.aliases.items():
            if alias in names:
                raise FillMisconfigured(f"model {model.name!r}: alias {alias!r} is itself a stored tensor")
            if target not in names:
                raise FillMisconfigured(
                    f"model {model.name!r}: alias {alias!r} names missing tensor {target!r}"
                )

        out_dtypes, placements, seg_sizes = self._layout(model, ckpt)
        algorithm = ""
        if model.digest or model.fingerprint == "content":
            algorithm = backend.after_fill_digest() or tensor_digest.HOST

        def copy(writers: list) -> list[str]:
            digests = self._copy_all(
                model,
                ckpt,
                out_dtypes,
                placements,
                writers,
                progress,
                backend,
                algorithm == tensor_digest.HOST,
            )
            if algorithm and algorithm != tensor_digest.HOST:
                clock.lap(READ)
                digests = _digests_after_fill(placements, writers)
            return digests

        digests, writers, fds = fill_segments(
            backend,
            model.name,
            seg_sizes,
            clock,
            copy,
            phase=READ if algorithm in ("", tensor_digest.HOST) else "digest",
        )

        fingerprint = header_fingerprint(ckpt)
        if model.fingerprint == "content":
            h = hashlib.sha256(fingerprint.encode())
            for d in digests:
                h.update(bytes.fromhex(d))
            fingerprint = "content:" + h.hexdigest()
        infos = []
        for t, dt, p, digest in zip(ckpt.tensors, out_dtypes, placements, digests, strict=True):
            info = TensorInfo(
                name=t.name,
                dtype=dt.torch,
                shape=t.shape,
                stride=_contiguous_stride(t.shape),
                segment=p.segment,
                offset=p.offset,
                nbytes=p.nbytes,
                digest=digest,
            )
            infos.append(info)
        infos += alias_entries(infos, model.aliases)
        key = self.key(model, fingerprint)
        segments = [
            SegmentInfo(index=i, nbytes=w.nbytes, backend=backend.name, device=instance)
            for i, w in enumerate(writers)
        ]
        manifest = Manifest(
            model=model.name,
            key=key,
            segments=segments,
            tensors=infos,
            total_bytes=sum(p.nbytes for p in placements),
            filled_at=time.time(),
            attrs={"digest": algorithm} if algorithm else {},
        )
        return FilledModel(
            manifest, fds, clock.total(), clock.phases, read_bytes=sum(t.nbytes for t in ckpt.tensors)
        )

    def _layout(self, model: SafetensorsModel, ckpt: Headers):
        """Each tensor's dtype as filled, its place, and the segments' sizes."""
        out_dtypes = [model.served_dtype(t.dtype) for t in ckpt.tensors]
        out_sizes = [math.prod(t.shape) * d.itemsize for t, d in zip(ckpt.tensors, out_dtypes, strict=True)]
        placements, seg_sizes = plan_layout(
            ((t.name, n) for t, n in zip(ckpt.tensors, out_sizes, strict=True)),
            model.segment_bytes,
            model.alignment,
        )
        return out_dtypes, placements, seg_sizes

    def planned_segments(self, model: SafetensorsModel) -> int:
        """How many segments a fill of ``model`` will make, from the
        checkpoint's headers alone (``check-config``'s fd-store budget)."""
        return len(self._layout(model, Checkpoint(model.path).headers())[2])

    def _copy_all(
        self, model, ckpt, out_dtypes, placements, writers, progress, backend, want_digest
    ) -> list[str]:
        """Copy every tensor; their xxh3 digests if ``want_digest`` (else "")."""
        tensors: list[StoredTensor] = ckpt.tensors
        digests = [""] * len(tensors)
        done = 0
        total = sum(t.nbytes for t in tensors)
        lock = threading.Lock()
        progress(0, total)

        def copy(run: list[int], fd: int) -> None:
            nonlocal done
            first = tensors[run[0]]
            w = writers[placements[run[0]].segment]
            hashers = [xxhash.xxh3_128() if want_digest else None for _ in run]
            if out_dtypes[run[0]] is not first.dtype:
                at = placements[run[0]].offset
                for piece in cast_pieces(fd, first, out_dtypes[run[0]]):
                    w.write_bytes(at, piece, hashers[0])
                    at += len(piece)
            elif len(run) == 1:
                p = placements[run[0]]
                got = w.write_from_file(fd, first.data_start, p.offset, first.nbytes, hashers[0])
                check_complete(first, got)
            else:
                pieces = [(placements[i].offset, tensors[i].nbytes) for i in run]
                got = w.write_run(fd, first.data_start, pieces, hashers)
                for i in run:  # name the first tensor the file ended inside
                    t = tensors[i]
                    check_complete(t, got - (t.data_start - first.data_start))
            for i, h in zip(run, hashers, strict=True):
                digests[i] = h.hexdigest() if h is not None else ""
            with lock:
                done += sum(tensors[i].nbytes for i in run)
                progress(done, total)

        def stream(runs: list[list[int]]) -> None:
            # A stream reads its stretch of the checkpoint front to back
            # through fds of its own, so the kernel's readahead sees one
            # sequential reader per thread rather than interleaved chunks.
            with OpenFiles(sequential=True) as files:
                for run in runs:
                    copy(run, files.fd(tensors[run[0]].file))

        cast = [d is not t.dtype for d, t in zip(out_dtypes, tensors, strict=True)]
        runs = _runs(tensors, placements, cast, backend.run_bytes)
        sizes = [sum(tensors[i].nbytes for i in r) for r in runs]
        streams = _split_streams(runs, sizes, model.reader_count(backend.auto_readers))
        with concurrent.futures.ThreadPoolExecutor(len(streams) or 1) as pool:
            for _ in pool.map(stream, streams):
                pass
        return digests


def _digests_after_fill(placements: list, writers: list) -> list[str]:
    """Each placed tensor's digest as its segment's backend computes it over
    the filled memory: one call per segment."""
    by_segment: dict[int, list[int]] = {}
    for i, p in enumerate(placements):
        by_segment.setdefault(p.segment, []).append(i)
    digests = [""] * len(placements)
    for seg, members in by_segment.items():
        spans = [(placements[i].offset, placements[i].nbytes) for i in members]
        for i, d in zip(members, writers[seg].digest_spans(spans), strict=True):
            digests[i] = d
    return digests


def _split_streams(runs: list[list[int]], sizes: list[int], count: int) -> list[list[list[int]]]:
    """Cut the runs, in file order, into ``count`` stretches of about equal bytes."""
    target = max(1, sum(sizes) // max(count, 1))
    streams: list[list[list[int]]] = [[]]
    filled = 0
    for run, size in zip(runs, sizes, strict=True):
        if filled >= target and len(streams) < count:
            streams.append([])
            filled = 0
        streams[-1].append(run)
        filled += size
    return [s for s in streams if s]


# Tensors per run at most (each is one iovec, and IOV_MAX is 1024).
MAX_RUN_TENSORS = 512


def _runs(tensors: list[StoredTensor], placements: list, cast: list[bool], limit: int) -> list[list[int]]:
    """Group tensors stored back to back in one file and placed in one segment
    into runs of at most ``limit`` bytes (the backend's ``run_bytes``), each
    copied with a single read."""
    runs: list[list[int]] = []
    cur: list[int] = []
    cur_bytes = 0
    for i, t in enumerate(tensors):
        if cast[i] or t.nbytes >= limit:
            if cur:
                runs.append(cur)
                cur, cur_bytes = [], 0
            runs.append([i])
            continue
        if cur:
            prev = tensors[cur[-1]]
            if (
                t.file != prev.file
                or placements[i].segment != placements[cur[-1]].segment
                or t.data_start != prev.data_start + prev.nbytes
                or cur_bytes + t.nbytes > limit
                or len(cur) >= MAX_RUN_TENSORS
            ):
                runs.append(cur)
                cur, cur_bytes = [], 0
        cur.append(i)
        cur_bytes += t.nbytes
    if cur:
        runs.append(cur)
    return runs


LOADER = SafetensorsLoader()
