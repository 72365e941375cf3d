"""sd_notify over ``socket.sendmsg``: READY, STATUS, WATCHDOG, EXTEND_TIMEOUT, FDSTORE.

Send errors are logged, not hidden (the ``sdnotify`` package swallows them),
and fds travel with ``FDSTORE=1`` without another dependency.

One socket is shared by the main loop (STATUS=, WATCHDOG=1, EXTEND_TIMEOUT)
and by connection threads (a release's FDSTOREREMOVE), so no call may change
the socket's blocking mode or timeout under another: the socket stays
non-blocking for good and each kind of message decides what a full queue
means for it:

- progress (STATUS=, EXTEND_TIMEOUT_USEC=, WATCHDOG=1) never waits: a full
  queue keeps the newest status line pending, sent by the next call or by
  :meth:`Notifier.flush` from the main loop;
- state changes (READY=1, STOPPING=1, FDSTORE=1, FDSTOREREMOVE=1) are never
  dropped for a full queue: they wait for room (poll, up to
  :data:`STATE_SEND_TIMEOUT_S`), serialised by a lock so that a model's fds
  reach the store in the order sent. Only they take the lock, so STATUS=
  never waits behind a slow FDSTORE.
"""

from __future__ import annotations

import array
import errno
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Sequence

log = logging.getLogger("wcached.systemd")

# How long a state change waits for room in a full notify queue before it
# is given up on (and logged as an error).
STATE_SEND_TIMEOUT_S = 60.0


class Notifier:
    """Talks to ``$NOTIFY_SOCKET``; every call is a no-op without one."""

    def __init__(self, env: dict[str, str] | None = None):
        env = os.environ if env is None else env
        self.address = env.get("NOTIFY_SOCKET") or None
        self._sock: socket.socket | None = None
        self._connected = False
        if self.address:
            if self.address.startswith("@"):
                self.address = "\0" + self.address[1:]
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.setblocking(False)
            try:
                # Connected, poll() reports room in the receiver's queue
                # (an unconnected datagram socket is always "writable").
                self._sock.connect(self.address)
                self._connected = True
            except OSError as e:
                log.warning("cannot connect to the notify socket %s: %s", self.address, e)
        self.watchdog_interval = _watchdog_interval(env)
        self._last_ping = 0.0
        self._state_lock = threading.Lock()
        self._pending_status: str | None = None

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def notify(self, *fields: str, fds: Sequence[int] = (), wait: bool = False) -> bool:
        """Send one datagram; True once the receiver's queue took it.

        ``wait=False`` (progress) returns at once if the queue is full;
        ``wait=True`` (state changes) waits for room, see the module's
        docstring."""
        if self._sock is None:
            return False
        payload = "\n".join(fields).encode()
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())] if fds else []
        if not wait:
            return self._send(payload, anc, fields) is True
        with self._state_lock:
            deadline = time.monotonic() + STATE_SEND_TIMEOUT_S
            while True:
                sent = self._send(payload, anc, fields)
                if sent is not None:
                    return sent
                left = deadline - time.monotonic()
                if left <= 0:
                    log.error(
                        "sd_notify %r not sent: the notify socket's queue stayed full for %.0f s",
                        fields,
                        STATE_SEND_TIMEOUT_S,
                    )
                    return False
                self._wait_for_room(min(left, 0.5))

    def _send(self, payload: bytes, anc: list, fields: Sequence[str]) -> bool | None:
        """True: sent; False: failed for good (logged); None: queue full."""
        assert self._sock is not None
        try:
            self._sock.sendmsg([payload], anc, socket.MSG_DONTWAIT)
            return True
        except BlockingIOError:
            return None
        except OSError as e:
            if e.errno in (errno.ENOTCONN, errno.EDESTADDRREQ):
                # Not connected (the socket appeared late): address each datagram.
                try:
                    self._sock.sendmsg([payload], anc, socket.MSG_DONTWAIT, self.address)
                    return True
                except BlockingIOError:
                    return None
                except OSError as e2:
                    e = e2
            log.warning("sd_notify %r failed: %s", fields, e)
            return False

    def _wait_for_room(self, timeout: float) -> None:
        assert self._sock is not None
        if not self._connected:
            # Unconnected, the socket always looks writable: poll by time.
            time.sleep(min(timeout, 0.05))
            return
        # poll(), not select(): no FD_SETSIZE limit on the socket's fd
        # number (the daemon holds a fd per segment).
        waiter = select.poll()
        waiter.register(self._sock, select.POLLOUT)
        waiter.poll(timeout * 1000)

    def ready(self, status: str) -> None:
        self._pending_status = None
        self.notify("READY=1", f"STATUS={status}", wait=True)

    def status(self, status: str) -> None:
        """Never waits: if the queue is full, the line is sent by a later
        :meth:`status` or :meth:`flush` (only the newest line matters)."""
        self._pending_status = status
        self.flush()

    def flush(self) -> None:
        """Send the status line a full queue held back, if any."""
        line = self._pending_status
        if line is not None and self.notify(f"STATUS={line}"):
            if self._pending_status == line:
                self._pending_status = None

    def extend_timeout(self, seconds: float) -> None:
        self.notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")

    def stopping(self, status: str = "stopping") -> None:
        self._pending_status = None
        self.notify("STOPPING=1", f"STATUS={status}", wait=True)

    def watchdog_due(self) -> bool:
        return (
            self.watchdog_interval is not None
            and time.monotonic() - self._last_ping >= self.watchdog_interval
        )

    def ping_watchdog(self) -> None:
        """WATCHDOG=1, never waiting; a ping a full queue did not take stays
        due, so the caller's next turn sends it (not half an interval on)."""
        if self.watchdog_interval is None:
            return
        if self.notify("WATCHDOG=1"):
            self._last_ping = time.monotonic()


def _watchdog_interval(env: dict[str, str]) -> float | None:
    """Half of WATCHDOG_USEC, if the watchdog is meant for this process."""
    usec = env.get("WATCHDOG_USEC")
    if not usec:
        return None
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        return int(usec) / 1_000_000 / 2
    except ValueError:
        return None


def fdstore_limit(env: dict[str, str] | None = None) -> int | None:
    """How many fds systemd lets this service keep in its store: ``$FDSTORE``
    (systemd 254+ sets it from FileDescriptorStoreMax=); None if not told."""
    env = os.environ if env is None else env
    try:
        value = int(env.get("FDSTORE", ""))
    except ValueError:
        return None
    return value if value >= 0 else None
