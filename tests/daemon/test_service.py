"""A real daemon process over a real Unix socket; and, at the end, the
service's main loop, metrics and fill in this process."""

from __future__ import annotations

import contextlib
import gc
import grp
import logging
import os
import pwd
import re
import resource
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.daemon.inprocess import DEVICE, filled_holdings, open_policy, settings_for, until
from tests.helpers import (
    TEST_USER,
    NotifyListener,
    as_bytes,
    load_reference,
    one_model_config,
    require_other_users,
    run_as,
    run_daemon,
    start_daemon,
    write_sharded,
)
from wcached.client import attach
from wcached.client.connection import DaemonConnection
from wcached.config import ConfigError
from wcached.daemon.server import Server
from wcached.daemon.service import Service
from wcached.daemon.systemd import Notifier
from wcached.errors import (
    EX_CONFIG,
    EX_DATAERR,
    EX_SOFTWARE,
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    DaemonUnavailable,
    OutOfMemory,
    UnknownModel,
)
from wcached.loaders.safetensors import SafetensorsModel
from wcached.protocol.wire import close_fds


def test_every_tensor_bit_exact_with_load_file(cpu_config: Path, sharded_ckpt: Path) -> None:
    reference = load_reference(sharded_ckpt)
    with run_daemon(cpu_config) as d, attach("default", "cpu0", socket_dir=d.socket_dir) as a:
        assert len(a.manifest.segments) > 1  # 64KiB segments: packing across several
        for name, ref in reference.items():
            got = a.tensors[name]
            assert got.dtype == ref.dtype, name
            assert tuple(got.shape) == tuple(ref.shape), name
            assert torch.equal(as_bytes(got), as_bytes(ref)), name
        assert set(a.tensors) == set(reference) | {"lm_head.weight"}


def test_alias_shares_storage(cpu_config: Path) -> None:
    with run_daemon(cpu_config) as d, attach("default", "cpu0", socket_dir=d.socket_dir) as a:
        alias, target = a.tensors["lm_head.weight"], a.tensors["embed.weight"]
        assert alias.data_ptr() == target.data_ptr()
        entry = next(t for t in a.manifest.tensors if t.name == "lm_head.weight")
        assert entry.alias_of == "embed.weight"


def test_write_through_attached_tensor_faults_and_cache_stays_intact(cpu_config: Path) -> None:
    with run_daemon(cpu_config) as d:
        script = textwrap.dedent(
            f"""
            from wcached.client import attach
            a = attach("default", "cpu0", socket_dir={d.socket_dir!r})
            t = a.tensors["layer.0.fp32"]
            print("before", float(t[0]), flush=True)
            t.fill_(42.0)
            print("write went through", flush=True)
            """
        )
        r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert "before" in r.stdout
        assert "write went through" not in r.stdout
        assert r.returncode in (-signal.SIGSEGV, -signal.SIGBUS), (r.returncode, r.stderr)
        with attach("default", "cpu0", socket_dir=d.socket_dir) as a:
            assert not torch.any(a.tensors["layer.0.fp32"] == 42.0)
        assert d.proc.poll() is None


