"""Liveness that means serving: the watchdog is fed only while a client could
be served.

``WATCHDOG=1`` from the main loop alone proves that the loop turns, not that
a connection is accepted, a peer checked and a request answered: a daemon
whose connection threads are wedged, or whose socket was removed from under
it, would be kept alive forever while every engine falls back to the disk.
So a :class:`ServingProbe` connects to the daemon's own socket in a thread
of its own every half ping interval (hello + status, the path an engine's
attach takes), and the main loop pings only while a probe answered recently.
When none has, systemd's watchdog restarts the daemon, which serves again
from the fd store without reading the checkpoint.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("wcached.liveness")


class ServingProbe:
    def __init__(self, socket_path: str, ping_interval_s: float):
        self.socket_path = socket_path
        # A probe every half ping interval, each given a whole interval to
        # answer: one slow answer on a busy host never costs a ping.
        self.every_s = ping_interval_s / 2
        self.timeout_s = ping_interval_s
        self._last_ok = time.monotonic()
        self._last_start = 0.0
        self._running = False
        self._failing = ""  # why the last probe failed, logged once per streak
        self._lock = threading.Lock()

    def healthy(self) -> bool:
        """Whether the serving path answered recently; starts a probe when one is due."""
        now = time.monotonic()
        with self._lock:
            if not self._running and now - self._last_start >= self.every_s:
                self._running = True
                self._last_start = now
                threading.Thread(target=self._probe, name="wcached-probe", daemon=True).start()
            ok = now - self._last_ok <= self.every_s + self.timeout_s
        return ok

    def _probe(self) -> None:
        from wcached.client.connection import DaemonConnection

        error = ""
        try:
            with DaemonConnection(self.socket_path, timeout=self.timeout_s, client="wcached-liveness") as c:
                c.status()
        except Exception as e:  # any failure of the serving path counts
            error = f"{type(e).__name__}: {e}"
        with self._lock:
            self._running = False
            if not error:
                self._last_ok = time.monotonic()
                if self._failing:
                    log.info("the socket answers again")
                self._failing = ""
                return
            first = not self._failing
            self._failing = error
        if first:
            log.error(
                "the daemon's own socket %s does not answer (%s); the watchdog is no longer fed "
                "and systemd will restart the daemon if this persists",
                self.socket_path,
                error,
            )
