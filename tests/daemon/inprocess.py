"""A daemon's parts in this process, for tests of one part's rules: a model
filled and held as the service holds it, an instance's settings, the
server polled as the service's loop polls it, metrics that record."""

from __future__ import annotations

import contextlib
import selectors
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from wcached.config import AccessLists, InstanceSettings
from wcached.daemon.fdstore import FdStore
from wcached.daemon.holdings import Holdings
from wcached.daemon.metrics import NoMetrics
from wcached.daemon.peers import AccessPolicy
from wcached.daemon.server import Server
from wcached.daemon.state import HeldModel
from wcached.daemon.systemd import Notifier
from wcached.device import resolve_instance
from wcached.loaders.base import get_loader
from wcached.loaders.layout import FilledModel
from wcached.loaders.safetensors import SafetensorsModel
from wcached.memory.host import HostBackend

DEVICE = resolve_instance("cpu0")


class CountingMetrics(NoMetrics):
    """What the server counts, as the metrics would be told it."""

    def __init__(self) -> None:
        self.attaches: list[tuple[str, str]] = []
        self.errors: list[str] = []

    def count_attach(self, model: str, result: str) -> None:
        self.attaches.append((model, result))

    def count_error(self, code: str) -> None:
        self.errors.append(code)


def fill(h: Holdings, held_as: Callable[[FilledModel], HeldModel] | None = None) -> None:
    """What the service does: provenance, then the worker's fills, one by
    one, in this process; each held as ``held_as`` makes it (by default as
    the worker reported it)."""
    todo = h.to_fill()
    h.begin_fill(todo)
    for m in todo:
        filled = get_loader("safetensors").fill(m, HostBackend(), DEVICE.instance_id, lambda *a: None)
        h.filled(held_as(filled) if held_as else HeldModel(filled.manifest, filled.fds, filled.fill_seconds))


def filled_holdings(ckpt: Path) -> Holdings:
    """One model filled in this process, held as the service holds it."""
    model = SafetensorsModel(name="default", path=str(ckpt), segment_size=64 * 1024)
    h = Holdings((model,), DEVICE, FdStore(Notifier({})), python="")
    fill(h)
    return h


def settings_for(socket_dir: Path, **kw: object) -> InstanceSettings:
    defaults: dict = {
        "instance_id": "cpu0",
        "socket_dir": str(socket_dir),
        "models": (),
        "access": AccessLists(),
        "connection_timeout_s": 5.0,
        "max_clients": 8,
        "worker_python": "",
        "log_level": "info",
    }
    return InstanceSettings(**{**defaults, **kw})


def open_policy() -> AccessPolicy:
    return AccessPolicy.from_lists(AccessLists(), "")


@contextlib.contextmanager
def serving(server: Server) -> Iterator[Server]:
    """The server bound and its listener polled as the service's loop does
    (accepts paused for a moment when it reports running out of fds), until
    the test ends or closes the server."""
    listener = server.bind()
    stop = threading.Event()

    def loop() -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(listener, selectors.EVENT_READ)
            while not stop.is_set() and server.listener is listener:
                if sel.select(0.05) and server.listener is listener and not server.accept_pending():
                    stop.wait(0.1)

    t = threading.Thread(target=loop, daemon=True)
    t.start()
    try:
        yield server
    finally:
        stop.set()
        t.join(5)
        server.close()


def until(done, seconds: float = 5.0) -> bool:
    """Whether ``done()`` came true within ``seconds`` (a connection's
    thread winds down after its client has gone; the loop acts on a tick)."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