def test_concurrent_good_client_unaffected_by_bad_ones(cpu_config: Path) -> None:
    with run_daemon(cpu_config) as d:
        path = d.socket_path

        def raw() -> socket.socket:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(path)
            s.settimeout(10)
            return s

        silent = raw()  # never says hello
        stalled = raw()  # starts a frame and stops
        stalled.sendall(struct.pack(">I", 100) + b"\x81")
        garbage = raw()
        garbage.sendall(struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1")
        oversized = raw()
        oversized.sendall(struct.pack(">I", 50 * 1024 * 1024) + b"x" * 1024)

        results: list[object] = []

        def good() -> None:
            try:
                with attach("default", "cpu0", socket_dir=d.socket_dir) as a:
                    results.append(float(a.tensors["layer.0.fp32"].sum()))
            except Exception as e:  # pragma: no cover - reported below
                results.append(e)

        threads = [threading.Thread(target=good) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(results) == 4 and all(isinstance(r, float) for r in results), results

        # Garbage and oversized frames get a typed error reply.
        assert b"protocol" in garbage.recv(4096)
        assert b"frame_too_large" in _read_all(oversized)
        # Silent and stalled clients are dropped after the 2 s deadline.
        assert _read_all(silent) == b""
        assert _read_all(stalled) == b""
        for s in (silent, stalled, garbage, oversized):
            s.close()
        assert d.proc.poll() is None
        with attach("default", "cpu0", socket_dir=d.socket_dir) as a:
            assert len(a.tensors) > 0


def _read_all(s: socket.socket) -> bytes:
    """Until the daemon closes the connection. A TimeoutError (the socket's own
    10 s) is not swallowed: a client the daemon never drops fails the test."""
    out = b""
    try:
        while chunk := s.recv(4096):
            out += chunk
    except ConnectionResetError:
        pass
    return out


def test_bad_request_gets_error_and_connection_goes_on(cpu_config: Path) -> None:
    from wcached.client import DaemonConnection
    from wcached.errors import BadRequest, UnknownModel
    from wcached.protocol.messages import Attach, Attached

    with run_daemon(cpu_config) as d, DaemonConnection(d.socket_path) as conn:
        with pytest.raises(UnknownModel, match="serving: default"):
            conn.request(Attach(model="nope"))
        with pytest.raises(BadRequest, match="unknown cache key field"):
            conn.request(Attach(model="default", expect={"colour": "blue"}))
        reply = conn.request(Attach(model="default"))
        assert isinstance(reply, Attached)
        from wcached.protocol.wire import close_fds

        close_fds(conn.chan.recv_fds(reply.fd_count))


def test_second_daemon_fails_fast(cpu_config: Path) -> None:
    with run_daemon(cpu_config) as d:
        second = start_daemon(cpu_config)
        rc = second.proc.wait(15)
        assert rc == EX_TEMPFAIL
        assert f"already served by pid {d.proc.pid}" in second.log()
        assert d.proc.poll() is None
        with attach("default", "cpu0", socket_dir=d.socket_dir) as a:
            assert a.tensors


def test_ready_only_once_socket_accepts(work: Path) -> None:
    # Big enough that the fill takes a few progress ticks.
    ckpt = write_sharded(work / "big", {f"w{i}": torch.ones(1024, 1024) for i in range(48)}, shards=4)
    cfg = one_model_config(work, ckpt, read_threads=1)
    d = start_daemon(cfg)
    try:
        first = d.notify.wait_for("EXTEND_TIMEOUT_USEC=30000000", 30, d.proc)
        assert "READY=1" not in first
        msg = d.notify.wait_for("READY=1", 60, d.proc)
        # At READY, the socket must already accept and answer.
        with attach("default", "cpu0", socket_dir=d.socket_dir) as a:
            assert len(a.tensors) == 48
        assert "STATUS=serving 1 model(s)" in msg
        before_ready = d.notify.messages[: d.notify.messages.index(msg)]
        assert any(m.startswith("STATUS=filling") for m in before_ready)
        # Progress out of the checkpoint's 48 x 4 MiB = 0.2 GB, with a rate.
        statuses = [m.split("STATUS=", 1)[1] for m in before_ready if "STATUS=filling default: " in m]
        assert any(
            re.fullmatch(r"filling default: 0\.\d of 0\.2 GB, \d+\.\d\d GB/s.*", s) for s in statuses
        ), statuses
    finally:
        assert d.stop() == 0
        d.notify.close()
    # One journal line with the final figures: the rate over the reading of
    # the checkpoint, and every phase.
    assert re.search(
        r"filled default: 48 tensors, 0\.20 GB in \d+ segment\(s\) in [\d.]+ s "
        r"\(read 0\.20 GB in [\d.]+ s, [\d.]+ GB/s; headers [\d.]+ s, allocate [\d.]+ s, read [\d.]+ s, ",
        d.log(),
    ), d.log()


def test_sigterm_removes_socket_and_exits_zero(cpu_config: Path) -> None:
    with run_daemon(cpu_config) as d:
        assert stat.S_IMODE(os.stat(d.socket_path).st_mode) == 0o660
        assert stat.S_IMODE(os.stat(d.socket_dir).st_mode) == 0o750
        assert d.stop() == 0
        assert not os.path.exists(d.socket_path)
        d.notify.wait_for("STOPPING=1", 5)


def test_attached_client_survives_daemon_stop(cpu_config: Path) -> None:
    with run_daemon(cpu_config) as d:
        a = attach("default", "cpu0", socket_dir=d.socket_dir)
        before = as_bytes(a.tensors["embed.weight"]).clone()
        d.proc.kill()
        d.proc.wait()
        assert torch.equal(as_bytes(a.tensors["embed.weight"]), before)
        a.close()


def test_truncated_checkpoint_fails_fill_naming_file_and_tensor(work: Path) -> None:
    tensors = {"a": torch.ones(64, 64), "b": torch.ones(128, 64)}
    ckpt = write_sharded(work / "ckpt", tensors, shards=1)
    shard = ckpt / "model-00001-of-00001.safetensors"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 100)
    cfg = one_model_config(work, ckpt)
    d = start_daemon(cfg)
    rc = d.proc.wait(30)
    log = d.log()
    assert rc == EX_DATAERR, log
    assert str(shard) in log and "'b'" in log and "truncated" in log
    # The journal reads in order: the cause, then that the daemon stopped.
    assert log.index("truncated") < log.index(f"stopped (exit {EX_DATAERR})"), log
    assert "INFO wcached daemon: stopped\n" not in log
    assert not os.path.exists(d.socket_path)
    assert not any(m.startswith("READY=1") for m in d.notify.messages)


def test_missing_checkpoint_path_exits_69_for_a_retry(work: Path) -> None:
    """A path not there yet (a network filesystem still mounting) is a
    temporary failure the unit retries, not the permanent 65."""
    cfg = one_model_config(work, work / "not-mounted-yet")
    d = start_daemon(cfg)
    rc = d.proc.wait(30)
    log = d.log()
    assert rc == EX_UNAVAILABLE, log
    assert f"checkpoint {work / 'not-mounted-yet'} does not exist" in log
    assert "loader worker" not in log and "Traceback" not in log


def test_host_memory_exhausted_while_filling_exits_75_for_a_retry(work: Path) -> None:
    """Out of memory is temporary (engines may let go of memory): EX_TEMPFAIL,
    which the unit retries with a growing delay; here the worker's address
    space is capped below what a segment needs."""
    big = write_sharded(work / "big", {"w": torch.zeros(1024, 1024, 64)}, shards=1)  # 256 MiB
    cfg = one_model_config(work, big, segment_size="256MiB", read_threads=1)
    # The address-space cap is inherited by the loader worker, which then
    # cannot map the 256 MiB segment it fills.
    d = start_daemon(cfg, env={"MALLOC_ARENA_MAX": "1"}, rlimits={resource.RLIMIT_AS: 200 << 20})
    rc = d.proc.wait(60)
    log = d.log()
    assert rc == EX_TEMPFAIL, log
    assert "out of" in log and "memory" in log


def test_lock_left_by_another_user_names_owner_and_fix(work: Path, sharded_ckpt: Path) -> None:
    """A lock file a manual `wcached serve` as root left behind: the daemon's
    user cannot open it; exit 78 (no restart loop) naming file, owner, fix."""
    require_other_users()
    run = work / "run"
    run.mkdir()
    cfg = one_model_config(work, sharded_ckpt, run)
    lock = run / "cpu0.lock"
    lock.write_text("1\n")
    lock.chmod(0o600)  # root's
    os.chown(run, pwd.getpwnam("nobody").pw_uid, -1)
    r = run_as("nobody", [sys.executable, "-m", "wcached", "serve", "cpu0", "--config", str(cfg)])
    assert r.returncode == EX_CONFIG, r.stderr
    assert f"lock {lock} belongs to user root, not to nobody" in r.stderr
    assert f"if no daemon of instance cpu0 runs, fix it with: rm {lock}" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("problem", ["world-writable", "group-writable", "foreign-owner"])
def test_socket_dir_others_could_write_is_refused(work: Path, sharded_ckpt: Path, problem: str) -> None:
    run = work / "run"
    run.mkdir()
    if problem == "world-writable":
        run.chmod(0o1777)  # even with the sticky bit: a squatter can take the socket's name first
    elif problem == "group-writable":
        # The daemon's own group: the group engine users join.
        os.chown(run, -1, os.getegid())
        run.chmod(0o770)
    else:
        if os.getuid() != 0:
            pytest.skip("needs root to give the directory away")
        os.chown(run, pwd.getpwnam("nobody").pw_uid, -1)
    cfg = one_model_config(work, sharded_ckpt, run)
    d = start_daemon(cfg)
    assert d.proc.wait(30) == EX_CONFIG, d.log()
    log = d.log()
    assert "daemon.socket_dir" in log and f"chmod 0750 {run}" in log, log
    assert "loader worker" not in log and not list(run.iterdir())


def test_socket_appears_complete_and_no_temporary_name_remains(cpu_config: Path) -> None:
    with run_daemon(cpu_config) as d:
        names = os.listdir(d.socket_dir)
        assert sorted(names) == ["cpu0.lock", "cpu0.sock"], names
        assert stat.S_IMODE(os.stat(d.socket_path).st_mode) == 0o660


def test_lock_path_symlink_is_refused(work: Path, sharded_ckpt: Path) -> None:
    run = work / "run"
    run.mkdir()
    cfg = one_model_config(work, sharded_ckpt, run)
    target = work / "victim"
    target.write_text("precious\n")
    (run / "cpu0.lock").symlink_to(target)
    d = start_daemon(cfg)
    assert d.proc.wait(30) == EX_CONFIG, d.log()
    assert "is a symlink" in d.log()
    assert target.read_text() == "precious\n"


def test_unexpected_error_is_logged_with_traceback_and_exits_70(work: Path, sharded_ckpt: Path) -> None:
    """Anything unforeseen: its traceback at error priority, then EX_SOFTWARE
    (not Python's bare exit 1). A directory where the lock file goes stands
    in (a file at the socket directory's path, which stood in before, is now
    refused as a config mistake: tests/daemon/test_socket_dir.py)."""
    run = work / "run"
    run.mkdir(mode=0o750)
    (run / "cpu0.lock").mkdir()
    cfg = one_model_config(work, sharded_ckpt, run)
    d = start_daemon(cfg)
    assert d.proc.wait(30) == 70, d.log()
    log = d.log()
    assert "ERROR wcached daemon: unexpected error, exiting with 70" in log, log
    assert "Traceback" in log


def test_fill_without_progress_fails_after_fill_timeout(work: Path) -> None:
    """A checkpoint read that never returns (a FIFO stands in for a hung
    network filesystem): the fill fails after fill_timeout_s, exit 75."""
    ckpt = work / "ckpt"
    ckpt.mkdir()
    os.mkfifo(ckpt / "model.safetensors")
    cfg = one_model_config(work, ckpt, fill_timeout_s=2.0)
    d = start_daemon(cfg)
    rc = d.proc.wait(30)
    log = d.log()
    assert rc == EX_TEMPFAIL, log
    assert "the fill made no progress for 2 s (fill_timeout_s)" in log and str(ckpt) in log, log
    assert not os.path.exists(d.socket_path)


def test_config_error_exits_78_naming_file_and_key(work: Path) -> None:
    cfg = work / "wcached.toml"
    cfg.write_text('[daemon]\nsocket_dir = "run"\nsocket_dri = "typo"\n')
    r = subprocess.run(
        [sys.executable, "-m", "wcached", "serve", "cpu0", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == EX_CONFIG
    assert str(cfg) in r.stderr and "daemon.socket_dri" in r.stderr


def test_status_and_release(cpu_config: Path) -> None:
    import json

    from wcached.errors import ModelReleased

    with run_daemon(cpu_config) as d:
        a = attach("default", "cpu0", socket_dir=d.socket_dir, client="status-test")
        cmd = [sys.executable, "-m", "wcached"]
        r = subprocess.run(
            [*cmd, "status", "--config", str(cpu_config), "--json"], capture_output=True, text=True
        )
        assert r.returncode == 0, r.stderr
        (st,) = json.loads(r.stdout)
        assert st["instance"] == "cpu0" and st["state"] == "serving"
        (model,) = st["models"]
        assert model["name"] == "default" and model["tensors"] == len(a.manifest.tensors)
        assert model["bytes"] == a.manifest.total_bytes
        clients = {c["pid"]: c for c in st["clients"]}
        # The lease only: the status query itself is not one.
        assert list(clients) == [os.getpid()]
        assert clients[os.getpid()]["models"] == ["default"]
        assert clients[os.getpid()]["client"] == "status-test"

        table = subprocess.run(
            [*cmd, "status", "cpu0", "--config", str(cpu_config)], capture_output=True, text=True
        )
        assert "serving" in table.stdout and f"pid {os.getpid()}" in table.stdout

        r = subprocess.run(
            [*cmd, "release", "cpu0", "--model", "default", "--config", str(cpu_config)],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        assert "1 attached client(s)" in r.stdout
        # The attached client keeps reading; new attaches are refused.
        assert a.tensors["embed.weight"].float().abs().sum() > 0
        with pytest.raises(ModelReleased):
            attach("default", "cpu0", socket_dir=d.socket_dir)
        # Released comes before any key: not a mismatch to fall back from
        # as if another model were there.
        with pytest.raises(ModelReleased):
            attach("default", "cpu0", socket_dir=d.socket_dir, expect={"dtype": "float16"})
        a.close()
    r = subprocess.run([*cmd, "status", "--config", str(cpu_config)], capture_output=True, text=True)
    assert r.returncode == 3


def test_a_status_query_is_not_a_lease_in_the_units_status(cpu_config: Path) -> None:
    """systemctl status counts leases: a connection that only asks for status
    (held open the whole time) is not one."""
    from wcached.client.connection import DaemonConnection

    with run_daemon(cpu_config) as d:
        with DaemonConnection(d.socket_path, client="monitor") as conn:
            conn.status()
            with attach("default", "cpu0", socket_dir=d.socket_dir):
                d.notify.wait_for("STATUS=serving 1 model(s), 0.00 GiB, 1 client(s)", 10, d.proc)
                time.sleep(1.5)  # the main loop refreshes STATUS= within a second
                d.notify.drain()
        counts = [m for m in d.notify.messages if "client(s)" in m]
        assert not any("2 client(s)" in m for m in counts), counts


def test_unread_notify_socket_never_stalls_serving(cpu_config: Path) -> None:
    # A notify receiver that stops reading fills its queue (10 datagrams for
    # AF_UNIX); STATUS updates on every connect must not block accepts.
    with run_daemon(cpu_config) as d:
        for _ in range(40):
            with attach("default", "cpu0", socket_dir=d.socket_dir, timeout=5) as a:
                assert a.tensors


def test_stale_socket_of_a_killed_daemon_is_replaced_under_the_lock(cpu_config: Path) -> None:
    with run_daemon(cpu_config) as d:
        d.proc.kill()  # no cleanup: the socket file stays behind
        d.proc.wait()
        assert os.path.exists(d.socket_path)
        with pytest.raises(DaemonUnavailable, match="refuses connections"):
            attach("default", "cpu0", socket_dir=d.socket_dir)
    with run_daemon(cpu_config) as d2:
        assert "removing stale socket" in d2.log()
        with attach("default", "cpu0", socket_dir=d2.socket_dir) as a:
            assert a.tensors


def test_terminal_run_draws_a_progress_bar(work: Path) -> None:
    """`wcached serve` on a terminal: a bar per model, then the log."""
    import fcntl
    import pty
    import termios

    ckpt = write_sharded(work / "bar", {f"w{i}": torch.ones(512, 1024) for i in range(16)}, shards=2)
    cfg = one_model_config(work, ckpt, read_threads=1)
    primary, secondary = pty.openpty()
    # A terminal 120 columns wide (a fresh pty has none).
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "wcached", "serve", "cpu0", "--config", str(cfg)],
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
        env={k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"},
    )
    os.close(secondary)
    out = b""
    try:
        deadline = time.monotonic() + 60
        while b"serving cpu0" not in out and time.monotonic() < deadline:
            ready, _, _ = select.select([primary], [], [], 1.0)
            if ready:
                out += os.read(primary, 65536)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        os.close(primary)
    text = out.decode(errors="replace")
    # 16 x 2 MiB read: tqdm's bar reaches 33.6 MB, and the log follows it.
    assert "default: 100%" in text and "33.6M/33.6M" in text, text
    assert text.index("default: 100%") < text.index("serving cpu0"), text


def test_a_worker_killed_mid_fill_is_retried_not_called_corrupt(work: Path) -> None:
    """What the out-of-memory killer does to a big fill: SIGKILL to the
    worker. A worker that died says nothing about the checkpoint: exit 70
    (retried), the signal named, never "corrupt" (65, not retried)."""
    ckpt = work / "ckpt"
    ckpt.mkdir()
    os.mkfifo(ckpt / "model.safetensors")  # the worker blocks reading it
    cfg = one_model_config(work, ckpt)
    d = start_daemon(cfg)
    deadline = time.monotonic() + 30
    while not (m := re.search(r"loader worker pid (\d+) started", d.log())):
        assert d.proc.poll() is None and time.monotonic() < deadline, d.log()
        time.sleep(0.05)
    os.kill(int(m.group(1)), signal.SIGKILL)
    rc = d.wait_exit(30)
    log = d.log()
    assert rc == EX_SOFTWARE, log
    assert "loader worker was killed by SIGKILL" in log and "corrupt" not in log, log


def test_a_worker_that_dies_before_its_job_is_retried(work: Path, sharded_ckpt: Path) -> None:
    """An interpreter that exits at once (a broken virtualenv): no
    BrokenPipeError traceback, exit 70 naming the status."""
    broken = work / "python"
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    cfg = one_model_config(work, sharded_ckpt)
    cfg.write_text(cfg.read_text().replace("[daemon]\n", f'[daemon]\nworker_python = "{broken}"\n', 1))
    d = start_daemon(cfg)
    rc = d.wait_exit(30)
    log = d.log()
    assert rc == EX_SOFTWARE, log
    assert "loader worker exited with status 3" in log and "Traceback" not in log, log


def test_a_socket_dir_the_daemons_user_cannot_write_gets_a_fix_that_works(work: Path, sharded_ckpt) -> None:
    """root's directory, a daemon running as nobody: exit 78 with the fix,
    not "Permission denied ... a bug"; and the fix applied, it starts."""
    require_other_users()
    work.chmod(0o755)
    ckpt = Path(shutil.copytree(sharded_ckpt, work / "ckpt"))
    for p in [ckpt, *ckpt.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    run = work / "run"
    run.mkdir(mode=0o755)
    run.chmod(0o755)
    cfg = one_model_config(work, ckpt, run)
    cfg.chmod(0o644)
    argv = [sys.executable, "-m", "wcached", "serve", "cpu0", "--config", str(cfg)]
    r = run_as("nobody", argv, timeout=60)
    assert r.returncode == EX_CONFIG, r.stderr
    fix = r.stderr.split("fix with: ", 1)[1].strip().splitlines()[0]
    assert fix.startswith("chown nobody:") and "belongs to root, not to the daemon's user nobody" in r.stderr
    subprocess.run(fix, shell=True, check=True)
    proc = subprocess.Popen(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv],
        env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd="/",
    )
    try:
        deadline = time.monotonic() + 60
        while not (run / "cpu0.sock").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(15)


# -- the service's parts in this process ------------------------------------------
#
# The tests above run the daemon as the unit does; these hold a Service over a
# model filled in this process, so that each rule of its main loop, its
# metrics and its fill is stated on its own and checked in a second or less.


@contextlib.contextmanager
def _looping(
    work: Path, sharded_ckpt: Path, listener: NotifyListener | None = None, **settings: object
) -> Iterator[Service]:
    """A Service serving (its notifier talking to ``listener``), its main loop
    in a thread, stopped by SIGTERM as the unit stops it."""
    service = Service(settings_for(work / "run", **settings), DEVICE, open_policy())
    env = {"NOTIFY_SOCKET": listener.path} if listener else {}
    service.notifier = Notifier({**env, **{k: v for k, v in os.environ.items() if k == "WATCHDOG_USEC"}})
    service.holdings = filled_holdings(Path(shutil.copytree(sharded_ckpt, work / "ckpt")))
    (work / "run").mkdir()
    service._open_metrics()
    service.server = Server(service.settings, DEVICE, service.holdings, open_policy(), service.metrics)
    service.server.bind()
    service._write_textfile()
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    loop = threading.Thread(target=service._loop, args=(wake_r,), daemon=True)
    loop.start()
    try:
        yield service
    finally:
        service.stop_signal = signal.SIGTERM
        os.write(wake_w, b"x")
        loop.join(10)
        assert not loop.is_alive()
        service.server.close()
        service.holdings.close()
        service._close_metrics()
        os.close(wake_r)
        os.close(wake_w)


def _statuses(listener: NotifyListener) -> list[str]:
    listener.drain()
    return [m.removeprefix("STATUS=") for m in listener.messages if m.startswith("STATUS=")]


def test_the_status_line_is_sent_when_it_changes_only(work: Path, sharded_ckpt: Path, caplog) -> None:
    """An attach changes the line (one more client); a status query or an
    error reply changes nothing it says, so nothing is sent for them."""
    listener = NotifyListener(work)
    try:
        with caplog.at_level(logging.INFO, "wcached"), _looping(work, sharded_ckpt, listener) as service:
            path = service.settings.socket_path
            with DaemonConnection(path) as engine:
                close_fds(engine.attach("default")[1])
                gib = service.holdings.get("default").manifest.total_bytes / 2**30
                one = f"serving 1 model(s), {gib:.2f} GiB, 1 client(s)"
                assert until(lambda: one in _statuses(listener)), _statuses(listener)
                with DaemonConnection(path) as other:
                    other.status()
                    with pytest.raises(UnknownModel):
                        other.attach("nope")
                time.sleep(0.3)
            none = f"serving 1 model(s), {gib:.2f} GiB, 0 client(s)"
            assert until(lambda: none in _statuses(listener)), _statuses(listener)
        assert _statuses(listener) == [one, none]
        assert "received SIGTERM, stopping" in caplog.messages
    finally:
        listener.close()


def test_the_textfile_is_rewritten_once_per_burst_of_changes_and_refreshed_when_idle(
    work: Path, sharded_ckpt: Path, monkeypatch
) -> None:
    """Changes within METRICS_MIN_INTERVAL_S of a write are written together
    once it has passed; with no change the file is still rewritten every
    METRICS_REFRESH_S (its mtime says the daemon is alive)."""
    from wcached.daemon import metrics
    from wcached.daemon import service as service_mod

    (work / "prom").mkdir()
    writes: list[float] = []
    real = metrics.Metrics.write_textfile

    def counted(self, path: str) -> None:
        writes.append(time.monotonic())
        real(self, path)

    monkeypatch.setattr(metrics.Metrics, "write_textfile", counted)
    monkeypatch.setattr(service_mod, "METRICS_MIN_INTERVAL_S", 0.5)
    monkeypatch.setattr(service_mod, "METRICS_REFRESH_S", 30.0)
    with _looping(work, sharded_ckpt, metrics_dir=str(work / "prom")) as service:
        assert len(writes) == 1  # serving: written at once
        textfile = work / "prom" / "wcached-cpu0.prom"
        with DaemonConnection(service.settings.socket_path) as engine:
            for _ in range(5):
                close_fds(engine.attach("default")[1])
            assert until(lambda: len(writes) == 2)
            lines = textfile.read_text().splitlines()
            ok = next(x for x in lines if x.startswith("wcached_attaches_total{") and 'result="ok"' in x)
            assert ok.endswith(" 5.0"), ok
            time.sleep(0.7)
        assert len(writes) == 2, "five attaches within the interval: one write"
        assert writes[1] - writes[0] >= 0.5
        assert until(lambda: len(writes) == 3)  # the client that left
        monkeypatch.setattr(service_mod, "METRICS_REFRESH_S", 0.3)
        assert until(lambda: len(writes) >= 5, seconds=3), "no refresh while idle"
    assert not textfile.exists()  # a stopped instance's file goes


def test_a_textfile_that_cannot_be_written_is_said_once_per_streak(
    work: Path, sharded_ckpt: Path, monkeypatch, caplog
) -> None:
    from wcached.daemon import metrics

    (work / "prom").mkdir()
    service = Service(settings_for(work / "run", metrics_dir=str(work / "prom")), DEVICE, open_policy())
    service._open_metrics()
    failing = [True, True, False, True]
    real = metrics.Metrics.write_textfile

    def flaky(self, path: str) -> None:
        if failing.pop(0):
            raise OSError(28, "No space left on device")
        real(self, path)

    monkeypatch.setattr(metrics.Metrics, "write_textfile", flaky)
    with caplog.at_level(logging.INFO, "wcached.service"):
        for _ in range(4):
            service._write_textfile()
    textfile = str(work / "prom" / "wcached-cpu0.prom")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", f"cannot write metrics to {textfile}: [Errno 28] No space left on device"),
        ("INFO", f"writing metrics to {textfile} again"),
        ("WARNING", f"cannot write metrics to {textfile}: [Errno 28] No space left on device"),
    ]
    assert os.path.exists(textfile)  # the write between the streaks
    service._close_metrics()
    assert not os.path.exists(textfile)


def test_a_stale_textfile_that_cannot_be_removed_is_a_config_error_naming_the_key(
    work: Path, monkeypatch
) -> None:
    from wcached.daemon import service as service_mod

    (work / "prom").mkdir()
    service = Service(
        settings_for(work / "run", metrics_dir=str(work / "prom"), source="/etc/wcache/wcached.toml"),
        DEVICE,
        open_policy(),
    )

    def refused(path: str) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(service_mod, "remove_textfile", refused)
    with pytest.raises(ConfigError) as e:
        service._open_metrics()
    assert str(e.value) == (
        "/etc/wcache/wcached.toml: key 'daemon.metrics_dir': cannot remove the stale "
        f"{work / 'prom' / 'wcached-cpu0.prom'}: [Errno 1] Operation not permitted"
    )


def test_a_textfile_that_cannot_be_removed_at_stop_is_logged(work: Path, monkeypatch, caplog) -> None:
    from wcached.daemon import service as service_mod

    (work / "prom").mkdir()
    service = Service(settings_for(work / "run", metrics_dir=str(work / "prom")), DEVICE, open_policy())
    service._open_metrics()
    monkeypatch.setattr(service_mod, "remove_textfile", lambda path: (_ for _ in ()).throw(OSError(5, "I/O")))
    with caplog.at_level(logging.WARNING, "wcached.service"):
        service._close_metrics()
    assert caplog.messages == [f"cannot remove {work / 'prom' / 'wcached-cpu0.prom'}: [Errno 5] I/O"]


def test_the_watchdog_is_fed_only_while_the_socket_answers(
    work: Path, sharded_ckpt: Path, monkeypatch
) -> None:
    from wcached.daemon import liveness

    healthy = [True]
    monkeypatch.setattr(liveness.ServingProbe, "healthy", lambda self: healthy[0])
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # a ping due every 0.1 s
    listener = NotifyListener(work)

    def pings() -> int:
        listener.drain()
        return listener.messages.count("WATCHDOG=1")

    try:
        with _looping(work, sharded_ckpt, listener):
            assert until(lambda: pings() >= 4)
            healthy[0] = False
            time.sleep(0.15)
            stopped_at = pings()
            time.sleep(0.5)
            assert pings() == stopped_at, "pinged while the socket did not answer"
            healthy[0] = True
            assert until(lambda: pings() > stopped_at)
    finally:
        listener.close()


def test_accepts_paused_for_running_out_of_fds_resume_and_serve(
    work: Path, sharded_ckpt: Path, monkeypatch
) -> None:
    """The listener is left alone for ACCEPT_PAUSE_S (no spinning on it),
    then polled again: a client that waited in the backlog is served."""
    from wcached.daemon import service as service_mod

    monkeypatch.setattr(service_mod, "ACCEPT_PAUSE_S", 0.3)
    calls: list[float] = []
    real = Server.accept_pending

    def starved_once(self) -> bool:
        calls.append(time.monotonic())
        return False if len(calls) == 1 else real(self)

    monkeypatch.setattr(Server, "accept_pending", starved_once)
    with _looping(work, sharded_ckpt) as service:
        started = time.monotonic()
        with DaemonConnection(service.settings.socket_path, timeout=5) as conn:
            conn.status()
        assert len(calls) == 2, "polled the listener while paused"
        assert calls[1] - calls[0] >= 0.25 and time.monotonic() - started >= 0.25
        # ... and not a whole tick of the loop later (1 s: the earliest a
        # loop that ignored the pause's end would look again).
        assert calls[1] - calls[0] < 0.95, calls


def test_a_fill_said_to_systemd_and_stopped_by_a_signal_keeps_nothing_half_done(
    work: Path, sharded_ckpt: Path, monkeypatch, caplog
) -> None:
    """While filling, each tick asks systemd for more start time and says
    the progress; SIGTERM mid-fill ends it without serving (the model is
    recorded as failed "stopped by a signal") and says STOPPING."""
    from wcached.daemon import service as service_mod
    from wcached.daemon.filler import FillAborted

    listener = NotifyListener(work)
    model = SafetensorsModel(name="default", path=str(sharded_ckpt), segment_size=64 * 1024)
    service = Service(settings_for(work / "run", models=(model,)), DEVICE, open_policy())
    service.notifier = Notifier({"NOTIFY_SOCKET": listener.path})

    def fill(settings, device, tick, stopped, filled) -> None:
        assert [m.name for m in settings.models] == ["default"]
        tick("default", 1 << 20, 4 << 20)
        service.stop_signal = signal.SIGTERM
        assert stopped()
        raise FillAborted()

    monkeypatch.setattr(service_mod, "fill_models", fill)
    try:
        with caplog.at_level(logging.INFO, "wcached.service"):
            assert service._fill(service.holdings.to_fill()) is False
        assert caplog.messages == ["stopped by signal 15 while filling"]
        listener.drain()
        assert listener.messages.count("EXTEND_TIMEOUT_USEC=30000000") == 2
        assert any(m.startswith("STATUS=filling default") for m in listener.messages), listener.messages
        assert listener.messages[-1].startswith("STOPPING=1")
        assert service.holdings.slots["default"].state == "failed"
        assert service.holdings.slots["default"].reason == "stopped by a signal"
        assert service._fill([]) is True
    finally:
        service.holdings.close()
        listener.close()


def test_a_fill_that_fails_records_why_and_raises_it(work: Path, sharded_ckpt: Path, monkeypatch) -> None:
    from wcached.daemon import service as service_mod
    from wcached.errors import CheckpointCorrupt

    model = SafetensorsModel(name="default", path=str(sharded_ckpt), segment_size=64 * 1024)
    service = Service(settings_for(work / "run", models=(model,)), DEVICE, open_policy())

    def fill(*args) -> None:
        raise CheckpointCorrupt("model.safetensors: tensor w ends early")

    monkeypatch.setattr(service_mod, "fill_models", fill)
    with pytest.raises(CheckpointCorrupt):
        service._fill(service.holdings.to_fill())
    assert service.holdings.slots["default"].state == "failed"
    assert service.holdings.slots["default"].reason == "model.safetensors: tensor w ends early"
    service.holdings.close()


def test_a_missing_socket_dir_is_made_0750_and_a_link_in_its_place_refused(work: Path) -> None:
    from wcached.daemon.service import prepare_socket_dir

    made = work / "made" / "run"
    prepare_socket_dir(str(made))
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o750
    prepare_socket_dir(str(made))  # there already: left as it is
    (work / "link").symlink_to(made)
    with pytest.raises(ConfigError, match=r"daemon\.socket_dir") as e:
        prepare_socket_dir(str(work / "link"), "/etc/wcache/wcached.toml")
    assert str(e.value).startswith(f"/etc/wcache/wcached.toml: key 'daemon.socket_dir': {work / 'link'} ")
    assert "fix with: " in str(e.value)
    (work / "file").write_text("")
    with pytest.raises(ConfigError) as e:
        prepare_socket_dir(str(work / "file"))
    assert str(e.value).startswith(f"<config>: key 'daemon.socket_dir': {work / 'file'} is not a directory")


def test_a_socket_dir_another_instance_made_meanwhile_is_taken_as_it_is(work: Path, monkeypatch) -> None:
    """Instances started together share the socket dir: one may make it
    between another's look and its own mkdir, which is no failure."""
    from wcached.daemon import service as service_mod

    run = work / "run"
    run.mkdir(mode=0o750)
    real_lexists = os.path.lexists
    monkeypatch.setattr(service_mod.os.path, "lexists", lambda p: p != str(run) and real_lexists(p))
    service_mod.prepare_socket_dir(str(run))  # "not there" when looked at, there when made
    assert stat.S_IMODE(os.stat(run).st_mode) == 0o750


@pytest.mark.parametrize(
    ("raised", "status", "journal", "said"),
    [
        (None, 0, ["stopped"], None),
        (
            OutOfMemory("no host memory for default.3"),
            EX_TEMPFAIL,
            [("ERROR", "no host memory for default.3"), "stopped (exit 75)"],
            "failed: no host memory for default.3",
        ),
        (
            RuntimeError("boom"),
            EX_SOFTWARE,
            [("ERROR", "unexpected error, exiting with 70: boom"), "stopped (exit 70)"],
            "failed: unexpected RuntimeError: boom",
        ),
    ],
    ids=["stopped", "temporary-cause", "unexpected"],
)
def test_serve_ends_with_its_causes_status_said_to_the_journal_and_systemd(
    work: Path, sharded_ckpt: Path, monkeypatch, caplog, raised, status, journal, said
) -> None:
    """The cause first, then that it stopped; an unexpected error with its
    traceback and exit 70, never a bare exit 1; STATUS= says "failed: ..."."""
    from wcached.daemon import service as service_mod

    cfg = one_model_config(work, sharded_ckpt)
    listener = NotifyListener(work)
    monkeypatch.setenv("NOTIFY_SOCKET", listener.path)
    monkeypatch.setattr(service_mod, "setup_logging", lambda *a, **k: None)

    def run(self) -> int:
        if raised is not None:
            raise raised
        return 0

    monkeypatch.setattr(Service, "run", run)
    try:
        with caplog.at_level(logging.INFO, "wcached.service"):
            assert service_mod.serve("cpu0", str(cfg)) == status
        records = [r for r in caplog.records if "starting" not in r.getMessage()]
        got = [r.getMessage() if r.levelname == "INFO" else (r.levelname, r.getMessage()) for r in records]
        assert got == journal
        assert (records[0].exc_info is not None) == isinstance(raised, RuntimeError)
        listener.drain()
        statuses = [m for m in listener.messages if m.startswith("STATUS=")]
        assert statuses == ([f"STATUS={said}"] if said else [])
    finally:
        listener.close()


def test_serve_of_an_instance_with_no_model_is_a_config_error_naming_the_file(
    work: Path, sharded_ckpt: Path, monkeypatch, caplog
) -> None:
    from wcached.daemon import service as service_mod

    cfg = one_model_config(work, sharded_ckpt)
    cfg.write_text(cfg.read_text() + '\n[instance."cpu0"]\nmodels = []\n')
    monkeypatch.setattr(service_mod, "setup_logging", lambda *a, **k: None)
    with caplog.at_level(logging.INFO, "wcached.service"):
        assert service_mod.serve("cpu0", str(cfg)) == EX_CONFIG
    assert caplog.messages == [f"{cfg}: key 'model': no [[model]] is configured for cpu0"]


def test_the_worker_and_a_fills_provenance_name_one_interpreter(work: Path) -> None:
    """The Python a fill's provenance records is the one the worker runs."""
    for worker_python, want in (("", sys.executable), ("/opt/engine/bin/python3", "/opt/engine/bin/python3")):
        service = Service(settings_for(work / "run", worker_python=worker_python), DEVICE, open_policy())
        assert service.holdings.python == want
        service.holdings.close()


def _two_models(ckpt: Path) -> tuple[SafetensorsModel, SafetensorsModel]:
    return tuple(SafetensorsModel(name=n, path=str(ckpt), segment_size=64 * 1024) for n in ("a", "b"))


def test_a_fill_is_said_from_its_first_line_and_ends_with_its_count_and_time(
    work: Path, sharded_ckpt: Path, monkeypatch, caplog
) -> None:
    """Only the models to fill go to the worker; systemd hears "filling" before
    the first tick; the journal gets how many were filled and in what time."""
    from wcached.daemon import service as service_mod
    from wcached.daemon.progress import FillMeter

    listener = NotifyListener(work)
    service = Service(settings_for(work / "run", models=_two_models(sharded_ckpt)), DEVICE, open_policy())
    service.notifier = Notifier({"NOTIFY_SOCKET": listener.path})
    sent: list[tuple[str, ...]] = []

    def fill(settings, device, tick, stopped, filled) -> None:
        sent.append(tuple(m.name for m in settings.models))
        time.sleep(0.05)

    monkeypatch.setattr(service_mod, "fill_models", fill)
    try:
        with caplog.at_level(logging.INFO, "wcached.service"):
            assert service._fill([service.settings.models[1]]) is True
        assert sent == [("b",)]
        listener.drain()
        assert listener.messages[0] == f"STATUS={FillMeter(['b']).status_line()}"
        (line,) = caplog.messages
        m = re.fullmatch(r"filled 1 model\(s\) in (\d+\.\d\d) s", line)
        assert m and 0.05 <= float(m.group(1)) < 5, line
    finally:
        service.holdings.close()
        listener.close()


@pytest.mark.parametrize("tty", [True, False])
def test_a_fill_draws_its_bar_only_on_a_terminal(
    work: Path, sharded_ckpt: Path, monkeypatch, tty: bool
) -> None:
    """On a terminal the bar goes to stderr; under the unit stderr is the
    journal, where a bar would be a line per redraw."""
    import io

    from wcached.daemon import service as service_mod

    class Stderr(io.StringIO):
        def isatty(self) -> bool:
            return tty

    stderr = Stderr()
    monkeypatch.setattr(sys, "stderr", stderr)
    bars: list[object] = []
    real = service_mod.FillMeter

    def meter(names, bar_stream=None):
        bars.append(bar_stream)
        return real(names, bar_stream=None)

    monkeypatch.setattr(service_mod, "FillMeter", meter)
    monkeypatch.setattr(service_mod, "fill_models", lambda *a: None)
    service = Service(settings_for(work / "run", models=_two_models(sharded_ckpt)), DEVICE, open_policy())
    try:
        service._fill(list(service.settings.models))
    finally:
        service.holdings.close()
    assert bars == [stderr if tty else None]


def test_the_status_line_counts_models_gib_and_clients() -> None:
    from types import SimpleNamespace

    service = Service.__new__(Service)
    held = {
        n: SimpleNamespace(manifest=SimpleNamespace(total_bytes=b))
        for n, b in (("a", 3 << 30), ("b", 1 << 29))
    }
    service.holdings = SimpleNamespace(served=held)
    service.server = SimpleNamespace(client_count=2)
    assert service._status_line() == "serving 2 model(s), 3.50 GiB, 2 client(s)"


def test_a_loop_with_no_textfile_sleeps_between_changes(work: Path, sharded_ckpt: Path) -> None:
    """A change (an attach) with no textfile to write leaves nothing due: the
    loop goes back to its one-second tick instead of turning without rest."""
    with _looping(work, sharded_ckpt) as service:
        turns = [0]
        real = service.notifier.flush

        def counted() -> None:
            turns[0] += 1
            real()

        service.notifier.flush = counted
        with DaemonConnection(service.settings.socket_path) as engine:
            close_fds(engine.attach("default")[1])
        assert until(lambda: not service.server.changed.is_set())
        before = turns[0]
        time.sleep(0.6)
        assert turns[0] - before <= 3, f"the loop turned {turns[0] - before} times in 0.6 s"


def _run_in_main_thread(service: Service, while_running=None) -> int:
    """``service.run()`` here, as serve calls it (signals are the main
    thread's); ``while_running(service)`` on a thread once the socket answers,
    then SIGTERM. A run that ends on its own (an error, a stop mid-fill) is
    not signalled. The process's signal handling is put back only once that
    thread is done: a SIGTERM that raced the end of the run still meets the
    service's handler, never the default one (which would end the tests)."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    failed: list[BaseException] = []
    ended = threading.Event()

    def drive() -> None:
        try:
            deadline = time.monotonic() + 60
            while service.server is None or service.server.listener is None:
                if ended.is_set():
                    return
                if time.monotonic() > deadline:
                    raise AssertionError("the service never served")
                time.sleep(0.02)
            if while_running is not None:
                while_running(service)
        except BaseException as e:
            failed.append(e)
        if not ended.is_set():
            os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=drive, daemon=True)
    t.start()
    try:
        status = service.run()
    finally:
        ended.set()
        t.join(70)
        assert not t.is_alive(), "the driving thread is stuck: handlers left as the service set them"
        for s, h in saved.items():
            signal.signal(s, h)
    if failed:
        raise failed[0]
    return status


def test_a_run_replaces_a_stale_socket_says_what_it_serves_and_counts_attaches(work: Path, caplog) -> None:
    ckpt = write_sharded(work / "c", {"w": torch.ones(3 << 18)})  # 3 MiB
    model = SafetensorsModel(name="default", path=str(ckpt))
    run = work / "run"
    run.mkdir(mode=0o750)
    (work / "prom").mkdir()
    source = str(work / "wcached.toml")
    service = Service(
        settings_for(run, models=(model,), metrics_dir=str(work / "prom"), source=source),
        DEVICE,
        open_policy(),
    )
    path = service.settings.socket_path
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()  # a killed daemon's socket file: nothing listens on it
    counted: list[str] = []

    def attach_once(service: Service) -> None:
        with DaemonConnection(path) as engine:
            close_fds(engine.attach("default")[1])
        textfile = work / "prom" / "wcached-cpu0.prom"

        def ok_line() -> str:
            lines = textfile.read_text().splitlines() if textfile.exists() else []
            return next(
                (x for x in lines if x.startswith("wcached_attaches_total{") and 'result="ok"' in x), ""
            )

        assert until(lambda: ok_line().endswith(" 1.0"), seconds=5), ok_line()
        counted.append(ok_line())

    with caplog.at_level(logging.INFO, "wcached.service"):
        assert _run_in_main_thread(service, attach_once) == 0
    assert counted
    assert f"removing stale socket {path}" in caplog.messages
    assert f"serving cpu0 on {path}: default (3.0 MiB)" in caplog.messages
    assert "received SIGTERM, stopping" in caplog.messages
    assert not os.path.exists(path)


def test_a_run_gives_back_its_wakeup_pipe_and_the_wakeup_fd_it_replaced(work: Path) -> None:
    """A run (the in-process tests make several, an embedding caller may
    too) leaves no fd behind, and the process's signal wakeup fd is again
    the one it found, whether it served or failed before serving."""
    ckpt = write_sharded(work / "c", {"w": torch.ones(1 << 10)})
    model = SafetensorsModel(name="default", path=str(ckpt))
    served, refused = work / "run", work / "open"
    served.mkdir(mode=0o750)
    refused.mkdir()
    refused.chmod(0o777)  # refused before the fill
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(w)
    try:
        for run_dir in (served, refused):
            service = Service(settings_for(run_dir, models=(model,)), DEVICE, open_policy())
            gc.collect()  # not an earlier test's leaked socket closed mid-run
            before = sorted(os.listdir("/proc/self/fd"))
            if run_dir is served:
                assert _run_in_main_thread(service) == 0
            else:
                with pytest.raises(ConfigError):
                    _run_in_main_thread(service)
            assert sorted(os.listdir("/proc/self/fd")) == before, run_dir
            assert signal.set_wakeup_fd(w) == w, run_dir
    finally:
        signal.set_wakeup_fd(-1)
        os.close(r)
        os.close(w)


def test_a_run_off_the_main_thread_is_refused_and_leaves_no_fd(work: Path) -> None:
    service = Service(settings_for(work / "run"), DEVICE, open_policy())
    raised: list[BaseException] = []

    def run() -> None:
        try:
            service.run()
        except BaseException as e:
            raised.append(e)

    gc.collect()
    before = sorted(os.listdir("/proc/self/fd"))
    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert len(raised) == 1 and isinstance(raised[0], ValueError), raised  # signals are the main thread's
    assert sorted(os.listdir("/proc/self/fd")) == before
    assert not (work / "run").exists()  # refused before anything was made


def test_a_run_serving_two_models_names_both(work: Path, sharded_ckpt: Path, caplog) -> None:
    run = work / "run"
    run.mkdir(mode=0o750)
    service = Service(settings_for(run, models=_two_models(sharded_ckpt)), DEVICE, open_policy())
    with caplog.at_level(logging.INFO, "wcached.service"):
        assert _run_in_main_thread(service) == 0
    serving = [m for m in caplog.messages if m.startswith("serving cpu0 on ")]
    assert len(serving) == 1 and re.fullmatch(
        rf"serving cpu0 on {re.escape(service.settings.socket_path)}: a, b \(\d+\.\d MiB\)", serving[0]
    ), serving


def test_a_run_stopped_while_filling_exits_zero_and_binds_nothing(
    work: Path, sharded_ckpt: Path, monkeypatch
) -> None:
    from wcached.daemon import service as service_mod
    from wcached.daemon.filler import FillAborted

    service = Service(settings_for(work / "run", models=_two_models(sharded_ckpt)[:1]), DEVICE, open_policy())

    def fill(settings, device, tick, stopped, filled) -> None:
        service.stop_signal = signal.SIGTERM
        raise FillAborted()

    monkeypatch.setattr(service_mod, "fill_models", fill)
    assert _run_in_main_thread(service) == 0
    assert service.server is None and not os.path.exists(service.settings.socket_path)


def test_a_run_on_a_socket_dir_others_can_write_names_the_config_file(work: Path) -> None:
    run = work / "run"
    run.mkdir()
    run.chmod(0o777)
    source = str(work / "wcached.toml")
    service = Service(settings_for(run, source=source), DEVICE, open_policy())
    with pytest.raises(ConfigError) as e:
        _run_in_main_thread(service)
    assert str(e.value).startswith(f"{source}: key 'daemon.socket_dir': {run} is writable by others")


def test_metrics_say_where_they_listen_and_name_the_file_of_a_key_that_fails(work: Path, caplog) -> None:
    source = str(work / "wcached.toml")
    port = _free_port()
    first = Service(settings_for(work / "run", metrics_port=port, source=source), DEVICE, open_policy())
    with caplog.at_level(logging.INFO, "wcached.service"):
        first._open_metrics()
    try:
        assert caplog.messages == [f"metrics on http://127.0.0.1:{port}/metrics"]
        second = Service(first.settings, DEVICE, open_policy())
        with pytest.raises(ConfigError) as e:
            second._open_metrics()
        assert str(e.value).startswith(
            f"{source}: key 'daemon.metrics_port': 127.0.0.1:{port} is already in use"
        )
        missing = Service(
            settings_for(work / "run", metrics_dir=str(work / "nowhere"), source=source),
            DEVICE,
            open_policy(),
        )
        with pytest.raises(ConfigError) as e:
            missing._open_metrics()
        assert str(e.value).startswith(f"{source}: key 'daemon.metrics_dir'")
    finally:
        first._close_metrics()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_logs_as_its_instance_resolves_it_without_cuda_and_applies_its_table_by_any_name(
    work: Path, sharded_ckpt: Path, monkeypatch, caplog
) -> None:
    """Logging is set up for the instance first (its name in every line), then
    at the configured level; the device is resolved isolated (no CUDA context
    in the daemon); an instance table named by the GPU's index applies to the
    instance named by its UUID; the first line says version, instance, device
    and config file."""
    from wcached import __version__
    from wcached.daemon import service as service_mod
    from wcached.device import Device

    cfg = one_model_config(work, sharded_ckpt)
    cfg.write_text(cfg.read_text() + '\n[instance."0"]\nmax_clients = 3\n')
    uuid = "GPU-0a1b2c3d-0000-0000-0000-000000000000"
    logging_set: list[tuple] = []
    resolved: list[tuple] = []
    ran: list[Service] = []

    def resolve(instance: str, **kw) -> Device:
        resolved.append((instance, kw))
        return Device("cuda", uuid, 0, "NVIDIA H200", ("0",), 1 << 30)

    monkeypatch.setattr(service_mod, "setup_logging", lambda *a, **k: logging_set.append((a, k)))
    monkeypatch.setattr(service_mod, "resolve_instance", resolve)
    monkeypatch.setattr(Service, "run", lambda self: ran.append(self) or 0)
    with caplog.at_level(logging.INFO, "wcached.service"):
        assert service_mod.serve(uuid, str(cfg)) == 0
    assert logging_set == [(("info",), {"instance": uuid}), (("info",), {})]
    assert resolved == [(uuid, {"isolated": True})]
    (service,) = ran
    assert service.settings.instance_id == uuid and service.settings.max_clients == 3
    assert caplog.messages == [f"wcached {__version__} starting {uuid} (NVIDIA H200) with {cfg}", "stopped"]
    ran[0].holdings.close()


@pytest.mark.parametrize(
    ("table", "key"),
    [
        ('[daemon]\nallowed_users = ["no-such-user-here"]\n', "daemon.allowed_users[0]"),
        ('[instance."cpu0"]\nallowed_groups = ["no-such-group-here"]\n', "instance.cpu0.allowed_groups[0]"),
    ],
)
def test_serve_names_the_file_and_key_of_a_name_that_does_not_resolve(
    work: Path, sharded_ckpt: Path, monkeypatch, caplog, table: str, key: str
) -> None:
    from wcached.daemon import service as service_mod

    cfg = one_model_config(work, sharded_ckpt)
    text = cfg.read_text()
    cfg.write_text(
        text.replace("[daemon]\n", table, 1) if table.startswith("[daemon]") else text + "\n" + table
    )
    monkeypatch.setattr(service_mod, "setup_logging", lambda *a, **k: None)
    with caplog.at_level(logging.INFO, "wcached.service"):
        assert service_mod.serve("cpu0", str(cfg)) == EX_CONFIG
    assert caplog.messages[-1].startswith(f"{cfg}: key '{key}': no such ")


def test_the_socket_dir_is_judged_for_the_user_asked_about(work: Path, monkeypatch) -> None:
    """serve judges it for itself (root included: a daemon run as root owns
    its directory); check-config for the daemon's user it is given, and its
    fix names that user."""
    from wcached import defaults
    from wcached.daemon.service import check_socket_dir

    mine = work / "mine"
    mine.mkdir(mode=0o750)
    check_socket_dir(str(mine))  # this process's own: right for it
    other = pwd.getpwnam("nobody").pw_uid
    with pytest.raises(ConfigError) as e:
        check_socket_dir(str(mine), "/etc/wcache/wcached.toml", owner_uid=other)
    assert str(e.value).startswith(f"/etc/wcache/wcached.toml: key 'daemon.socket_dir': {mine} belongs to ")
    assert "not to the daemon's user nobody" in str(e.value)
    assert f"fix with: chown nobody:{grp.getgrgid(pwd.getpwnam('nobody').pw_gid).gr_name} {mine}" in str(
        e.value
    )
    with pytest.raises(ConfigError) as e:
        check_socket_dir(str(mine), owner_uid=other)
    assert str(e.value).startswith("<config>: key 'daemon.socket_dir': ")
    if os.geteuid() == 0:
        # For root the package's user is whom a check run as root speaks for;
        # the daemon itself, run as root, is judged as root.
        monkeypatch.setattr(defaults, "DAEMON_USER", TEST_USER)
        check_socket_dir(str(mine))
