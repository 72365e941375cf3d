"""The safetensors loader: one file, a directory of shards, or an index.

Header parsing and byte copies need no torch: on the host-memory backend a
checkpoint goes from the page cache into sealed memfds with one ``preadv`` per
chunk. torch is imported only when the model's dtype policy casts tensors.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import hashlib
import json
import math
import os
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import xxhash

from wcached.dtypes import BY_TORCH_NAME, DTYPES, Dtype
from wcached.errors import CheckpointCorrupt, CheckpointMissing, FillError, FillMisconfigured
from wcached.keys import CacheKey
from wcached.loaders.base import ModelConfig
from wcached.loaders.layout import FilledModel, PhaseClock, alias_entries, fill_segments, plan_layout
from wcached.memory.base import MAX_RUN_BYTES, MemoryBackend, ProgressFn, preadv_full
from wcached.protocol.messages import Manifest, SegmentInfo, TensorInfo

INDEX_NAME = "model.safetensors.index.json"
# Per-tensor digests identify content and catch corruption; they are not a
# security boundary (sealed memfds and PROT_READ mappings are). xxh3 runs at
# memory speed, where blake2b capped a GPU fill at ~2.5 GB/s on 8 threads.
DIGEST_ALGORITHM = "xxh3_128"
# The format's own limit on the JSON header (safetensors MAX_HEADER_SIZE).
MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True)
class CheckpointFile:
    path: str
    size: int
    header: bytes
    # stat(2) of the file as read: a rewrite in place with the same header
    # (a fine-tune step, a re-export) changes the modification time, a copy
    # into place the inode. Device numbers are left out: they may differ
    # between an engine's mount namespace and the daemon's.
    ino: int = 0
    mtime_ns: int = 0


@dataclass(frozen=True)
class StoredTensor:
    name: str
    file: str
    dtype: Dtype
    shape: tuple[int, ...]
    data_start: int  # absolute offset in the file
    nbytes: int


@dataclass(frozen=True)
class Checkpoint:
    root: str
    files: list[CheckpointFile]
    tensors: list[StoredTensor]  # in file order, then offset order


def _find_index(path: str) -> Path | None:
    p = Path(path)
    if p.is_file() and p.name.endswith(".index.json"):
        return p
    if p.is_dir() and (p / INDEX_NAME).is_file():
        return p / INDEX_NAME
    return None


def _load_weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointCorrupt(f"{index}: not a safetensors index ({e})") from None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointCorrupt(f"{index}: weight_map is empty or not a table")
    return weight_map


def _shards(index: Path, weight_map: dict[str, str]) -> list[str]:
    files = [str(index.parent / n) for n in sorted(set(weight_map.values()))]
    for f in files:
        if not os.path.isfile(f):
            raise CheckpointCorrupt(f"{index}: shard {f} does not exist")
    return files


def checkpoint_files(path: str) -> list[str]:
    """The safetensors files of a checkpoint path (file, directory or index)."""
    index = _find_index(path)
    if index is not None:
        return _shards(index, _load_weight_map(index))
    p = Path(path)
    if p.is_file():
        return [str(p)]
    if not p.is_dir():
        raise CheckpointMissing(f"checkpoint {path} does not exist")
    files = sorted(str(f) for f in p.glob("*.safetensors"))
    if not files:
        raise FillMisconfigured(f"checkpoint directory {path} holds no *.safetensors files")
    return files


def read_checkpoint(path: str) -> Checkpoint:
    """Parse and validate every header; no tensor data is read."""
    index = _find_index(path)
    # The index is read once: it names the shards and is checked against them.
    weight_map = _load_weight_map(index) if index is not None else None
    shards = _shards(index, weight_map) if index is not None else checkpoint_files(path)
    files: list[CheckpointFile] = []
    tensors: list[StoredTensor] = []
    seen: dict[str, str] = {}
    for file in shards:
        cf, stored = _read_header(file)
        files.append(cf)
        for t in stored:
            if t.name in seen:
                raise CheckpointCorrupt(f"{file}: tensor {t.name!r} is also stored in {seen[t.name]}")
            seen[t.name] = file
            tensors.append(t)
    for name, shard in (weight_map or {}).items():
        where = seen.get(name)
        if where is None:
            raise CheckpointCorrupt(f"{index}: tensor {name!r} is listed for {shard} but stored nowhere")
        if os.path.basename(where) != os.path.basename(shard):
            raise CheckpointCorrupt(f"{index}: tensor {name!r} is listed for {shard} but stored in {where}")
    if not tensors:
        raise FillMisconfigured(f"checkpoint {path} holds no tensors")
    return Checkpoint(str(path), files, tensors)


def _read_header(file: str) -> tuple[CheckpointFile, list[StoredTensor]]:
    try:
        with open(file, "rb") as f:
            st = os.fstat(f.fileno())
            size = st.st_size
            if size < 8:
                raise CheckpointCorrupt(f"{file}: truncated: {size} bytes, not even a header length")
            (hlen,) = struct.unpack("<Q", f.read(8))
            if hlen > MAX_HEADER_BYTES or 8 + hlen > size:
                raise CheckpointCorrupt(
                    f"{file}: truncated or corrupt: header of {hlen} bytes in a {size}-byte file"
                )
            header = f.read(hlen)
    except PermissionError:
        from wcached.daemon.lock import user_name

        user = user_name(os.geteuid())
        raise FillMisconfigured(f"{file} cannot be read by user {user!r} (the daemon's)") from None
    except OSError as e:
        raise FillError(f"{file}: cannot read: {e}") from None
    try:
        doc = json.loads(header)
    except ValueError as e:
        raise CheckpointCorrupt(f"{file}: corrupt header: {e}") from None
    if not isinstance(doc, dict):
        raise CheckpointCorrupt(f"{file}: corrupt header: not a JSON object")
    data_base = 8 + hlen
    stored: list[StoredTensor] = []
    for name, entry in doc.items():
        if name == "__metadata__":
            continue
        stored.append(_parse_entry(file, name, entry, data_base, size))
    stored.sort(key=lambda t: t.data_start)
    return CheckpointFile(file, size, header, st.st_ino, st.st_mtime_ns), stored


def _parse_entry(file: str, name: str, entry: object, data_base: int, size: int) -> StoredTensor:
    try:
        assert isinstance(entry, dict)
        dtype_name = entry["dtype"]
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(x) for x in entry["data_offsets"])
    except (AssertionError, KeyError, TypeError, ValueError):
        raise CheckpointCorrupt(f"{file}: tensor {name!r}: malformed header entry {entry!r}") from None
    dtype = DTYPES.get(dtype_name)
    if dtype is None:
        raise CheckpointCorrupt(f"{file}: tensor {name!r}: unsupported dtype {dtype_name!r}")
    if any(d < 0 for d in shape):
        raise CheckpointCorrupt(f"{file}: tensor {name!r}: negative dimension in shape {list(shape)}")
    nbytes = math.prod(shape) * dtype.itemsize
    if end - begin != nbytes or begin < 0:
        raise CheckpointCorrupt(
            f"{file}: tensor {name!r}: data_offsets [{begin}, {end}] hold {end - begin} bytes, "
            f"but {dtype_name}{list(shape)} needs {nbytes}"
        )
    if data_base + end > size:
        raise CheckpointCorrupt(
            f"{file}: truncated: tensor {name!r} needs bytes up to {data_base + end}, the file has {size}"
        )
    return StoredTensor(name, file, dtype, shape, data_base + begin, nbytes)


def header_fingerprint(ckpt: Checkpoint) -> str:
    """sha256 over file names, sizes, inodes, modification times and headers:
    cheap (no tensor byte is read), the same for the daemon and an engine, and
    changed whenever a tensor is added, removed, reshaped or retyped or a shard
    is rewritten or replaced."""
    h = hashlib.sha256()
    for cf in ckpt.files:
        name = os.path.basename(cf.path).encode()
        h.update(struct.pack("<QQQQQ", len(name), cf.size, cf.ino, cf.mtime_ns, len(cf.header)))
        h.update(name)
        h.update(cf.header)
    return h.hexdigest()


def checkpoint_fingerprint(path: str) -> str:
    """The header fingerprint of a checkpoint on disk, as clients compute it."""
    return header_fingerprint(read_checkpoint(path))


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
        content fingerprint, :func:`checkpoint_fingerprint`) and the cast."""
        return CacheKey(model=model.name, loader=self.name, fingerprint=fingerprint, dtype=model.dtype)

    def environment(self, model: ModelConfig, python: str) -> str:
        return ""  # the fill reads bytes; nothing else changes them

    def fill(
        self, model: SafetensorsModel, backend: MemoryBackend, instance: str, progress: ProgressFn
    ) -> FilledModel:
        clock = PhaseClock()
        ckpt = read_checkpoint(model.path)
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
        digests, writers, fds = fill_segments(
            backend,
            model.name,
            seg_sizes,
            clock,
            lambda writers: self._copy_all(model, ckpt, out_dtypes, placements, writers, progress),
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
            attrs={"digest": DIGEST_ALGORITHM} if model.digest or model.fingerprint == "content" else {},
        )
        return FilledModel(manifest, fds, clock.total(), clock.phases)

    def _layout(self, model: SafetensorsModel, ckpt: Checkpoint):
        """Each tensor's dtype as filled, its place, and the segments' sizes."""
        out_dtypes = [self._out_dtype(model, t.dtype) for t in ckpt.tensors]
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
        return len(self._layout(model, read_checkpoint(model.path))[2])

    @staticmethod
    def _out_dtype(model: ModelConfig, stored: Dtype) -> Dtype:
        if model.dtype == "auto" or not stored.castable:
            return stored
        return BY_TORCH_NAME[model.dtype]

    def _copy_all(self, model, ckpt, out_dtypes, placements, writers, progress) -> list[str]:
        want_digest = model.digest or model.fingerprint == "content"
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
                w.write_bytes(placements[run[0]].offset, _cast(fd, first, out_dtypes[run[0]]), hashers[0])
            elif len(run) == 1:
                p = placements[run[0]]
                got = w.write_from_file(fd, first.data_start, p.offset, first.nbytes, hashers[0])
                _check_complete(first, got)
            else:
                pieces = [(placements[i].offset, tensors[i].nbytes) for i in run]
                got = w.write_run(fd, first.data_start, pieces, hashers)
                for i in run:  # name the first tensor the file ended inside
                    t = tensors[i]
                    _check_complete(t, got - (t.data_start - first.data_start))
            for i, h in zip(run, hashers, strict=True):
                digests[i] = h.hexdigest() if h is not None else ""
            with lock:
                done += sum(tensors[i].nbytes for i in run)
                progress(done, total)

        def stream(runs: list[list[int]]) -> None:
            # A stream reads its stretch of the checkpoint front to back
            # through fds of its own, so the kernel's readahead sees one
            # sequential reader per thread rather than interleaved chunks.
            fds: dict[str, int] = {}
            try:
                for run in runs:
                    path = tensors[run[0]].file
                    fd = fds.get(path)
                    if fd is None:
                        fd = fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
                    copy(run, fd)
            finally:
                for fd in fds.values():
                    os.close(fd)

        cast = [d is not t.dtype for d, t in zip(out_dtypes, tensors, strict=True)]
        runs = _runs(tensors, placements, cast)
        streams = _split_streams(runs, [sum(tensors[i].nbytes for i in r) for r in runs], model.reader_count)
        with concurrent.futures.ThreadPoolExecutor(len(streams) or 1) as pool:
            for _ in pool.map(stream, streams):
                pass
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


