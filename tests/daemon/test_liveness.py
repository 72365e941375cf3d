"""The serving probe's schedule and verdict, on a clock the test turns
(tests/daemon/test_systemd.py shows the watchdog it feeds on a real daemon):
one probe at a time, due every half ping interval, and healthy while a probe
answered within the half interval plus the whole interval it is given."""

from __future__ import annotations

import logging
import socket
import threading
from pathlib import Path

import pytest

from wcached.daemon import liveness
from wcached.daemon.liveness import ServingProbe


class _Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> _Clock:
    c = _Clock(100.0)
    monkeypatch.setattr(liveness.time, "monotonic", c)
    return c


def _probes() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "wcached-probe"]


def _wait_probes() -> None:
    for t in _probes():
        t.join(10)


@pytest.fixture
def silent_socket(tmp_path: Path):
    """A socket that accepts and never answers: a probe of it hangs until
    its timeout (here: until the test closes it)."""
    path = str(tmp_path / "silent.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(16)
    yield path
    srv.close()
    _wait_probes()


def test_one_probe_at_a_time_however_often_the_loop_asks(clock: _Clock, silent_socket: str) -> None:
    probe = ServingProbe(silent_socket, ping_interval_s=2.0)
    assert probe.every_s == 1.0 and probe.timeout_s == 2.0
    probe.healthy()  # the first at once
    assert len(_probes()) == 1
    for _ in range(5):  # it still hangs: no second one, however due
        clock.now += 1.0
        probe.healthy()
    assert len(_probes()) == 1


def test_a_probe_is_due_every_half_interval_to_the_tick(clock: _Clock, tmp_path: Path) -> None:
    probe = ServingProbe(str(tmp_path / "absent.sock"), ping_interval_s=2.0)
    started: list[float] = []
    run = probe._probe
    probe._probe = lambda: (started.append(clock.now), run())
    for step in (0.0, 0.5, 0.25, 0.25, 0.75, 0.25):  # exact in binary: 101.0 is 101.0
        clock.now += step
        probe.healthy()
        _wait_probes()
    assert started == [100.0, 101.0, 102.0]


def test_healthy_until_half_an_interval_plus_a_whole_one_without_an_answer(
    clock: _Clock, silent_socket: str
) -> None:
    probe = ServingProbe(silent_socket, ping_interval_s=2.0)
    clock.now += 3.0  # the last answer (start) exactly 1 + 2 s ago
    assert probe.healthy()
    clock.now += 0.01
    assert not probe.healthy()


def test_a_failing_socket_is_logged_once_per_streak(clock: _Clock, tmp_path: Path) -> None:
    # A handler of its own: caplog sees nothing once the daemon's logging set
    # up in an earlier test stopped "wcached" propagating to the root logger.
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    logger = logging.getLogger("wcached.liveness")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        probe = ServingProbe(str(tmp_path / "absent.sock"), ping_interval_s=2.0)
        for _ in range(3):
            clock.now += 1.0
            probe.healthy()
            _wait_probes()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    errors = [r for r in records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "does not answer" in errors[0].getMessage(), records
    assert "absent.sock" in errors[0].getMessage()


def test_what_the_journal_says_of_a_streak_and_its_end(clock: _Clock, monkeypatch) -> None:
    """The operator's lines, word for word: the first failure of a streak
    names the socket and the error's class and text, the end of the streak is
    said once, and a new streak is reported again. Each probe is bounded by
    the ping interval and names itself to the daemon (``wcached status``
    lists it as a client while it runs); its thread never holds up exit."""
    import wcached.client.connection as connection

    slow = TimeoutError("slow")
    answers = iter([ConnectionRefusedError("refused"), None, None, slow, slow])
    opened: list[dict] = []
    daemonic: list[bool] = []

    class FakeConnection:
        def __init__(self, path: str, **kwargs) -> None:
            opened.append({"path": path, **kwargs})
            daemonic.append(threading.current_thread().daemon)
            self.error = next(answers)

        def __enter__(self):
            if self.error:
                raise self.error
            return self

        def __exit__(self, *exc) -> None:
            pass

        def status(self) -> None:
            pass

    monkeypatch.setattr(connection, "DaemonConnection", FakeConnection)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    logger = logging.getLogger("wcached.liveness")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        probe = ServingProbe("/run/wcache/cpu0.sock", ping_interval_s=4.0)
        for _ in range(5):
            clock.now += 2.0
            probe.healthy()
            _wait_probes()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    said = [(r.levelname, r.getMessage()) for r in records]
    down = (
        "the daemon's own socket /run/wcache/cpu0.sock does not answer ({}); the watchdog is no "
        "longer fed and systemd will restart the daemon if this persists"
    )
    assert said == [
        ("ERROR", down.format("ConnectionRefusedError: refused")),
        ("INFO", "the socket answers again"),
        ("ERROR", down.format("TimeoutError: slow")),
    ]
    assert opened == [{"path": "/run/wcache/cpu0.sock", "timeout": 4.0, "client": "wcached-liveness"}] * 5
    assert daemonic == [True] * 5
