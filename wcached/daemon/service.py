"""``wcached serve``: the lifecycle only.

startup (socket directory, lock, metrics) -> provision (the holdings restore
what the fd store kept, then fill the rest) -> bind -> READY -> serve ->
drain. What happens to each model is the holdings' business
(:mod:`wcached.daemon.holdings`); this module only says when.

Signal handlers only record what arrived; the main loop acts on it (so no
handler ever runs inside the server's locks), wakes on the listening socket,
the signal pipe and a short timer, and is the only place that pings systemd's
watchdog, and only while the daemon's own socket answers
(:mod:`wcached.daemon.liveness`).
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import sys
import time

import msgspec

from wcached import __version__
from wcached.config import ConfigError, InstanceSettings, ModelConfig, instance_settings, load_config
from wcached.daemon import socket_dir
from wcached.daemon.fdstore import FdStore, listen_fds
from wcached.daemon.filler import FillAborted, fill_models
from wcached.daemon.holdings import Holdings
from wcached.daemon.liveness import ServingProbe
from wcached.daemon.lock import InstanceLock
from wcached.daemon.metrics import Metrics, MetricsEndpoint, check_metrics_dir, metrics_for, remove_textfile
from wcached.daemon.peers import AccessPolicy
from wcached.daemon.progress import FillMeter
from wcached.daemon.server import Server
from wcached.daemon.systemd import Notifier
from wcached.device import Device, resolve_instance
from wcached.errors import EX_SOFTWARE, WcacheError
from wcached.log import setup_logging

log = logging.getLogger("wcached.service")

# While filling, ask systemd for this much more start time on every tick.
EXTEND_S = 30.0
# Out of fds: how long the listener is left alone before accepting again
# (connections wait in the kernel's backlog meanwhile).
ACCEPT_PAUSE_S = 0.25
# The metrics textfile is rewritten at most this often however busy the
# socket (changes in between are coalesced into the next write) ...
METRICS_MIN_INTERVAL_S = 0.25
# ... and at least this often, so that its mtime (node-exporter's
# node_textfile_mtime_seconds) tells a live daemon from one killed without
# the chance to remove its file.
METRICS_REFRESH_S = 60.0


class Service:
    def __init__(self, settings: InstanceSettings, device: Device, policy: AccessPolicy):
        self.settings = settings
        self.device = device
        self.policy = policy
        self.notifier = Notifier()
        self.store = FdStore(self.notifier)
        self.holdings = Holdings(settings.models, device, self.store, settings.worker_interpreter)
        self.stop_signal: int | None = None
        self.server: Server | None = None
        self.metrics = metrics_for(settings, device)
        self.endpoint: MetricsEndpoint | None = None
        self._textfile = ""  # the .prom file this instance writes, once its directory checked out
        self._textfile_failing = False

    # -- signals ----------------------------------------------------------

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum == signal.SIGHUP:
            return  # nothing to reload: the wakeup only turns the loop
        self.stop_signal = signum

    def _install_signals(self) -> tuple[int, int, int]:
        """The handlers, and a pipe the signals wake the loop through: its
        read end, its write end and the wakeup fd it replaced."""
        r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            previous = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
        except BaseException:  # not the main thread: nothing installed, nothing left open
            os.close(r)
            os.close(w)
            raise
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, self._on_signal)
        return r, w, previous

    @staticmethod
    def _remove_wakeup(r: int, w: int, previous: int) -> None:
        """The wakeup pipe closed, the wakeup fd it replaced back. The
        handlers stay: a signal after the loop has nothing left to stop."""
        signal.set_wakeup_fd(previous)
        os.close(r)
        os.close(w)

    # -- lifecycle --------------------------------------------------------

    def run(self) -> int:
        """Fill, serve until a signal stops it, and give the exit status. In
        the main thread (signals are its). The handlers it installs stay
        after it returns, when serve exits; a caller that goes on puts its
        own back."""
        # Taken first: no child (the loader worker) may inherit them.
        stored = listen_fds()
        wakeup, wakeup_w, previous = self._install_signals()
        try:
            return self._serve(stored, wakeup)
        finally:
            self._remove_wakeup(wakeup, wakeup_w, previous)

    def _serve(self, stored: list[tuple[str, int]], wakeup: int) -> int:
        s = self.settings
        prepare_socket_dir(s.socket_dir, s.source)
        lock = InstanceLock(s.lock_path, s.instance_id).acquire()
        try:
            # Before the fill: a port in use is exit 78 now, not after it;
            # scrapes are answered from now on (wcached_up 0 while filling).
            self._open_metrics()
            if self.endpoint is not None:
                self.endpoint.start()
            if os.path.lexists(s.socket_path):
                log.info("removing stale socket %s", s.socket_path)
                os.unlink(s.socket_path)
            self.holdings.restore(stored)
            if not self._fill(self.holdings.to_fill()):
                return 0
            self.server = Server(s, self.device, self.holdings, self.policy, self.metrics)
            self.server.bind()
            self._write_textfile()
            served = self.holdings.served
            total = sum(m.manifest.total_bytes for m in served.values())
            log.info(
                "serving %s on %s: %s (%.1f MiB)",
                s.instance_id,
                s.socket_path,
                ", ".join(served),
                total / 2**20,
            )
            self.notifier.ready(self._status_line())
            self._loop(wakeup)
            return 0
        finally:
            if self.server is not None:
                self.notifier.stopping()
                self.server.close()
            self.holdings.close()
            self._close_metrics()
            lock.release()

    # -- metrics ----------------------------------------------------------

    def _open_metrics(self) -> None:
        """Check the textfile directory and bind the HTTP port (serving
        starts with the socket); either failing is a ConfigError."""
        s = self.settings
        if s.metrics_dir:
            check_metrics_dir(s.metrics_dir, s.source)
            # A predecessor killed without cleanup left a file that says it is up.
            try:
                remove_textfile(s.metrics_path)
            except OSError as e:
                # Left by another user (a manual run as root): it could not be
                # replaced either.
                raise ConfigError(
                    s.source or None, "daemon.metrics_dir", f"cannot remove the stale {s.metrics_path}: {e}"
                ) from None
            self._textfile = s.metrics_path
        if s.metrics_port:
            assert isinstance(self.metrics, Metrics)
            self.endpoint = MetricsEndpoint(s.metrics_port, self.metrics, s.source, s.metrics_port_key)
            log.info("metrics on http://%s:%d/metrics", MetricsEndpoint.ADDRESS, s.metrics_port)

    def _write_textfile(self) -> None:
        if not self._textfile:
            return
        assert isinstance(self.metrics, Metrics)
        try:
            self.metrics.write_textfile(self._textfile)
        except OSError as e:
            # Never fatal (the weights matter more); one line per failing streak.
            if not self._textfile_failing:
                log.warning("cannot write metrics to %s: %s", self._textfile, e)
            self._textfile_failing = True
            return
        if self._textfile_failing:
            log.info("writing metrics to %s again", self._textfile)
            self._textfile_failing = False

    def _close_metrics(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()
            self.endpoint = None
        if self._textfile:
            try:
                remove_textfile(self._textfile)
            except OSError as e:
                log.warning("cannot remove %s: %s", self._textfile, e)

    # -- filling ----------------------------------------------------------

    def _fill(self, todo: list[ModelConfig]) -> bool:
        """Fill what the store did not give back; False if stopped by a
        signal meanwhile. Each model is kept in the store as it completes."""
        if not todo:
            return True
        # A bar only where someone watches: a terminal, never the journal.
        meter = FillMeter([m.name for m in todo], bar_stream=sys.stderr if sys.stderr.isatty() else None)
        self.notifier.status(meter.status_line())
        self.notifier.extend_timeout(EXTEND_S)
        started = time.monotonic()

        def tick(model: str, done: int, total: int) -> None:
            meter.update(model, done, total)
            self.notifier.extend_timeout(EXTEND_S)
            self.notifier.status(meter.status_line())
            if self.notifier.watchdog_due():
                self.notifier.ping_watchdog()

        self.holdings.begin_fill(todo)
        settings = msgspec.structs.replace(self.settings, models=tuple(todo))
        try:
            fill_models(
                settings, self.device, tick, lambda: self.stop_signal is not None, self.holdings.filled
            )
        except FillAborted:
            self.holdings.fill_failed("stopped by a signal")
            log.info("stopped by signal %d while filling", self.stop_signal)
            self.notifier.stopping()
            return False
        except BaseException as e:
            self.holdings.fill_failed(str(e))
            raise
        finally:
            meter.close()
        log.info("filled %d model(s) in %.2f s", len(todo), time.monotonic() - started)
        return True

    def _loop(self, wakeup: int) -> None:
        assert self.server is not None and self.server.listener is not None
        sel = selectors.DefaultSelector()
        sel.register(self.server.listener, selectors.EVENT_READ, "accept")
        sel.register(wakeup, selectors.EVENT_READ, "signal")
        interval = 1.0
        probe: ServingProbe | None = None
        if self.notifier.watchdog_interval is not None:
            probe = ServingProbe(self.settings.socket_path, self.notifier.watchdog_interval)
            interval = min(interval, probe.every_s)
            self.notifier.ping_watchdog()
        resume_at: float | None = None  # accepts paused (out of fds) until then
        written_at = time.monotonic()  # the textfile, by run() just before
        sent_status = self._status_line()  # with READY, by run() just before
        write_at: float | None = None  # a change to write to the textfile then
        while self.stop_signal is None:
            timeout = interval if resume_at is None else max(0.0, min(interval, resume_at - time.monotonic()))
            if write_at is not None:
                timeout = max(0.0, min(timeout, write_at - time.monotonic()))
            for key, _ in sel.select(timeout):
                if key.data == "accept":
                    if not self.server.accept_pending():
                        sel.unregister(self.server.listener)
                        resume_at = time.monotonic() + ACCEPT_PAUSE_S
                else:
                    _drain(wakeup)
            if resume_at is not None and time.monotonic() >= resume_at:
                resume_at = None
                sel.register(self.server.listener, selectors.EVENT_READ, "accept")
            if probe is not None and probe.healthy() and self.notifier.watchdog_due():
                self.notifier.ping_watchdog()
            self.notifier.flush()
            if self.server.changed.is_set():
                self.server.changed.clear()
                # Only a new line: error replies and attaches change the
                # metrics, not the status line, and each datagram sent for
                # nothing could fill the notify socket's queue (where the fd
                # store's messages wait their turn).
                line = self._status_line()
                if line != sent_status:
                    self.notifier.status(line)
                    sent_status = line
                if self._textfile and write_at is None:
                    write_at = written_at + METRICS_MIN_INTERVAL_S
            now = time.monotonic()
            if self._textfile and (
                (write_at is not None and now >= write_at) or now - written_at >= METRICS_REFRESH_S
            ):
                self._write_textfile()
                written_at, write_at = now, None
        log.info("received %s, stopping", signal.Signals(self.stop_signal).name)
        sel.close()

    def _status_line(self) -> str:
        assert self.server is not None
        models = self.holdings.served
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


def prepare_socket_dir(path: str, source: str = "") -> None:
    """Create the socket directory 0750 if missing; refuse one that another
    user could plant a socket or a lock in (see :func:`check_socket_dir`)."""
    # Only where nothing is: a file or a link (even dangling) is refused
    # below with its fix, not made a directory of or crashed on.
    if not os.path.lexists(path):
        os.makedirs(path, mode=0o750, exist_ok=True)
        os.chmod(path, 0o750)
    check_socket_dir(path, source)


def check_socket_dir(path: str, source: str = "", owner_uid: int | None = None) -> None:
    """ConfigError unless ``path`` is the daemon's own (wcached.daemon.socket_dir);
    ``owner_uid``: the daemon's user (default: this process's, as serve runs)."""
    uid = os.geteuid() if owner_uid is None else owner_uid
    wrong = socket_dir.problem(path, uid)
    if wrong:
        raise ConfigError(
            source or None, "daemon.socket_dir", f"{path} {wrong}; fix with: {socket_dir.fix(path, uid)}"
        )


def serve(instance: str, config_path: str | None) -> int:
    """Entry point of ``wcached serve``; returns the exit status."""
    # The instance as systemd names it (wcached@<instance>): what an
    # operator filters the journal by.
    setup_logging("info", instance=instance)
    started = False
    try:
        cfg = load_config(config_path)
        device = resolve_instance(instance, isolated=True)
        settings = instance_settings(cfg, device.instance_id, (instance, *device.aliases))
        setup_logging(settings.log_level)
        if not settings.models:
            raise ConfigError(cfg.source, "model", f"no [[model]] is configured for {instance}")
        policy = AccessPolicy.from_lists(settings.access, cfg.source)
        log.info(
            "wcached %s starting %s (%s) with %s", __version__, device.instance_id, device.name, cfg.source
        )
        service = Service(settings, device, policy)
        started = True
        status = service.run()
        log.info("stopped")
        return status
    except WcacheError as e:
        # The cause first, then that it stopped (the journal reads in order).
        log.error("%s", e)
        Notifier().status(f"failed: {e}")
        if started:
            log.info("stopped (exit %d)", e.exit_status)
        return e.exit_status
    except Exception as e:
        # Never a bare traceback at exit 1: the traceback at error priority,
        # and a status that says "software error" to the unit and the reader.
        log.exception("unexpected error, exiting with %d: %s", EX_SOFTWARE, e)
        Notifier().status(f"failed: unexpected {type(e).__name__}: {e}")
        if started:
            log.info("stopped (exit %d)", EX_SOFTWARE)
        return EX_SOFTWARE
