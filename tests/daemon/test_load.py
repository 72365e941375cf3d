"""Bounded under load: max_clients, a thousand connections, running out of fds."""

from __future__ import annotations

import os
import resource
import socket
import time
from pathlib import Path

import pytest

from tests.helpers import run_daemon, start_daemon, wait_ready, write_config
from wcached.client import attach
from wcached.client.connection import DaemonConnection
from wcached.errors import Busy


def _config(work: Path, ckpt: Path, **daemon: object) -> Path:
    return write_config(
        work / "wcached.toml",
        models=[{"name": "default", "path": str(ckpt)}],
        daemon={"socket_dir": str(work / "run"), **daemon},
    )


def _proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _raise_nofile(n: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        if hard != resource.RLIM_INFINITY and hard < n:
            pytest.skip(f"needs {n} fds, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, hard))


def test_max_clients_plus_one_is_busy_then_served_once_one_leaves(work: Path, sharded_ckpt: Path) -> None:
    cfg = _config(work, sharded_ckpt, max_clients=2, connection_timeout_s=30.0)
    with run_daemon(cfg) as d:
        first = DaemonConnection(d.socket_path, timeout=5)
        second = DaemonConnection(d.socket_path, timeout=5)
        with pytest.raises(Busy, match="too many clients"):
            DaemonConnection(d.socket_path, timeout=0.5)
        first.close()
        with DaemonConnection(d.socket_path, timeout=5) as third:
            assert third.status().state == "serving"
        second.close()
        assert "refused 1 connection(s): 2 clients connected (max_clients)" in d.log()


def test_thousand_connections_bounded_and_a_good_client_attaches(work: Path, sharded_ckpt: Path) -> None:
    _raise_nofile(4096)
    cfg = _config(work, sharded_ckpt, max_clients=64, connection_timeout_s=2.0)
    with run_daemon(cfg) as d:
        base_fds = len(os.listdir(f"/proc/{d.proc.pid}/fd"))
        socks = []
        peak_threads = peak_fds = 0
        try:
            for i in range(1000):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.setblocking(False)
                try:
                    s.connect(d.socket_path)
                except BlockingIOError:
                    pass  # the backlog is full: it completes as the daemon accepts
                socks.append(s)
                if i % 50 == 0:
                    peak_threads = max(peak_threads, _proc_status(d.proc.pid, "Threads"))
                    peak_fds = max(peak_fds, len(os.listdir(f"/proc/{d.proc.pid}/fd")))
            started = time.monotonic()
            with attach("default", "cpu0", socket_dir=d.socket_dir, timeout=10, keep_lease=False) as a:
                assert a.tensors
            attach_s = time.monotonic() - started
            for _ in range(20):
                peak_threads = max(peak_threads, _proc_status(d.proc.pid, "Threads"))
                peak_fds = max(peak_fds, len(os.listdir(f"/proc/{d.proc.pid}/fd")))
                time.sleep(0.05)
        finally:
            for s in socks:
                s.close()
        assert d.proc.poll() is None
        # One thread per connection, at most max_clients of them (+ main and helpers).
        assert peak_threads <= 64 + 4, peak_threads
        assert peak_fds <= base_fds + 64 + 4, (peak_fds, base_fds)
        assert attach_s < 10
        log = d.log()
        # Refusals are summarised, not logged one line each.
        assert 0 < log.count("max_clients)") < 100, log[-3000:]


def test_out_of_fds_pauses_accepting_instead_of_spinning(work: Path, sharded_ckpt: Path) -> None:
    cfg = _config(work, sharded_ckpt, connection_timeout_s=60.0)
    d = start_daemon(cfg, rlimits={resource.RLIMIT_NOFILE: 32})
    socks = []
    try:
        wait_ready(d, 60)
        for _ in range(60):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(d.socket_path)
            except BlockingIOError:
                pass
            socks.append(s)
        deadline = time.monotonic() + 10
        while "pausing accepts" not in d.log():
            assert time.monotonic() < deadline, d.log()
            time.sleep(0.05)
        before = _cpu_seconds(d.proc.pid)
        time.sleep(2.0)
        spent = _cpu_seconds(d.proc.pid) - before
        assert spent < 0.5, f"{spent:.2f} s of CPU in 2 s while out of fds"
        assert d.log().count("pausing accepts") == 1
        for s in socks:
            s.close()
        socks = []
        with attach("default", "cpu0", socket_dir=d.socket_dir, timeout=10, keep_lease=False) as a:
            assert a.tensors
        assert "accepting again" in d.log()
    finally:
        for s in socks:
            s.close()
        d.stop()
        d.notify.close()
