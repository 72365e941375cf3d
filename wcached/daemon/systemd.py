"""sd_notify over ``socket.sendmsg``: READY, STATUS, WATCHDOG, EXTEND_TIMEOUT.

Send errors are logged, not hidden (the ``sdnotify`` package swallows them), and
the module can pass fds for the fd store later without another dependency.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Sequence

log = logging.getLogger("wcached.systemd")

STATE_SEND_TIMEOUT_S = 5.0


class Notifier:
    """Talks to ``$NOTIFY_SOCKET``; every call is a no-op without one."""

    def __init__(self, env: dict[str, str] | None = None):
        env = os.environ if env is None else env
        self.address = env.get("NOTIFY_SOCKET") or None
        self._sock: socket.socket | None = None
        if self.address:
            if self.address.startswith("@"):
                self.address = "\0" + self.address[1:]
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.watchdog_interval = _watchdog_interval(env)
        self._last_ping = 0.0

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def notify(self, *fields: str, fds: Sequence[int] = (), wait: bool = False) -> bool:
        """Send one datagram. Progress messages never block the main loop (a
        receiver whose queue is full would stall accepts); state changes
        (``wait=True``) wait up to :data:`STATE_SEND_TIMEOUT_S` to be queued."""
        if self._sock is None:
            return False
        payload = "\n".join(fields).encode()
        anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, _int_array(fds).tobytes())] if fds else []
        self._sock.settimeout(STATE_SEND_TIMEOUT_S if wait else 0.0)
        try:
            self._sock.sendmsg([payload], anc, 0, self.address)
            return True
        except (BlockingIOError, TimeoutError):
            log.debug("sd_notify %r dropped: notify socket queue full", fields)
        except OSError as e:
            log.warning("sd_notify %r failed: %s", fields, e)
        return False

    def ready(self, status: str) -> None:
        self.notify("READY=1", f"STATUS={status}", wait=True)

    def status(self, status: str) -> None:
        self.notify(f"STATUS={status}")

    def extend_timeout(self, seconds: float) -> None:
        self.notify(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")

    def stopping(self, status: str = "stopping") -> None:
        self.notify("STOPPING=1", f"STATUS={status}", wait=True)

    def watchdog_due(self) -> bool:
        return (
            self.watchdog_interval is not None
            and time.monotonic() - self._last_ping >= self.watchdog_interval
        )

    def ping_watchdog(self) -> None:
        if self.watchdog_interval is None:
            return
        self._last_ping = time.monotonic()
        self.notify("WATCHDOG=1")


def _int_array(fds: Sequence[int]):
    import array

    return array.array("i", fds)


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
