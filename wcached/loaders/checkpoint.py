"""A checkpoint on disk: the one owner of what is known about it.

Which files make it, their stat stamps, which of them the daemon's user cannot
read and why, its fingerprints, its safetensors headers, and reading a
tensor's bytes (any size, without extra copies). The loaders, the filler,
restore (provenance), ``check-config``, ``doctor`` and ``verify`` ask a
:class:`Checkpoint`; none of them opens, lists or stats checkpoint files on
its own, so that "can the daemon read this checkpoint" and "which files make
it" have one answer.

Header parsing and byte reads need no torch; a cast imports it.
"""

from __future__ import annotations

import glob
import hashlib
import json
import math
import os
import stat
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from wcached import tensor_digest
from wcached.dtypes import DTYPES, Dtype
from wcached.errors import (
    CheckpointCorrupt,
    CheckpointMissing,
    CheckpointUnreadable,
    FillError,
    FillMisconfigured,
    TooManyFiles,
)
from wcached.memory.base import preadv_full

INDEX_NAME = "model.safetensors.index.json"
# The format's own limit on the JSON header (safetensors MAX_HEADER_SIZE).
MAX_HEADER_BYTES = 100_000_000
# Beyond this many files a path is not a checkpoint (a mount point given by
# mistake) and is not walked further.
MAX_FILES = 100_000
# A tensor is read (and cast, and hashed) in pieces of at most this many
# bytes: one read(2) returns at most 2,147,479,552 bytes on Linux, and a
# piece bounds the host memory a cast holds. A multiple of every itemsize.
READ_CHUNK = 64 << 20
# Bytes read from each end of a file whose format has no header to hash.
SAMPLE_BYTES = 1 << 20


class FileStamp(msgspec.Struct, frozen=True, array_like=True):
    """What stat(2) says of one checkpoint file: free to compute, and changed
    by any rewrite (a new inode, a new size or a new modification time)."""

    path: str
    dev: int
    ino: int
    size: int
    mtime_ns: int


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


class StoredTensor(msgspec.Struct, frozen=True):
    """One tensor a header lists. A struct, not a dataclass: a header of
    5,000 experts makes 5,000 of them, and a frozen dataclass's ``__init__``
    took 1.4 us each where this takes 0.2."""

    name: str
    file: str
    dtype: Dtype
    shape: tuple[int, ...]
    data_start: int  # absolute offset in the file
    nbytes: int


@dataclass(frozen=True)
class Headers:
    """Every safetensors header of a checkpoint, parsed and validated."""

    root: str
    files: list[CheckpointFile]
    tensors: list[StoredTensor]  # in file order, then offset order


def _user() -> str:
    from wcached.daemon.lock import user_name

    return user_name(os.geteuid())


