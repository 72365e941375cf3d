"""Prometheus metrics of one instance: a registry, a textfile, a loopback endpoint.

Each instance has its own :class:`CollectorRegistry` (never prometheus_client's
process-global one), so that two instances, or two servers in one test
process, never count into each other. Gauges that mirror what the daemon
holds (models, leases) are read from the server's state when scraped, so the
serving path does no bookkeeping for them; only the counters (attaches by
result, error replies by code) are incremented where they happen, and their
label sets are made up front from a fixed list, so that a client-chosen model
name never becomes a label value.

Every series carries ``instance`` (``cpu0``, ``GPU-<uuid>``) and ``gpu_uuid``
(the GPU's UUID, "" for host memory). No pid or client name is a label.

With neither ``metrics_dir`` nor ``metrics_port`` set, the server counts into
:class:`NoMetrics` and prometheus_client and the HTTP modules are never
imported: they would add tens of milliseconds to every start, a restart
restored from the fd store included.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import socket
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from wcached import __version__
from wcached.device import Device
from wcached.errors import (
    BadRequest,
    Busy,
    ConfigError,
    FrameTooLarge,
    ModelReleased,
    PermissionRefused,
    ProtocolError,
    TimeoutExpired,
    UnknownModel,
    VersionMismatch,
)
from wcached.loaders.layout import reading_rate

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from wcached.config import InstanceSettings
    from wcached.protocol.messages import StatusReply

log = logging.getLogger("wcached.metrics")

# What an attach can end in: served, refused for its key, an error code of
# the attach path, or "error" (the peer gone mid-send, out of fds).
ATTACH_RESULTS = (
    "ok",
    "mismatch",
    UnknownModel.code,
    ModelReleased.code,
    BadRequest.code,
    TimeoutExpired.code,
    "error",
)
# Error replies the server sends; made at 0 from the start, so that rate()
# sees the first one. Another code (a class constant, so still bounded) gets
# its series when first sent.
ERROR_CODES = (
    Busy.code,
    PermissionRefused.code,
    ProtocolError.code,
    FrameTooLarge.code,
    VersionMismatch.code,
    BadRequest.code,
    UnknownModel.code,
    ModelReleased.code,
)
# The model label of an attach naming no configured model.
UNKNOWN_MODEL = ""
# Scrapes answered at once; a connection beyond them is closed unanswered. A
# local user could otherwise open connections without end, each a thread and
# an fd of the daemon (its engines' attaches need fds too).
MAX_SCRAPES = 4
# A whole request, however slowly it arrives, is cut off after this long
# (a per-recv timeout would let a client dripping a byte at a time hold on).
REQUEST_DEADLINE_S = 5.0
# The textfile's mode: node-exporter runs as another user, and the unit's
# UMask=0027 would leave a plainly created file unreadable to it. Nothing in
# it is private (no pids, no client names).
TEXTFILE_MODE = 0o644

_BASE = ("instance", "gpu_uuid")


class NoMetrics:
    """Metrics off: what the server calls, doing nothing."""

    def watch(self, status: Callable[[], StatusReply]) -> None:
        pass

    def count_attach(self, model: str, result: str) -> None:
        pass

    def count_error(self, code: str) -> None:
        pass


class Metrics(NoMetrics):
    """The registry of one instance, and the counters the server increments."""

    def __init__(self, instance_id: str, gpu_uuid: str, models: Iterable[str]):
        from prometheus_client import CollectorRegistry, Counter, disable_created_metrics

        # No *_created series beside each counter (a timestamp per sample that
        # dashboards do not use and that doubles the series): off, as most
        # exporters have it. Process-wide; the daemon is the only user.
        disable_created_metrics()
        self.instance_id = instance_id
        self.gpu_uuid = gpu_uuid
        self.registry = CollectorRegistry()
        self._models = frozenset(models)
        self._status: Callable[[], StatusReply] | None = None
        self._base = base = (instance_id, gpu_uuid)
        attaches = Counter(
            "wcached_attaches_total",
            "Attach requests, by configured model ('' for a name the instance does not serve) and result.",
            [*_BASE, "model", "result"],
            registry=self.registry,
        )
        self._attaches = {
            (model, result): attaches.labels(*base, model, result)
            for model in (*sorted(self._models), UNKNOWN_MODEL)
            for result in ATTACH_RESULTS
        }
        self._errors_family = Counter(
            "wcached_errors_total",
            "Error replies sent to clients, by error code.",
            [*_BASE, "code"],
            registry=self.registry,
        )
        self._errors = {code: self._errors_family.labels(*base, code) for code in ERROR_CODES}
        self._errors_lock = threading.Lock()
        self.registry.register(_StateCollector(self))

    @classmethod
    def for_device(cls, device: Device, models: Iterable[str]) -> Metrics:
        return cls(device.instance_id, device.instance_id if device.kind == "cuda" else "", models)

    def watch(self, status: Callable[[], StatusReply]) -> None:
        """Where the gauges are read from when scraped (the server, once it
        exists: until then the instance reports itself down)."""
        self._status = status

    def count_attach(self, model: str, result: str) -> None:
        key = (
            model if model in self._models else UNKNOWN_MODEL,
            result if result in ATTACH_RESULTS else "error",
        )
        self._attaches[key].inc()

    def count_error(self, code: str) -> None:
        child = self._errors.get(code)
        if child is None:
            with self._errors_lock:
                child = self._errors[code] = self._errors_family.labels(*self._base, code)
        child.inc()

    def exposition(self) -> bytes:
        """The text format, as /metrics serves it."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    def write_textfile(self, path: str) -> None:
        """Replace ``path`` atomically: written beside it under a name the
        textfile collector skips (it reads ``*.prom`` only), then renamed,
        so a scrape never sees half a file. (prometheus_client's
        write_to_textfile does the same, but leaves the mode to the umask.)"""
        data = self.exposition()
        # A fresh name of its own (O_EXCL): the directory is shared with
        # other services.
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=os.path.dirname(path) or ".")
        try:
            try:
                os.fchmod(fd, TEXTFILE_MODE)
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def metrics_for(settings: InstanceSettings, device: Device) -> NoMetrics:
    """A registry where the instance exports one, else the no-op."""
    if not (settings.metrics_dir or settings.metrics_port):
        return NoMetrics()
    return Metrics.for_device(device, [m.name for m in settings.models])


