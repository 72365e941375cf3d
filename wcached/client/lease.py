"""Keeping attachments' leases across daemon restarts: one watcher a process.

The daemon never writes to an attached connection, so the connection becoming
readable means it ended: the daemon stopped, crashed or restarted. The memory
does not go with it (the mappings belong to this process, and systemd's fd
store keeps the daemon's fds), so the watcher attaches again as soon as a
daemon answers. If the new daemon holds the very same fill (restored from the
store: same manifest), the new connection becomes the lease and the tensors
stay as they are; if it holds another fill, this process keeps its weights
without a lease and says so once.

One thread watches every attachment of the process (an engine holds a target
and a draft, on several instances), blocked in ``select`` on their sockets and
a wake pipe, never polling. A daemon that goes away is logged at info (a
restart is routine); a warning comes only if it is not back within
:data:`WARN_AFTER_S`. Until it is back, anything that says "not now" (no
socket, refused, busy, a timeout, a connection cut mid-greeting) is retried
with a growing delay; only an answer that can never change by waiting (another
fill, an unknown or released model, no permission, an incompatible protocol)
ends the watch.
"""

from __future__ import annotations

import logging
import os
import selectors
import socket
import threading
import time
from typing import TYPE_CHECKING

from wcached.errors import (
    Busy,
    DaemonUnavailable,
    KeyMismatch,
    ProtocolError,
    TimeoutExpired,
    VersionMismatch,
    WcacheError,
)
from wcached.protocol.wire import close_fds

if TYPE_CHECKING:
    from wcached.client.attach import Attachment
    from wcached.client.connection import DaemonConnection

log = logging.getLogger("wcached.client")

FIRST_RETRY_S = 0.05
RETRY_MAX_S = 2.0
# A daemon away this long is no routine restart any more: warn (once).
WARN_AFTER_S = 30.0
# Each attempt to attach again, at most (connect, hello, attach).
REATTACH_TIMEOUT_S = 5.0


def _transient(e: BaseException) -> bool:
    """A failure that a daemon coming back makes go away."""
    if isinstance(e, VersionMismatch):
        return False
    return isinstance(e, (OSError, DaemonUnavailable, TimeoutExpired, ProtocolError, Busy))


class LeaseWatch:
    """One attachment's lease, as the process-wide watcher follows it."""

    def __init__(self, attachment: Attachment, expect: dict[str, str | int], client: str | None):
        self.attachment = attachment
        self.expect = dict(expect)
        self.client = client
        self.reattached = 0
        self.lost_at: float | None = None  # when the daemon ended the lease
        self.retry_at = 0.0
        self.delay = FIRST_RETRY_S
        self.warned = False
        self.stopped = False
        # Followed by the watcher: False once stopped or given up.
        self.watching = True
        _Watcher.get().add(self)

    @staticmethod
    def prepare() -> None:
        """Start the process's watcher thread now if it is not running (an
        attach calls this before it waits on the daemon, so the thread's
        start-up overlaps that wait)."""
        _Watcher.get()

    @property
    def name(self) -> str:
        return self.attachment.manifest.model

    def stop(self) -> None:
        self.stopped = True
        _Watcher.get().remove(self)

    # -- called by the watcher thread -------------------------------------------

    def ended(self) -> bool | None:
        """Whether the daemon ended the connection; None if it wrote to it
        (which it never does: the watch ends, the connection stays the lease)."""
        sock = self.attachment.connection.sock
        try:
            data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        except OSError:
            return True
        if data:
            log.warning(
                "wcached: the daemon at %s wrote to an attached connection; no longer watching the lease",
                self.attachment.connection.path,
            )
            return None
        return True

    def lost(self, now: float) -> None:
        self.lost_at = now
        self.retry_at = now + FIRST_RETRY_S
        self.delay = FIRST_RETRY_S
        self.warned = False
        log.info(
            "wcached: the daemon at %s ended the lease on %s (stopped or restarting); attaching again",
            self.attachment.connection.path,
            self.attachment.manifest.model,
        )

    def try_again(self, now: float) -> bool:
        """One attempt to attach again; True when the watch is over for this
        round (attached again, or given up), False to retry at ``retry_at``."""
        from wcached.client.connection import DaemonConnection

        name = self.attachment.manifest.model
        path = self.attachment.connection.path
        conn: DaemonConnection | None = None
        try:
            # Short: one daemon slow to come back must not hold up the
            # process's other leases, which this same thread follows.
            timeout = min(self.attachment.connection.timeout, REATTACH_TIMEOUT_S)
            conn = DaemonConnection(path, timeout=timeout, client=self.client)
            try:
                manifest, fds = conn.attach(name, self.expect)
                close_fds(fds)  # the memory mapped at the first attach is what the lease keeps
                same = manifest == self.attachment.manifest
            except KeyMismatch:
                same = False  # another fill: said below, no retry fixes it
        except (OSError, WcacheError) as e:
            if conn is not None:
                conn.close()
            if _transient(e):
                self._not_back_yet(now, path, name, e)
                return False
            log.warning(
                "wcached: cannot attach to %s again (%s); keeping the weights without a lease", name, e
            )
            return True
        if not same:
            conn.close()
            log.warning(
                "wcached: the daemon at %s now holds another fill of %s; this process keeps its "
                "weights without a lease (attach again to use the new fill)",
                path,
                name,
            )
            return True
        if not self.attachment.replace_connection(conn):
            conn.close()
            return True
        self.reattached += 1
        away = now - (self.lost_at or now)
        self.lost_at = None
        log.log(
            logging.WARNING if self.warned else logging.INFO,
            "wcached: attached again to %s at %s after %.1f s: the same memory, tensors unchanged",
            name,
            path,
            away,
        )
        return True

    def _not_back_yet(self, now: float, path: str, name: str, e: BaseException) -> None:
        self.retry_at = time.monotonic() + self.delay
        self.delay = min(RETRY_MAX_S, self.delay * 2)
        if not self.warned and self.lost_at is not None and now - self.lost_at >= WARN_AFTER_S:
            self.warned = True
            log.warning(
                "wcached: the daemon at %s is not back after %.0f s (%s); this process keeps its "
                "weights of %s and attaches again when it is",
                path,
                now - self.lost_at,
                e,
                name,
            )


