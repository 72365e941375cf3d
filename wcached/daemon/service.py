"""``wcached serve``: startup -> fill -> bind -> READY -> serve -> drain.

Signal handlers only record what arrived; the main loop acts on it (so no
handler ever runs inside the server's locks), wakes on the listening socket,
the signal pipe and a short timer, and is the only place that pings systemd's
watchdog, so a wedged main loop is noticed.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import stat
import time

from wcached import __version__
from wcached.config import ConfigError, InstanceSettings, instance_settings, load_config
from wcached.daemon.filler import FillAborted, fill_models
from wcached.daemon.lock import InstanceLock
from wcached.daemon.peers import AccessPolicy
from wcached.daemon.server import Server
from wcached.daemon.systemd import Notifier
from wcached.device import Device, resolve_instance
from wcached.errors import WcacheError
from wcached.log import setup_logging

log = logging.getLogger("wcached.service")

# While filling, ask systemd for this much more start time on every tick.
EXTEND_S = 30.0


class Service:
    def __init__(self, settings: InstanceSettings, device: Device, policy: AccessPolicy):
        self.settings = settings
        self.device = device
        self.policy = policy
        self.notifier = Notifier()
        self.stop_signal: int | None = None
        self.server: Server | None = None

    # -- signals ----------------------------------------------------------

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            return  # the wakeup fd makes the main loop log it
        self.stop_signal = signum

    def _install_signals(self) -> int:
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        return r

    # -- lifecycle --------------------------------------------------------

    def run(self) -> int:
        wakeup = self._install_signals()
        s = self.settings
        prepare_socket_dir(s.socket_dir)
        lock = InstanceLock(s.lock_path, s.instance_id).acquire()
        try:
            if os.path.lexists(s.socket_path):
                log.info("removing stale socket %s", s.socket_path)
                os.unlink(s.socket_path)
            models = self._fill()
            if models is None:
                return 0
            self.server = Server(s, self.device, models, self.policy)
            self.server.bind()
            total = sum(m.manifest.total_bytes for m in models.values())
            log.info(
                "serving %s on %s: %s (%.1f MiB)",
                s.instance_id,
                s.socket_path,
                ", ".join(models),
                total / 2**20,
            )
            self.notifier.ready(self._status_line())
            self._loop(wakeup)
            return 0
        finally:
            if self.server is not None:
                self.notifier.stopping()
                self.server.close()
                for m in self.server.models.values():
                    m.release()
            lock.release()
            log.info("stopped")

    def _fill(self):
        names = ", ".join(m.name for m in self.settings.models)
        self.notifier.status(f"filling {names}")
        self.notifier.extend_timeout(EXTEND_S)
        started = time.monotonic()

        def tick(model: str, done: int, total: int) -> None:
            self.notifier.extend_timeout(EXTEND_S)
            self.notifier.status(f"filling {model}: {done / 2**20:.0f} MiB")
            if self.notifier.watchdog_due():
                self.notifier.ping_watchdog()

        try:
            models = fill_models(self.settings, self.device, tick, lambda: self.stop_signal is not None)
        except FillAborted:
            log.info("stopped by signal %d while filling", self.stop_signal)
            self.notifier.stopping()
            return None
        log.info("filled %d model(s) in %.2f s", len(models), time.monotonic() - started)
        return models

    def _loop(self, wakeup: int) -> None:
        assert self.server is not None and self.server.listener is not None
        sel = selectors.DefaultSelector()
        sel.register(self.server.listener, selectors.EVENT_READ, "accept")
        sel.register(wakeup, selectors.EVENT_READ, "signal")
        interval = 1.0
        if self.notifier.watchdog_interval is not None:
            interval = min(interval, self.notifier.watchdog_interval)
            self.notifier.ping_watchdog()
        while self.stop_signal is None:
            for key, _ in sel.select(interval):
                if key.data == "accept":
                    self.server.accept_pending()
                else:
                    _drain(wakeup)
            if self.notifier.watchdog_due():
                self.notifier.ping_watchdog()
            if self.server.changed.is_set():
                self.server.changed.clear()
                self.notifier.status(self._status_line())
        log.info("received %s, stopping", signal.Signals(self.stop_signal).name)
        sel.close()

    def _status_line(self) -> str:
        assert self.server is not None
        models = self.server.models
        total = sum(m.manifest.total_bytes for m in models.values())
        return (
            f"serving {len(models)} model(s), {total / 2**30:.2f} GiB, {self.server.client_count} client(s)"
        )


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def prepare_socket_dir(path: str) -> None:
    """Create the socket directory 0750 if missing; warn if others can write it."""
    if not os.path.isdir(path):
        os.makedirs(path, mode=0o750, exist_ok=True)
        os.chmod(path, 0o750)
        return
    mode = os.stat(path).st_mode
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        log.warning("socket directory %s is writable by everyone", path)


def serve(instance: str, config_path: str | None) -> int:
    """Entry point of ``wcached serve``; returns the exit status."""
    setup_logging("info")
    try:
        cfg = load_config(config_path)
        device = resolve_instance(instance, isolated=True)
        settings = instance_settings(cfg, device.instance_id, (instance, *device.aliases))
        setup_logging(settings.log_level)
        if not settings.models:
            raise ConfigError(cfg.source, "model", f"no [[model]] is configured for {instance}")
        prefix = f"instance.{instance}." if instance in cfg.instance else "daemon."
        policy = AccessPolicy.from_names(settings.allowed_users, settings.allowed_groups, cfg.source, prefix)
        log.info(
            "wcached %s starting %s (%s) with %s", __version__, device.instance_id, device.name, cfg.source
        )
        return Service(settings, device, policy).run()
    except WcacheError as e:
        log.error("%s", e)
        Notifier().status(f"failed: {e}")
        return e.exit_status