def remove_textfile(path: str) -> None:
    """A stopped instance's file goes: a stale one would report it up."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def check_metrics_dir(path: str, source: str) -> None:
    """Before the fill: a directory this user can write into, or a config
    error now rather than a warning after a long fill."""
    problem = ""
    if not os.path.isdir(path):
        problem = "does not exist or is not a directory"
    elif not os.access(path, os.W_OK | os.X_OK):
        problem = (
            f"is not writable by uid {os.geteuid()} (under the unit, which sees a read-only file system, "
            f"add a drop-in with ReadWritePaths={path})"
        )
    if problem:
        raise ConfigError(source or None, "daemon.metrics_dir", f"{path} {problem}")


class _StateCollector:
    """The gauges, read from the server's status at scrape time."""

    def __init__(self, metrics: Metrics):
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

        m = self._metrics
        base = [m.instance_id, m.gpu_uuid]
        info = GaugeMetricFamily(
            "wcached_build_info",
            "The wcached release this daemon runs (always 1).",
            labels=["version", *_BASE],
        )
        info.add_metric([__version__, *base], 1)
        yield info
        status = m._status() if m._status is not None else None
        up = GaugeMetricFamily("wcached_up", "1 while the instance serves its socket.", labels=_BASE)
        up.add_metric(base, 1 if status is not None and status.state == "serving" else 0)
        yield up
        if status is None:
            return
        labels = [*_BASE, "model"]
        resident = GaugeMetricFamily("wcached_model_resident_bytes", "Bytes the daemon holds.", labels=labels)
        tensors = GaugeMetricFamily(
            "wcached_model_tensors", "Tensors in the model's manifest.", labels=labels
        )
        segments = GaugeMetricFamily("wcached_model_segments", "Segments (fds) of the model.", labels=labels)
        ready = GaugeMetricFamily("wcached_model_ready", "1 while served, 0 once released.", labels=labels)
        leases = GaugeMetricFamily("wcached_leases", "Clients attached to the model.", labels=labels)
        fill_s = GaugeMetricFamily(
            "wcached_fill_seconds",
            "Duration of the model's last fill (for a restored model, the fill before the restart).",
            labels=labels,
        )
        reading_s = GaugeMetricFamily(
            "wcached_fill_reading_seconds",
            "Seconds the model's last fill spent reading the checkpoint (its throughput is "
            "wcached_fill_read_bytes over this; absent where the fill did not time its reading).",
            labels=labels,
        )
        read = CounterMetricFamily(
            "wcached_fill_read_bytes",
            "Bytes this process filled from the checkpoint (0 for a model restored from the fd store).",
            labels=labels,
        )
        restores = CounterMetricFamily(
            "wcached_restores",
            "Models restored from systemd's fd store at this start, without reading the checkpoint.",
            labels=labels,
        )
        attached: dict[str, int] = {}
        for client in status.clients:
            for name in client.models:
                attached[name] = attached.get(name, 0) + 1
        for model in status.models:
            values = [*base, model.name]
            held = model.state != "released"
            # A released model's memory stays only while attached clients
            # map it; the daemon holds none of it.
            resident.add_metric(values, model.bytes if held else 0)
            tensors.add_metric(values, model.tensors)
            segments.add_metric(values, model.segments)
            ready.add_metric(values, 1 if held else 0)
            leases.add_metric(values, attached.get(model.name, 0))
            fill_s.add_metric(values, model.fill_seconds)
            reading = reading_rate(model.phases, model.read_bytes)
            if reading is not None and model.origin == "filled":
                reading_s.add_metric(values, reading[0])
            # The checkpoint's bytes where the fill counted them (a vLLM fill
            # quantizing online reads more than it serves), else the model's.
            read.add_metric(values, (model.read_bytes or model.bytes) if model.origin == "filled" else 0)
            restores.add_metric(values, 1 if model.origin == "restored" else 0)
        yield from (resident, tensors, segments, ready, leases, fill_s, reading_s, read, restores)


