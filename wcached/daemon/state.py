"""The models a daemon holds: a manifest and the fds that keep the memory."""

from __future__ import annotations

import os
import threading
import time

from wcached.errors import ModelReleased
from wcached.protocol.messages import Manifest
from wcached.protocol.runs import RUNS_VERSION, for_version
from wcached.protocol.wire import close_fds


class HeldModel:
    def __init__(
        self,
        manifest: Manifest,
        fds: list[int],
        fill_seconds: float,
        origin: str = "filled",
        phases: dict[str, float] | None = None,
        read_bytes: int = 0,
    ):
        self.manifest = manifest
        # How long the fill that made these segments took (for a restored
        # model: the fill before the restart that kept them), phase by
        # phase, and the checkpoint bytes it read.
        self.fill_seconds = fill_seconds
        self.phases = dict(phases or {})
        self.read_bytes = read_bytes
        # "filled" from the checkpoint by this daemon, or "restored" from
        # systemd's fd store without reading the checkpoint.
        self.origin = origin
        self._fds = list(fds)
        self._lock = threading.Lock()
        self.released_at: float | None = None
        self._as_runs: Manifest | None = None

    @property
    def name(self) -> str:
        return self.manifest.model

    def manifest_for(self, version: int) -> Manifest:
        """The manifest as a client of protocol ``version`` is sent it (runs
        from version 3 on), made once: a fill's manifest never changes."""
        if version < RUNS_VERSION:
            return self.manifest
        if self._as_runs is None:
            self._as_runs = for_version(self.manifest, version)
        return self._as_runs

    def dup_fds(self) -> list[int]:
        """Duplicates to send, so a concurrent release never closes an fd that
        is being sent; the caller closes them after sending."""
        with self._lock:
            self.check_served()
            return [os.dup(fd) for fd in self._fds]

    def check_served(self) -> None:
        """A released model holds nothing: that comes before any key."""
        if self.released_at is not None:
            raise ModelReleased(f"model {self.name!r} was released; restart the daemon to refill")

    @property
    def fds(self) -> list[int]:
        """The fds that keep the memory (owned here: callers must not close them)."""
        with self._lock:
            return list(self._fds)

    def release(self) -> None:
        with self._lock:
            if self.released_at is None:
                close_fds(self._fds)
                self._fds = []
                self.released_at = time.time()
