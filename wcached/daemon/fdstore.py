"""Filled segments kept in systemd's file descriptor store across restarts.

As soon as a model is filled, a sealed memfd holding a :class:`StoredModel`
record (the manifest, the model's parsed table, the checkpoint files' stat
stamps) goes to the store (``FDSTORE=1``), then every segment fd, each under
a name that says which model and part it is. The record goes first: a store
that systemd cuts short (``FileDescriptorStoreMax=``) or a daemon killed while
storing leaves a record whose segments are incomplete, which the next start
names and refills. With ``FileDescriptorStorePreserve=yes`` systemd keeps the
store through crashes, restarts, upgrades, failed starts and stops, and hands
it back as ``LISTEN_FDS``/``LISTEN_FDNAMES``; ``systemctl clean --what=fdstore``
frees it. The memory lives as long as any fd does, so the store, not the
daemon process, is what keeps it.

The store has a budget: systemd takes at most ``FileDescriptorStoreMax=`` fds
(told to the service as ``$FDSTORE``) and refuses the rest with a line in its
own log only. :class:`FdStore` counts what its models hold and stores none of
a model that would not fit, saying why (:class:`NotKept`).
"""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass, field
from urllib.parse import quote, unquote

import msgspec

from wcached.daemon.systemd import Notifier, fdstore_limit
from wcached.loaders.checkpoint import FileStamp
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
    phases: dict[str, float] = {}
    read_bytes: int = 0


def fd_name(model: str, part: str) -> str:
    # FDNAME= forbids ':' (LISTEN_FDNAMES' separator), which model names may hold.
    return f"{PREFIX}/{quote(model, safe='._-')}/{part}"


def parse_fd_name(name: str) -> tuple[str, str] | None:
    parts = name.split("/")
    if len(parts) != 3 or parts[0] != PREFIX:
        return None
    return unquote(parts[1]), parts[2]