# -- the HTTP endpoint --------------------------------------------------------


@functools.cache
def _http_classes() -> tuple[type, type]:
    """The server and handler classes, made on first use (see the module's
    docstring for why http.server is not imported up front)."""
    import socketserver
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

    class Handler(WSGIRequestHandler):
        def setup(self) -> None:
            super().setup()
            self._deadline = threading.Timer(REQUEST_DEADLINE_S, self._cut_off)
            self._deadline.daemon = True
            self._deadline.start()

        def _cut_off(self) -> None:
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        def finish(self) -> None:
            self._deadline.cancel()
            super().finish()

        def log_message(self, format: str, *args: object) -> None:
            """Scrapes are not worth a journal line each."""

    class Server(socketserver.ThreadingMixIn, WSGIServer):
        daemon_threads = True
        block_on_close = False

        def __init__(self, *args: object, **kwargs: object) -> None:
            self._slots = threading.BoundedSemaphore(MAX_SCRAPES)
            super().__init__(*args, **kwargs)

        def process_request(self, request: socket.socket, client_address: object) -> None:
            if not self._slots.acquire(blocking=False):
                self.shutdown_request(request)  # all slots busy: closed, unanswered
                return
            super().process_request(request, client_address)

        def process_request_thread(self, request: socket.socket, client_address: object) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self._slots.release()

        def server_bind(self) -> None:
            # HTTPServer.server_bind resolves the address's name (getfqdn), a
            # DNS query the unit's IPAddressDeny= would leave hanging: the
            # name is known anyway.
            socketserver.TCPServer.server_bind(self)
            self.server_name = "localhost"
            self.server_port = self.server_address[1]
            self.setup_environ()

        def handle_error(self, request: object, client_address: object) -> None:
            # A scraper that timed out or hung up: one debug line, not the
            # traceback socketserver would print to the journal.
            log.debug("metrics request from %s failed", client_address, exc_info=True)

    return Server, Handler


class MetricsEndpoint:
    """/metrics on 127.0.0.1 only. Bound when made, so that a port in use is
    a config error before any fill; answers once :meth:`start` is called."""

    ADDRESS = "127.0.0.1"

    def __init__(self, port: int, metrics: Metrics, source: str, key: str):
        from wsgiref.simple_server import make_server

        from prometheus_client import make_wsgi_app

        server, handler = _http_classes()
        try:
            self._httpd = make_server(
                self.ADDRESS, port, make_wsgi_app(metrics.registry), server, handler_class=handler
            )
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                problem = (
                    f"{self.ADDRESS}:{port} is already in use (another instance or service listens there)"
                )
            else:
                problem = f"cannot listen on {self.ADDRESS}:{port}: {e.strerror or e}"
            raise ConfigError(source or None, key, problem) from None
        # The port listened on (the one asked for, or the kernel's choice for 0).
        self.port: int = self._httpd.server_address[1]
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        # close() waits for serve_forever's next poll: a short one keeps stops quick.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="metrics", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()  # waits for serve_forever: only once started
            self._thread = None
        self._httpd.server_close()
