"""Filled segments kept in systemd's file descriptor store across restarts.

Once a model is filled, every segment fd goes to the store (``FDSTORE=1``)
under a name that says which model and segment it is, then a sealed memfd
holding a :class:`StoredModel` record (the manifest, the model's config, the
checkpoint files' stat stamps). The record goes last, so a daemon killed while
storing leaves segments without a record, which the next start drops. With
``FileDescriptorStorePreserve=restart`` systemd keeps the store across a
crash, ``systemctl restart`` and a package upgrade, and hands it back as
``LISTEN_FDS``/``LISTEN_FDNAMES``; the next start serves what still matches
without reading a checkpoint byte. The memory lives as long as any fd does,
so the store, not the daemon process, is what keeps it.
"""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

import msgspec

from wcached.daemon.systemd import Notifier
from wcached.memory.host import REQUIRED_SEALS
from wcached.protocol.messages import Manifest
from wcached.protocol.wire import close_fds

log = logging.getLogger("wcached.fdstore")

# Bumped whenever StoredModel changes incompatibly: a record of another format
# is dropped and its model refilled, never guessed at.
FORMAT = 1
PREFIX = "wcache1"
MANIFEST_PART = "manifest"
# sd_listen_fds(3): passed fds start here.
LISTEN_FDS_START = 3


class FileStamp(msgspec.Struct, frozen=True, array_like=True):
    """What stat(2) says of one checkpoint file: free to compute, and changed
    by any rewrite (a new inode, a new size or a new modification time)."""

    path: str
    dev: int
    ino: int
    size: int
    mtime_ns: int


class StoredModel(msgspec.Struct, frozen=True, kw_only=True):
    format: int
    daemon_version: str
    instance: str
    # The [[model]] table the fill ran with (ranks in canonical ids).
    config: dict
    # The loader's environment (the worker's vLLM release; empty otherwise).
    environment: str
    checkpoint: list[FileStamp]
    manifest: Manifest
    fill_seconds: float


def fd_name(model: str, part: str) -> str:
    # FDNAME= forbids ':' (LISTEN_FDNAMES' separator), which model names may hold.
    return f"{PREFIX}/{quote(model, safe='._-')}/{part}"


def parse_fd_name(name: str) -> tuple[str, str] | None:
    parts = name.split("/")
    if len(parts) != 3 or parts[0] != PREFIX:
        return None
    return unquote(parts[1]), parts[2]


def listen_fds(env: dict[str, str] | None = None) -> dict[str, int]:
    """The fds systemd passed to this process, by name (sd_listen_fds_with_names).

    The variables are removed so that no child (the loader worker) takes them
    for its own; the fds are made close-on-exec for the same reason.
    """
    env = os.environ if env is None else env
    try:
        pid = int(env.get("LISTEN_PID", "0"))
        count = int(env.get("LISTEN_FDS", "0"))
    except ValueError:
        pid, count = 0, 0
    names = env.get("LISTEN_FDNAMES", "").split(":")
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(var, None)
    if pid != os.getpid() or count <= 0:
        return {}
    found: dict[str, int] = {}
    for i in range(count):
        fd = LISTEN_FDS_START + i
        try:
            fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
        except OSError:
            continue
        name = names[i] if i < len(names) else "unknown"
        if name in found:
            os.close(fd)  # two fds under one name: keep the first
            continue
        found[name] = fd
    return found


def write_record(record: StoredModel) -> int:
    """The record in a sealed memfd (what the store keeps must be an fd)."""
    data = msgspec.msgpack.encode(record)
    fd = os.memfd_create(f"wcache:{record.manifest.model}:record", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, REQUIRED_SEALS | fcntl.F_SEAL_SEAL)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_record(fd: int) -> StoredModel:
    """Raises ValueError naming what is wrong with a stored record."""
    size = os.fstat(fd).st_size
    if size > 1 << 30:
        raise ValueError(f"record of {size} bytes")
    data = os.pread(fd, size, 0)
    try:
        head = msgspec.msgpack.decode(data, type=dict)
    except msgspec.DecodeError as e:
        raise ValueError(f"unreadable record: {e}") from None
    if head.get("format") != FORMAT:
        raise ValueError(f"record format {head.get('format')!r}, this daemon reads {FORMAT}")
    try:
        return msgspec.msgpack.decode(data, type=StoredModel)
    except msgspec.DecodeError as e:
        raise ValueError(f"unreadable record: {e}") from None


@dataclass
class StoredEntry:
    """The fds stored under one model's names."""

    model: str
    record_fd: int | None = None
    segment_fds: dict[int, int] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)

    def close(self) -> None:
        fds = list(self.segment_fds.values())
        if self.record_fd is not None:
            fds.append(self.record_fd)
        close_fds(fds)
        self.record_fd = None
        self.segment_fds = {}


def group_by_model(fds: dict[str, int]) -> tuple[dict[str, StoredEntry], list[str]]:
    """Stored fds by model; names this daemon does not know come back to be
    removed from the store (their fds are closed here)."""
    entries: dict[str, StoredEntry] = {}
    unknown: list[str] = []
    for name, fd in fds.items():
        parsed = parse_fd_name(name)
        part = parsed[1] if parsed else ""
        seg = part[3:] if part.startswith("seg") else ""
        if parsed is None or not (part == MANIFEST_PART or seg.isdigit()):
            os.close(fd)
            unknown.append(name)
            continue
        entry = entries.setdefault(parsed[0], StoredEntry(parsed[0]))
        entry.names.append(name)
        if part == MANIFEST_PART:
            entry.record_fd = fd
        else:
            entry.segment_fds[int(seg)] = fd
    return entries, unknown


class FdStore:
    """The daemon's side of the store: add a model, remove names."""

    def __init__(self, notifier: Notifier):
        self.notifier = notifier

    @property
    def enabled(self) -> bool:
        return self.notifier.enabled

    def store(self, record: StoredModel, segment_fds: list[int]) -> bool:
        """Segments first, the record last; False if systemd took not all of it."""
        model = record.manifest.model
        for i, fd in enumerate(segment_fds):
            if not self.notifier.notify(
                "FDSTORE=1", f"FDNAME={fd_name(model, f'seg{i}')}", fds=[fd], wait=True
            ):
                return False
        rfd = write_record(record)
        try:
            return self.notifier.notify(
                "FDSTORE=1", f"FDNAME={fd_name(model, MANIFEST_PART)}", fds=[rfd], wait=True
            )
        finally:
            os.close(rfd)

    def remove(self, names: list[str]) -> None:
        for name in names:
            self.notifier.notify("FDSTOREREMOVE=1", f"FDNAME={name}", wait=True)

    def remove_model(self, model: str, segments: int) -> None:
        self.remove([fd_name(model, MANIFEST_PART)] + [fd_name(model, f"seg{i}") for i in range(segments)])