def listen_fds(env: dict[str, str] | None = None) -> list[tuple[str, int]]:
    """The fds systemd passed to this process, with their names
    (sd_listen_fds_with_names), in the order passed.

    The variables are removed so that no child (the loader worker) takes them
    for its own; the fds are made close-on-exec for the same reason.
    """
    env = os.environ if env is None else env
    try:
        pid = int(env.get("LISTEN_PID", "0"))
        count = int(env.get("LISTEN_FDS", "0"))
    except ValueError:
        pid, count = 0, 0
    # Without LISTEN_FDNAMES every fd is "unknown" (sd_listen_fds_with_names).
    names = env["LISTEN_FDNAMES"].split(":") if "LISTEN_FDNAMES" in env else []
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(var, None)
    if pid != os.getpid() or count <= 0:
        return []
    found: list[tuple[str, int]] = []
    for i in range(count):
        fd = LISTEN_FDS_START + i
        try:
            fcntl.fcntl(fd, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
        except OSError:
            continue
        found.append((names[i] if i < len(names) else "unknown", fd))
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
    # A name the store holds twice (a removal that did not reach systemd,
    # then a refill): which fd is whose cannot be told, so none is served.
    duplicated: str = ""

    def close_record(self) -> None:
        if self.record_fd is not None:
            os.close(self.record_fd)
            self.record_fd = None

    def close(self) -> None:
        fds = list(self.segment_fds.values())
        if self.record_fd is not None:
            fds.append(self.record_fd)
        close_fds(fds)
        self.record_fd = None
        self.segment_fds = {}


def group_by_model(fds: list[tuple[str, int]]) -> tuple[dict[str, StoredEntry], list[str]]:
    """Stored fds by model; names this daemon does not know come back to be
    removed from the store (their fds are closed here)."""
    entries: dict[str, StoredEntry] = {}
    unknown: list[str] = []
    for name, fd in fds:
        parsed = parse_fd_name(name)
        part = parsed[1] if parsed else ""
        seg = part[3:] if part.startswith("seg") else ""
        if parsed is None or not (part == MANIFEST_PART or seg.isdigit()):
            os.close(fd)
            if name not in unknown:
                unknown.append(name)
            continue
        entry = entries.setdefault(parsed[0], StoredEntry(parsed[0]))
        if name in entry.names:
            os.close(fd)
            entry.duplicated = name
            continue
        entry.names.append(name)
        if part == MANIFEST_PART:
            entry.record_fd = fd
        else:
            entry.segment_fds[int(seg)] = fd
    return entries, unknown


# The unit's FileDescriptorStoreMax=: the budget where systemd does not say
# ($FDSTORE is set by systemd 254 and later).
UNIT_FDSTORE_MAX = 4096


class NotKept(Exception):
    """A model was not (wholly) stored; the message says why and what fixes it."""


def fds_needed(segments: int) -> int:
    """Store entries one model takes: its segments and its record."""
    return segments + 1


class FdStore:
    """The daemon's side of the store: what each model holds there, within
    the budget systemd allows."""

    def __init__(self, notifier: Notifier, limit: int | None = None):
        self.notifier = notifier
        told = fdstore_limit()
        self.limit = limit if limit is not None else told if told is not None else UNIT_FDSTORE_MAX
        self.limit_source = "$FDSTORE" if limit is None and told is not None else "FileDescriptorStoreMax="
        self._held: dict[str, list[str]] = {}  # model -> its names in the store

    @property
    def enabled(self) -> bool:
        return self.notifier.enabled and self.limit > 0

    @property
    def used(self) -> int:
        return sum(len(names) for names in self._held.values())

    def holds(self, model: str) -> bool:
        return model in self._held

    def adopt(self, model: str, names: list[str]) -> None:
        """Entries found in the store at start and left there."""
        self._held[model] = list(names)

    def store(self, record: StoredModel, segment_fds: list[int]) -> None:
        """The record, then the segments; :class:`NotKept` if the budget has
        no room (nothing is sent) or a send failed (what was sent is removed)."""
        model = record.manifest.model
        if self.holds(model):
            self.remove_model(model)
        need = fds_needed(len(segment_fds))
        free = self.limit - self.used
        if need > free:
            raise NotKept(
                f"it needs {need} fds in systemd's fd store ({len(segment_fds)} segments and a record), "
                f"and {free} of the {self.limit} the unit allows ({self.limit_source}) are free; "
                f"{_budget_fix(record.manifest.total_bytes, free)}"
            )
        names = [fd_name(model, MANIFEST_PART)] + [fd_name(model, f"seg{i}") for i in range(len(segment_fds))]
        rfd = write_record(record)
        try:
            sent: list[str] = []
            for name, fd in zip(names, [rfd, *segment_fds], strict=True):
                if not self.notifier.notify("FDSTORE=1", f"FDNAME={name}", fds=[fd], wait=True):
                    self._send_removals(sent)
                    raise NotKept(f"systemd's notify socket did not take {name} (see the lines above)")
                sent.append(name)
        finally:
            os.close(rfd)
        self._held[model] = names

    def remove_model(self, model: str) -> None:
        """Everything ``model`` holds in the store leaves it (once
        systemd closes its copies, the memory is freed). Names whose removal
        did not reach systemd stay counted: they are still there."""
        left = self._send_removals(self._held.pop(model, []))
        if left:
            self._held[model] = left

    def remove(self, names: list[str]) -> None:
        """Entries of no configured model (unknown names, leftovers)."""
        self._send_removals(names)

    def _send_removals(self, names: list[str]) -> list[str]:
        """The names whose removal could not be sent."""
        return [n for n in names if not self.notifier.notify("FDSTOREREMOVE=1", f"FDNAME={n}", wait=True)]


def _budget_fix(total_bytes: int, free: int) -> str:
    """The two fixes, with a segment_size that would fit."""
    room = max(free - 1, 1)
    per_segment = -(-total_bytes // room)
    size = 1 << 20
    while size < per_segment:
        size <<= 1
    human = f"{size >> 30}GiB" if size >= 1 << 30 else f"{size >> 20}MiB"
    return (
        f'fix: segment_size = "{human}" or larger for this model, or a drop-in with a larger '
        f"FileDescriptorStoreMax= (systemctl edit wcached@<instance>)"
    )