def _check_complete(t: StoredTensor, got: int) -> None:
    if got < t.nbytes:
        raise CheckpointCorrupt(
            f"{t.file}: truncated: tensor {t.name!r} ended after {max(got, 0)} of {t.nbytes} bytes"
        )


# Tensors per run at most (each is one iovec, and IOV_MAX is 1024).
MAX_RUN_TENSORS = 512


def _runs(tensors: list[StoredTensor], placements: list, cast: list[bool]) -> list[list[int]]:
    """Group tensors stored back to back in one file and placed in one segment
    into runs of at most MAX_RUN_BYTES, each copied with a single read."""
    runs: list[list[int]] = []
    cur: list[int] = []
    cur_bytes = 0
    for i, t in enumerate(tensors):
        if cast[i] or t.nbytes >= MAX_RUN_BYTES:
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
                or cur_bytes + t.nbytes > MAX_RUN_BYTES
                or len(cur) >= MAX_RUN_TENSORS
            ):
                runs.append(cur)
                cur, cur_bytes = [], 0
        cur.append(i)
        cur_bytes += t.nbytes
    if cur:
        runs.append(cur)
    return runs


def _cast(fd: int, t: StoredTensor, out: Dtype) -> memoryview:
    import torch

    raw = bytearray(t.nbytes)
    # Read until whole: one read returns at most 2,147,479,552 bytes on
    # Linux, and large embeddings are bigger than that.
    _check_complete(t, preadv_full(fd, [memoryview(raw)], t.data_start))
    if t.nbytes == 0:
        return memoryview(b"")
    src = torch.frombuffer(raw, dtype=getattr(torch, t.dtype.torch))
    dst = src.to(getattr(torch, out.torch)).contiguous()
    return memoryview(ctypes.string_at(dst.data_ptr(), dst.numel() * dst.element_size()))


LOADER = SafetensorsLoader()
