"""Leases across daemon restarts (wcached.client.lease): one watcher thread a
process, quiet about planned restarts, patient with a daemon coming back."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import Daemon, start_daemon, tied_model_config, wait_ready, write_config
from wcached.client import attach
from wcached.client.connection import DaemonConnection


@pytest.fixture
def ckpt(work: Path, sharded_ckpt: Path) -> Path:
    return Path(shutil.copytree(sharded_ckpt, work / "ckpt"))


def _up(config: Path, store_from: Daemon | None = None) -> Daemon:
    d = start_daemon(config, store_from=store_from.notify if store_from else None)
    wait_ready(d, 60)
    return d


def _restarted(d: Daemon, config: Path) -> Daemon:
    d.stop(signal.SIGTERM)
    d.notify.close(keep_store=True)
    return _up(config, store_from=d)


def _wait_reattached(*attachments, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while any(a.watch.reattached < 1 for a in attachments):
        assert time.monotonic() < deadline
        time.sleep(0.05)


def _lease_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("wcached-lease")]


def test_one_watcher_for_all_attachments_and_a_planned_restart_is_no_warning(
    work: Path, ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = write_config(
        work / "two.toml",
        models=[
            {"name": "target", "path": str(ckpt), "segment_size": "64KiB"},
            {"name": "draft", "path": str(ckpt), "segment_size": "64KiB"},
        ],
        daemon={"socket_dir": str(work / "run")},
    )
    d = _up(cfg)
    target = attach("target", "cpu0", socket_dir=d.socket_dir)
    draft = attach("draft", "cpu0", socket_dir=d.socket_dir)
    try:
        assert _lease_threads() == ["wcached-leases"]
        with caplog.at_level(logging.INFO, "wcached.client"):
            d = _restarted(d, cfg)
            _wait_reattached(target, draft)
        messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "wcached.client"]
        assert not [m for level, m in messages if level >= logging.WARNING], messages
        assert sum("ended the lease" in m for _, m in messages) == 2, messages
        with DaemonConnection(d.socket_path) as conn:
            mine = [c for c in conn.status().clients if c.pid == os.getpid()]
        assert sorted(m for c in mine for m in c.models) == ["draft", "target"]
        assert _lease_threads() == ["wcached-leases"]
    finally:
        target.close()
        draft.close()
        d.stop()
        d.notify.close()


def test_a_daemon_that_times_out_while_coming_back_is_waited_for(work: Path, ckpt: Path) -> None:
    """For a while after the daemon went, something at its socket accepts and
    never answers (a daemon still starting, wedged, or restarting): the
    attempts time out, and are retried until the real daemon is back."""
    cfg = tied_model_config(work, ckpt, "64KiB")
    d = _up(cfg)
    a = attach("default", "cpu0", socket_dir=d.socket_dir, timeout=0.5)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    held: list[socket.socket] = []
    try:
        d.stop(signal.SIGKILL)
        d.notify.close(keep_store=True)
        os.unlink(d.socket_path)
        silent.bind(d.socket_path)
        silent.listen(16)
        silent.settimeout(5)
        for _ in range(2):  # two attempts that time out
            conn, _ = silent.accept()
            held.append(conn)
        assert a.watch.watching and a.watch.reattached == 0
        silent.close()
        os.unlink(d.socket_path)
        d = _up(cfg, store_from=d)
        _wait_reattached(a)
    finally:
        for c in held:
            c.close()
        silent.close()
        a.close()
        d.stop()
        d.notify.close()
    assert not a.watch.watching


def test_a_lease_on_a_socket_numbered_over_1024_is_followed(work: Path, ckpt: Path) -> None:
    """Engines hold thousands of fds: the watcher must follow a connection
    whose fd select() could not take."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    filler = []
    cfg = tied_model_config(work, ckpt, "64KiB")
    d = _up(cfg)
    try:
        while not filler or filler[-1] < 1100:
            filler.append(os.open("/dev/null", os.O_RDONLY))
        a = attach("default", "cpu0", socket_dir=d.socket_dir)
        assert a.connection.sock.fileno() > 1024
        d = _restarted(d, cfg)
        _wait_reattached(a)
        a.close()
    finally:
        for fd in filler:
            os.close(fd)
        d.stop()
        d.notify.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_daemon_away_too_long_is_a_warning_and_its_return_too(
    work: Path, ckpt: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wcached.client import lease

    monkeypatch.setattr(lease, "WARN_AFTER_S", 0.5)
    cfg = tied_model_config(work, ckpt, "64KiB")
    d = _up(cfg)
    a = attach("default", "cpu0", socket_dir=d.socket_dir)
    try:
        with caplog.at_level(logging.INFO, "wcached.client"):
            d.stop(signal.SIGKILL)
            d.notify.close(keep_store=True)
            deadline = time.monotonic() + 10
            while not any("is not back after" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
                time.sleep(0.05)
            d = _up(cfg, store_from=d)
            _wait_reattached(a)
        warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 2 and "attached again" in warnings[1], warnings
    finally:
        a.close()
        d.stop()
        d.notify.close()