class Checkpoint:
    """A checkpoint path (a file, a directory or a safetensors index), as the
    current user sees it. Nothing is read until asked."""

    def __init__(self, path: str | os.PathLike[str], hub_ok: bool = False) -> None:
        self.path = str(path)
        # A relative path a loader may resolve as a hub id (vLLM).
        self.is_hub_id = hub_ok and not os.path.isabs(self.path)

    @classmethod
    def of(cls, model) -> Checkpoint:
        """The checkpoint of a ``[[model]]`` table."""
        return cls(model.path, model.accepts_remote_path)

    # -- its files -----------------------------------------------------------

    def files(self) -> list[str]:
        """Every file of the checkpoint: the path itself, or each regular
        file under it (hidden entries left out: download tools keep lock
        files there). Raises :class:`CheckpointMissing` (not there: a mount
        not up yet, retried) or :class:`CheckpointUnreadable` (this user may
        not look)."""
        path = self.path
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise CheckpointMissing(f"checkpoint {path} does not exist (not mounted yet?)") from None
        except OSError as e:
            raise CheckpointUnreadable(
                f"checkpoint {path} cannot be read by user {_user()!r} "
                f"({e.strerror}: can it search every directory above it?)"
            ) from None
        if not stat.S_ISDIR(st.st_mode):
            return [path]
        files: list[str] = []

        def cannot_list(e: OSError) -> None:
            raise CheckpointUnreadable(
                f"checkpoint directory {e.filename} cannot be read by user {_user()!r} "
                f"({e.strerror}: it may not list it)"
            )

        for root, dirs, names in os.walk(path, onerror=cannot_list):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for n in sorted(names):
                if not n.startswith(".") and os.path.isfile(os.path.join(root, n)):
                    files.append(os.path.join(root, n))
            if len(files) > MAX_FILES:
                raise TooManyFiles(f"checkpoint {path} holds more than {MAX_FILES} files (not a checkpoint?)")
        return files

    def check_readable(self) -> None:
        """What the daemon's fill needs before it starts: the path is there
        and this user can open every file of it. The one test of it: serve
        runs it before a worker starts, ``check-config`` (as the daemon's
        user) and ``doctor`` report what it raises, word for word."""
        if self.is_hub_id:
            return  # the loader resolves it from its hub cache
        for f in self.files():
            try:
                # Opened, not access(2)-tested: ACLs, security modules and an
                # NFS server squashing root decide at open.
                fd = os.open(f, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
            except FileNotFoundError:
                raise CheckpointMissing(f"checkpoint file {f} vanished while it was checked") from None
            except OSError as e:
                raise CheckpointUnreadable(
                    f"checkpoint file {f} cannot be read by user {_user()!r} ({e.strerror})"
                ) from None
            os.close(fd)

    def stamps(self) -> list[FileStamp]:
        """Each file's stat stamp, named relative to the path; found without
        reading a byte. Raises as :meth:`files` does."""
        stamps = []
        for f in self.files():
            try:
                st = os.stat(f)
            except FileNotFoundError:
                raise CheckpointMissing(f"checkpoint file {f} vanished while it was stamped") from None
            except OSError as e:
                raise CheckpointUnreadable(f"cannot stat {f}: {e.strerror}") from None
            rel = os.path.relpath(f, self.path) if f != self.path else os.path.basename(f)
            stamps.append(FileStamp(rel, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
        return stamps

    # -- its safetensors -----------------------------------------------------

    def _index(self) -> Path | None:
        p = Path(self.path)
        if p.is_file() and p.name.endswith(".index.json"):
            return p
        if p.is_dir() and (p / INDEX_NAME).is_file():
            return p / INDEX_NAME
        return None

    def weight_files(self) -> list[str]:
        """The safetensors files: the index's shards, the directory's
        ``*.safetensors``, or the file itself."""
        index = self._index()
        if index is not None:
            return _shards(index, _load_weight_map(index))
        p = Path(self.path)
        if p.is_file():
            return [str(p)]
        if not p.is_dir():
            raise CheckpointMissing(f"checkpoint {self.path} does not exist (not mounted yet?)")
        files = sorted(str(f) for f in p.glob("*.safetensors"))
        if not files:
            raise FillMisconfigured(f"checkpoint directory {self.path} holds no *.safetensors files")
        return files

    def headers(self) -> Headers:
        """Parse and validate every header; no tensor data is read."""
        index = self._index()
        weight_map: dict[str, str] | None = None
        if index is None:
            shards = self.weight_files()
        else:
            # The index is read once: it names the shards and is checked against them.
            weight_map = _load_weight_map(index)
            shards = _shards(index, weight_map)
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
        # Each file's name once, not twice per tensor (5,000 tensors: ~3 ms).
        stored_as = {f: os.path.basename(f) for f in shards}
        listed_as = {s: os.path.basename(s) for s in set((weight_map or {}).values())}
        for name, shard in (weight_map or {}).items():
            where = seen.get(name)
            if where is None:
                raise CheckpointCorrupt(f"{index}: tensor {name!r} is listed for {shard} but stored nowhere")
            if stored_as[where] != listed_as[shard]:
                raise CheckpointCorrupt(
                    f"{index}: tensor {name!r} is listed for {shard} but stored in {where}"
                )
        if not tensors:
            raise FillMisconfigured(f"checkpoint {self.path} holds no tensors")
        return Headers(self.path, files, tensors)

    # -- its fingerprints ----------------------------------------------------

    def header_fingerprint(self) -> str:
        """The safetensors header fingerprint (:func:`header_fingerprint`)."""
        return header_fingerprint(self.headers())

    def fingerprint(self, other_patterns: Iterable[str] = ()) -> str:
        """What a checkpoint directory or file holds, however its path is
        spelled: the header fingerprint of a directory of safetensors; else
        names, sizes, stamps and sampled bytes of its files matching
        ``other_patterns`` (a loader's other weight formats), or of every
        file at its top; a single file sampled."""
        if os.path.isdir(self.path):
            top = glob.escape(self.path)
            if glob.glob(os.path.join(top, "*.safetensors")):
                return self.header_fingerprint()
            files = sorted({p for pat in other_patterns for p in glob.glob(os.path.join(top, pat))})
            if not files:
                files = sorted(e.path for e in os.scandir(self.path) if e.is_file())
            return "sampled:" + _sampled(files)
        return "sampled:" + _sampled([self.path])

    def content_digest(self) -> str:
        """``xxh3_128:<hex>`` over every byte of the safetensors files in name
        order (each file's name and size, then its bytes): ``fingerprint =
        "content"`` for loaders whose tensors are not the checkpoint's bytes,
        and what ``wcached verify`` recomputes to compare."""
        import xxhash

        h = xxhash.xxh3_128()
        buf = bytearray(READ_CHUNK)
        for f in sorted(self.weight_files()):
            with open(f, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                h.update(f"{os.path.basename(f)}:{size}\n".encode())
                while n := fh.readinto(buf):
                    h.update(memoryview(buf)[:n])
        return f"{tensor_digest.HOST}:{h.hexdigest()}"


def header_fingerprint(headers: Headers) -> str:
    """sha256 over file names, sizes, inodes, modification times and headers:
    cheap (no tensor byte is read), the same for the daemon and an engine, and
    changed whenever a tensor is added, removed, reshaped or retyped or a shard
    is rewritten or replaced."""
    h = hashlib.sha256()
    for cf in headers.files:
        name = os.path.basename(cf.path).encode()
        # A modification time may be before 1970: the one signed field.
        h.update(struct.pack("<QQQqQ", len(name), cf.size, cf.ino, cf.mtime_ns, len(cf.header)))
        h.update(name)
        h.update(cf.header)
    return h.hexdigest()


def _sampled(files: list[str]) -> str:
    h = hashlib.sha256()
    for path in files:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            name = os.path.basename(path).encode()
            # A modification time may be before 1970: the one signed field.
            h.update(struct.pack("<QQQq", len(name), st.st_size, st.st_ino, st.st_mtime_ns))
            h.update(name)
            h.update(f.read(SAMPLE_BYTES))
            # The tail is read whenever the head did not reach it (the two may overlap).
            if st.st_size > SAMPLE_BYTES:
                f.seek(-SAMPLE_BYTES, os.SEEK_END)
                h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def _load_weight_map(index: Path) -> dict[str, str]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except PermissionError:
        raise CheckpointUnreadable(f"checkpoint file {index} cannot be read by user {_user()!r}") from None
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
    except PermissionError as e:
        raise CheckpointUnreadable(
            f"checkpoint file {file} cannot be read by user {_user()!r} ({e.strerror})"
        ) from None
    except OSError as e:
        raise FillError(f"{file}: cannot read: {e}") from None
    data_base = 8 + hlen
    stored = _parse_header(file, header, data_base, size)
    stored.sort(key=lambda t: t.data_start)
    return CheckpointFile(file, size, header, st.st_ino, st.st_mtime_ns), stored


class _Entry(msgspec.Struct):
    """One header entry as a well-formed checkpoint writes it. Every field
    may be absent: ``__metadata__`` decodes as an entry of none."""

    dtype: str | None = None
    shape: tuple[int, ...] | None = None  # a tuple as decoded: no copy per tensor
    data_offsets: tuple[int, int] | None = None


_HEADER = msgspec.json.Decoder(dict[str, _Entry])


def _parse_header(file: str, header: bytes, data_base: int, size: int) -> list[StoredTensor]:
    """The tensors a header lists, validated. A well-formed header is decoded
    by msgspec into structs (5,000 tensors in a few milliseconds, where
    ``json`` and a dict per entry took tens); anything else (a value of
    another type, an entry missing a field, metadata shaped like an entry)
    goes through :func:`_parse_header_loosely`, which accepts what it always
    did and names what is wrong."""
    try:
        doc = _HEADER.decode(header)
        if not header.isascii():
            # msgspec skips what it does not decode (the metadata) without
            # checking its UTF-8; the format (and safetensors) refuses it.
            header.decode()  # UTF-8
    except (msgspec.DecodeError, UnicodeDecodeError):
        return _parse_header_loosely(file, header, data_base, size)
    stored: list[StoredTensor] = []
    for name, e in doc.items():
        if name == "__metadata__":
            continue
        if e.dtype is None or e.shape is None or e.data_offsets is None:
            return _parse_header_loosely(file, header, data_base, size)  # names the entry
        begin, end = e.data_offsets
        stored.append(_tensor(file, name, e.dtype, e.shape, begin, end, data_base, size))
    return stored


def _parse_header_loosely(file: str, header: bytes, data_base: int, size: int) -> list[StoredTensor]:
    """The header read as any JSON (numbers as strings or floats where
    ``int()`` takes them), each entry checked by hand."""
    try:
        # Decoded strictly first: json.loads guesses at bytes and lets surrogates through.
        doc = json.loads(header.decode())
    except (ValueError, RecursionError) as e:  # RecursionError: nested past Python's limit
        raise CheckpointCorrupt(f"{file}: corrupt header: {e}") from None
    if not isinstance(doc, dict):
        raise CheckpointCorrupt(f"{file}: corrupt header: not a JSON object")
    stored: list[StoredTensor] = []
    for name, entry in doc.items():
        if name == "__metadata__":
            continue
        stored.append(_parse_entry(file, name, entry, data_base, size))
    return stored


def _parse_entry(file: str, name: str, entry: object, data_base: int, size: int) -> StoredTensor:
    try:
        assert isinstance(entry, dict)
        dtype_name = entry["dtype"]
        shape = tuple(int(d) for d in entry["shape"])
        begin, end = (int(x) for x in entry["data_offsets"])
    except (AssertionError, KeyError, TypeError, ValueError, OverflowError):  # Overflow: int(1e400)
        raise CheckpointCorrupt(f"{file}: tensor {name!r}: malformed header entry {entry!r}") from None
    try:
        name.encode()  # json lets an escaped lone surrogate through; msgspec refuses it
    except UnicodeEncodeError:
        raise CheckpointCorrupt(f"{file}: tensor {name!r}: the name is not valid Unicode") from None
    return _tensor(file, name, dtype_name, shape, begin, end, data_base, size)


def _tensor(
    file: str,
    name: str,
    dtype_name: object,
    shape: tuple[int, ...],
    begin: int,
    end: int,
    data_base: int,
    size: int,
) -> StoredTensor:
    """One tensor of a header, held to the format's rules: a known dtype, no
    negative dimension, data offsets that hold exactly its bytes, inside the
    file. The one place those rules are written, whichever way it was decoded."""
    dtype = DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
    if dtype is None:
        raise CheckpointCorrupt(f"{file}: tensor {name!r}: unsupported dtype {dtype_name!r}")
    if shape and min(shape) < 0:
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


# -- a tensor's bytes ------------------------------------------------------------


def check_complete(t: StoredTensor, got: int) -> None:
    """A read of ``t`` that returned ``got`` bytes: the file ended early if short."""
    if got < t.nbytes:
        raise CheckpointCorrupt(
            f"{t.file}: truncated: tensor {t.name!r} ended after {max(got, 0)} of {t.nbytes} bytes"
        )


class OpenFiles:
    """A reader's fds of the checkpoint's files, each opened once when first
    asked for and closed together. ``sequential``: tell the kernel the file
    is read front to back (its readahead then sees one sequential reader)."""

    def __init__(self, sequential: bool = False) -> None:
        self.sequential = sequential
        self._fds: dict[str, int] = {}

    def fd(self, path: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except PermissionError as e:
                raise CheckpointUnreadable(
                    f"checkpoint file {path} cannot be read by user {_user()!r} ({e.strerror})"
                ) from None
            except FileNotFoundError:
                raise CheckpointMissing(f"checkpoint file {path} vanished while it was read") from None
            self._fds[path] = fd
            if self.sequential:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        return fd

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> OpenFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_pieces(fd: int, t: StoredTensor, chunk: int = READ_CHUNK) -> Iterator[memoryview]:
    """The bytes of ``t`` in order, in pieces of at most ``chunk`` bytes read
    into one reused buffer (a piece is valid until the next is asked for).
    Raises :class:`CheckpointCorrupt` naming file and tensor if the file ends
    early."""
    buf = memoryview(bytearray(min(chunk, t.nbytes)))
    done = 0
    while done < t.nbytes:
        want = min(len(buf), t.nbytes - done)
        got = preadv_full(fd, [buf[:want]], t.data_start + done)
        if got < want:
            check_complete(t, done + got)
        yield buf[:want]
        done += want


def cast_pieces(fd: int, t: StoredTensor, out: Dtype, chunk: int = READ_CHUNK) -> Iterator[memoryview]:
    """The bytes of ``t`` cast to ``out``, in order, a piece of at most
    ``chunk`` stored bytes at a time: a cast never holds the whole tensor
    (a 2 GiB embedding costs two pieces of host memory, not three copies)."""
    import ctypes

    import torch

    src_dtype, dst_dtype = getattr(torch, t.dtype.torch), getattr(torch, out.torch)
    for piece in read_pieces(fd, t, chunk):
        dst = torch.frombuffer(piece, dtype=src_dtype).to(dst_dtype)
        n = dst.numel() * dst.element_size()
        view = memoryview((ctypes.c_char * n).from_address(dst.data_ptr())).cast("B")
        try:
            yield view
        finally:
            view.release()
            del dst