class _Watcher:
    """The process's one watcher thread, started with its first lease."""

    _instance: _Watcher | None = None
    _instance_lock = threading.Lock()

    @classmethod
    def get(cls) -> _Watcher:
        with cls._instance_lock:
            inst = cls._instance
            if inst is None or inst._pid != os.getpid() or not inst._thread.is_alive():
                # (A forked child gets a watcher of its own.)
                cls._instance = cls()
            return cls._instance

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._leases: list[LeaseWatch] = []
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # epoll, not select(): an engine holds many fds, and select() cannot
        # watch one numbered 1024 or above. Registered and unregistered under
        # _lock only (select() itself runs without it).
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._run, name="wcached-leases", daemon=True)
        self._thread.start()

    def add(self, lease: LeaseWatch) -> None:
        with self._lock:
            self._leases.append(lease)
        self._wake()

    def remove(self, lease: LeaseWatch) -> None:
        """Stop following ``lease``; its socket is no longer watched when this
        returns. Attachment.close calls it before it closes the socket: epoll
        forgets a socket only when told to while its fd is open (or once no
        process holds it: a forked child may), and a socket it kept watching
        past its close would wake the watcher in a loop once the daemon ends
        the connection."""
        with self._lock:
            if lease in self._leases:
                self._leases.remove(lease)
            lease.watching = False
            for key in list(self._sel.get_map().values()):
                if key.fd != self._wake_r and key.data[0] is lease:
                    self._sel.unregister(key.fd)
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # a wake-up is pending already

    def _run(self) -> None:
        failures = 0
        while True:
            try:
                self._round()
                failures = 0
            except Exception:
                # This thread follows every lease of the process: a bug in one
                # round must not end them all. Said once for a run of failed
                # rounds, which come ever less often (up to a second apart).
                failures += 1
                if failures == 1:
                    log.exception("wcached: the lease watcher failed; going on")
                time.sleep(min(1.0, 0.05 * failures))

    def _round(self) -> None:
        """Wait for a lease's connection to end or a lost lease to be due,
        and act on it."""
        # By fd: the lease and the very socket (a re-attached lease's new
        # socket may get the number its closed one had).
        watched: dict[int, tuple[LeaseWatch, socket.socket]] = {}
        # Under the lock: a lease stopped after this is unregistered by
        # remove() (before its socket closes), one stopped before is not here.
        with self._lock:
            leases = list(self._leases)
            for lease in leases:
                if lease.lost_at is None:
                    sock = lease.attachment.connection.sock
                    fd = sock.fileno()  # once: -1 for a closed socket
                    if fd >= 0:
                        watched[fd] = (lease, sock)
            gone = self._follow(self._sel, watched)
        for lease in gone:
            self._guarded(lease, self._check_ended)
        # Until the earliest lost lease is due (those just found gone too).
        now = time.monotonic()
        due = [max(0.0, lease.retry_at - now) for lease in leases if lease.lost_at is not None]
        timeout = min(due) if due else None
        # (A select() that fails is a failed round, which _run says and goes
        # on from.)
        for key, _ in self._sel.select(timeout):
            if key.fd == self._wake_r:
                try:
                    while os.read(self._wake_r, 64):
                        pass
                except BlockingIOError:
                    pass
                continue
            self._guarded(key.data[0], self._check_ended)
        now = time.monotonic()
        for lease in leases:
            if lease.stopped or lease.lost_at is None or lease.retry_at > now:
                continue
            self._guarded(lease, lambda lease, now=now: self._retry(lease, now))

    def _follow(
        self, sel: selectors.BaseSelector, watched: dict[int, tuple[LeaseWatch, socket.socket]]
    ) -> list[LeaseWatch]:
        """Make ``sel`` watch exactly the sockets of ``watched``; return the
        leases whose socket was closed before it could be watched."""
        for key in list(sel.get_map().values()):
            if key.fd == self._wake_r:
                continue
            now_there = watched.get(key.fd)
            if now_there is None or now_there[1] is not key.data[1]:
                sel.unregister(key.fd)  # (a closed fd's removal error is ignored)
        gone: list[LeaseWatch] = []
        for fd, data in watched.items():
            if fd in sel.get_map():
                continue
            try:
                sel.register(fd, selectors.EVENT_READ, data)
            except OSError:
                # EBADF: closed without remove() first (nothing in wcached
                # does); checked as a socket that reads as ended would be.
                gone.append(data[0])
        return gone

    def _check_ended(self, lease: LeaseWatch) -> None:
        if lease.stopped:
            return
        ended = lease.ended()
        if ended and not lease.stopped:  # (stopped meanwhile: closed by its engine)
            lease.lost(time.monotonic())
        elif ended is None:
            self.remove(lease)

    def _retry(self, lease: LeaseWatch, now: float) -> None:
        if lease.try_again(now) and lease.lost_at is not None:  # given up
            self.remove(lease)

    def _guarded(self, lease: LeaseWatch, step) -> None:
        """One lease's trouble ends its watch, never the watcher's."""
        try:
            step(lease)
        except Exception:
            log.exception("wcached: watching the lease on %s failed; no longer watching it", lease.name)
            self.remove(lease)
