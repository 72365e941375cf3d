"""Leases across daemon restarts (wcached.client.lease): one watcher thread a
process, quiet about planned restarts, patient with a daemon coming back."""

from __future__ import annotations

import gc
import itertools
import logging
import os
import shutil
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import (
    Daemon,
    one_model_config,
    open_fds,
    start_daemon,
    tied_model_config,
    wait_ready,
    write_config,
)
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


def _two_models_attached(work: Path, ckpt: Path):
    """The config of a daemon serving "target" and "draft" from one
    checkpoint, the daemon, and this process attached to both."""
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
    return cfg, d, target, attach("draft", "cpu0", socket_dir=d.socket_dir)


def test_one_watcher_for_all_attachments_and_a_planned_restart_is_no_warning(
    work: Path, ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg, d, target, draft = _two_models_attached(work, ckpt)
    try:
        assert _lease_threads() == ["wcached-leases"]
        with caplog.at_level(logging.INFO, "wcached.client"):
            d = _restarted(d, cfg)
            _wait_reattached(target, draft)
        messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "wcached.client"]
        assert not [m for level, m in messages if level >= logging.WARNING], messages
        # What journalctl shows of a routine restart: for each model, that
        # its lease ended at which socket, then that it is back, and how soon.
        for model in ("target", "draft"):
            assert (
                logging.INFO,
                f"wcached: the daemon at {d.socket_path} ended the lease on {model} "
                "(stopped or restarting); attaching again",
            ) in messages, messages
            back = [m for _, m in messages if m.startswith(f"wcached: attached again to {model} at ")]
            assert len(back) == 1, messages
            assert back[0].startswith(f"wcached: attached again to {model} at {d.socket_path} after "), back
            assert back[0].endswith(" s: the same memory, tensors unchanged"), back
            away = float(back[0].rsplit(" after ", 1)[1].split(" s:", 1)[0])
            assert 0.0 <= away < 20.0, back
        assert target.watch.reattached == draft.watch.reattached == 1
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
        # The warning says why it is not back (the last attempt's error), and
        # the return how long the daemon was away (more than WARN_AFTER_S).
        assert warnings[0].startswith(f"wcached: the daemon at {d.socket_path} is not back after "), warnings
        assert f"(no daemon socket at {d.socket_path})" in warnings[0] or "refuses connections" in warnings[0]
        assert warnings[0].endswith("this process keeps its weights of default and attaches again when it is")
        away = float(warnings[1].rsplit(" after ", 1)[1].split(" s:", 1)[0])
        assert 0.5 <= away < 30.0, warnings
        # The first says how long it has been away so far, no more than the return.
        so_far = float(warnings[0].split(" is not back after ", 1)[1].split(" s ", 1)[0])
        assert 0 <= so_far <= away + 1, warnings
        assert a.watch.reattached == 1
    finally:
        a.close()
        d.stop()
        d.notify.close()


def _own_fds(d: Daemon) -> dict[int, str]:
    """This process's open fds and what they are, less those the stand-in for
    systemd holds (its socket and the fd store's copies)."""
    d.notify.drain()
    theirs = {fd for _, fd in d.notify.store} | {d.notify.sock.fileno()}
    return {fd: what for fd, what in open_fds().items() if fd not in theirs}


def _mapping_of(address: int) -> str:
    """What /proc/self/maps says is mapped at ``address`` (device, inode, name)."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end:
                return " ".join(fields[3:])
    raise AssertionError(f"nothing mapped at {address:#x}")


def test_restarts_leak_no_fds_and_the_lease_keeps_the_same_memory(work: Path, ckpt: Path) -> None:
    """An engine lives through many daemon restarts: each re-attach leaves its
    fd count as it was, and its tensors stay the very memory the restored
    daemon serves (what a new attach maps), not a copy."""
    cfg = tied_model_config(work, ckpt, "64KiB")
    d = _up(cfg)
    a = attach("default", "cpu0", socket_dir=d.socket_dir)
    try:
        ptrs = {n: t.data_ptr() for n, t in a.tensors.items()}
        where = _mapping_of(a.tensors["embed.weight"].data_ptr())
        assert "memfd:" in where, where
        gc.collect()  # earlier tests' attachments close their fds when collected, not during ours
        before = _own_fds(d)
        for i in range(3):
            d = _restarted(d, cfg)
            deadline = time.monotonic() + 20
            while a.watch.reattached < i + 1:
                assert time.monotonic() < deadline, d.log()
                time.sleep(0.05)
            assert "restored default from the fd store" in d.log(), d.log()
        settled = time.monotonic() + 2  # a re-attach in flight holds an fd for a moment
        while len(after := _own_fds(d)) != len(before) and time.monotonic() < settled:
            time.sleep(0.1)
        assert len(after) == len(before), {fd: after[fd] for fd in sorted(set(after) - set(before))}
        assert {n: t.data_ptr() for n, t in a.tensors.items()} == ptrs
        with attach("default", "cpu0", socket_dir=d.socket_dir, keep_lease=False) as new:
            assert _mapping_of(new.tensors["embed.weight"].data_ptr()) == where
        with DaemonConnection(d.socket_path) as conn:
            assert os.getpid() in [c.pid for c in conn.status().clients]
    finally:
        a.close()
        d.stop()
        d.notify.close()


def _not_taken_up(a, d: Daemon, caplog: pytest.LogCaptureFixture) -> None:
    """The daemon came back holding another fill: the lease is not taken up
    again, the engine is told once at warning, and the daemon does not
    count it as a lease on memory it does not map."""
    deadline = time.monotonic() + 20
    while a.watch.watching and a.watch.reattached == 0:
        assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
        time.sleep(0.05)
    client = [r for r in caplog.records if r.name == "wcached.client"]
    warnings = [r.getMessage() for r in client if r.levelno >= logging.WARNING]
    assert warnings == [
        f"wcached: the daemon at {d.socket_path} now holds another fill of default; this process "
        "keeps its weights without a lease (attach again to use the new fill)"
    ]
    assert a.watch.reattached == 0
    with DaemonConnection(d.socket_path) as conn:
        assert os.getpid() not in [c.pid for c in conn.status().clients]


def test_a_daemon_that_refilled_in_another_layout_is_not_taken_for_the_same_memory(
    work: Path, ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon came back with the same model and key but refilled (here in
    segments of another size): the engine is told once, at warning, keeps
    the weights it has without a lease, and is not counted as a lease on
    memory it does not map."""
    import torch

    from tests.helpers import as_bytes

    before = write_config(
        work / "before.toml",
        models=[{"name": "default", "path": str(ckpt), "segment_size": "64KiB"}],
        daemon={"socket_dir": str(work / "run")},
    )
    after = write_config(
        work / "after.toml",
        models=[{"name": "default", "path": str(ckpt), "segment_size": "1MiB"}],
        daemon={"socket_dir": str(work / "run")},
    )
    d = _up(before)
    a = attach("default", "cpu0", socket_dir=d.socket_dir)
    kept = {n: as_bytes(t).clone() for n, t in a.tensors.items()}
    try:
        with caplog.at_level(logging.INFO, "wcached.client"):
            d.stop(signal.SIGTERM)
            d.notify.close(keep_store=True)
            d = _up(after, store_from=d)
            assert "refilling default" in d.log(), d.log()
            _not_taken_up(a, d, caplog)
        with attach("default", "cpu0", socket_dir=d.socket_dir, keep_lease=False) as new:
            assert new.manifest.key == a.manifest.key
            assert new.manifest != a.manifest
        assert all(torch.equal(as_bytes(a.tensors[n]), b) for n, b in kept.items())
    finally:
        a.close()
        d.stop()
        d.notify.close()


def test_a_daemon_back_without_the_model_ends_the_watch_with_one_warning(
    work: Path, ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The daemon came back serving another model only (the operator changed
    its config): waiting cannot help, so the engine is told once, at warning,
    naming the model and the daemon's reason, stops watching and keeps the
    weights it has."""
    import torch

    from tests.helpers import as_bytes

    before = write_config(
        work / "before.toml",
        models=[{"name": "default", "path": str(ckpt)}],
        daemon={"socket_dir": str(work / "run")},
    )
    after = write_config(
        work / "after.toml",
        models=[{"name": "other", "path": str(ckpt)}],
        daemon={"socket_dir": str(work / "run")},
    )
    d = _up(before)
    a = attach("default", "cpu0", socket_dir=d.socket_dir)
    kept = {n: as_bytes(t).clone() for n, t in a.tensors.items()}
    try:
        with caplog.at_level(logging.INFO, "wcached.client"):
            d.stop(signal.SIGTERM)
            d.notify.close()
            d = _up(after)
            deadline = time.monotonic() + 20
            while a.watch.watching:
                assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
                time.sleep(0.05)
        client = [r for r in caplog.records if r.name == "wcached.client"]
        warnings = [r.getMessage() for r in client if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, warnings
        assert warnings[0].startswith("wcached: cannot attach to default again (")
        assert "default" in warnings[0].split("(", 1)[1]  # the daemon's reason names the model
        assert warnings[0].endswith("); keeping the weights without a lease"), warnings
        assert a.watch.reattached == 0
        assert all(torch.equal(as_bytes(a.tensors[n]), b) for n, b in kept.items())
    finally:
        a.close()
        d.stop()
        d.notify.close()


def test_a_daemon_that_writes_to_an_attached_connection_is_no_longer_watched(
    work: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A daemon never writes to an attached connection; one that does (an
    impostor, a protocol this client does not know) is not taken for a
    restart: one warning naming its socket, the watch ends, the connection
    stays the lease and the weights stay mapped."""
    from tests.client.test_untrusted_daemon import _fake_daemon, _manifest, _memfd, _u8
    from wcached.protocol.messages import Attached
    from wcached.protocol.wire import Channel

    manifest = _manifest(4096, [_u8("w", 0, 16)])

    def then_write(chan: Channel) -> None:
        fd = _memfd(bytes(range(256)) * 16)
        chan.send(Attached(manifest=manifest, fd_count=1), fds=[fd])
        os.close(fd)
        time.sleep(0.5)
        chan.sock.sendall(b"?")

    with caplog.at_level(logging.INFO, "wcached.client"):
        with _fake_daemon(work / "fake", lambda: -1, manifest, answer=then_write):
            a = attach("default", "cpu0", socket_dir=str(work / "fake"), timeout=5)
            try:
                deadline = time.monotonic() + 20
                while a.watch.watching:
                    assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
                    time.sleep(0.05)
                assert not a.closed and a.tensors["w"].tolist() == list(range(16))
            finally:
                a.close()
    warnings = [
        r.getMessage() for r in caplog.records if r.name == "wcached.client" and r.levelno >= logging.WARNING
    ]
    assert warnings == [
        f"wcached: the daemon at {work / 'fake' / 'cpu0.sock'} wrote to an attached connection; "
        "no longer watching the lease"
    ]


def _stand_in_at(path: str, answer) -> tuple[socket.socket, threading.Thread, list[float]]:
    """Something at a gone daemon's socket: every connection is accepted, the
    time noted, and handed to ``answer``; closed when the listener is."""
    if os.path.exists(path):
        os.unlink(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(16)
    accepted: list[float] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(time.monotonic())
            with conn:
                answer(conn)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return server, t, accepted


def test_attempts_to_attach_again_back_off_to_the_longest_delay(
    work: Path, ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the daemon is away, each failed attempt waits twice as long as
    the one before, from FIRST_RETRY_S up to RETRY_MAX_S: a restart is caught
    within milliseconds, and a daemon away for long is not hammered."""
    from wcached.client import lease

    monkeypatch.setattr(lease, "RETRY_MAX_S", 0.8)
    cfg = tied_model_config(work, ckpt, "64KiB")
    d = _up(cfg)
    a = attach("default", "cpu0", socket_dir=d.socket_dir)
    # A connection cut before the welcome: "not now", as a daemon starting up.
    server, t, accepted = _stand_in_at(d.socket_path, lambda conn: None)
    try:
        d.stop(signal.SIGKILL)
        d.notify.close(keep_store=True)
        deadline = time.monotonic() + 20
        while len(accepted) < 7:
            assert time.monotonic() < deadline, accepted
            time.sleep(0.05)
        gaps = [later - earlier for earlier, later in itertools.pairwise(accepted)][:6]
        # Doubling: 0.05, 0.1, 0.2, 0.4, then 0.8 and no longer. A loaded
        # machine only lengthens a gap, so the lower bounds are the rule's and
        # the upper ones leave room (a factor of 3 would reach 0.8 at the 4th).
        assert 0.03 <= gaps[0] < 0.3, gaps
        assert 0.08 <= gaps[1] < 0.35, gaps
        assert 0.18 <= gaps[2] < 0.5, gaps
        assert 0.38 <= gaps[3] < 0.75, gaps
        assert all(0.78 <= g < 1.3 for g in gaps[4:]), gaps
        assert a.watch.watching and a.watch.reattached == 0
    finally:
        server.close()
        t.join(10)
        a.close()
        d.notify.close()


def test_a_daemon_back_speaking_another_protocol_ends_the_watch_with_one_warning(
    work: Path, ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A daemon upgraded to a protocol this client does not speak: waiting
    cannot help, so the watch ends at once with one warning naming both
    versions, and the engine keeps its weights."""
    from wcached.protocol.messages import MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, Request, Welcome
    from wcached.protocol.wire import Channel

    def newer(conn: socket.socket) -> None:
        chan = Channel(conn, Request)
        chan.recv(65536, idle_timeout=5, frame_timeout=5)  # hello
        chan.send(Welcome(version=99, instance="cpu0", device="host memory", daemon_version="99", pid=1))

    cfg = tied_model_config(work, ckpt, "64KiB")
    d = _up(cfg)
    a = attach("default", "cpu0", socket_dir=d.socket_dir)
    first = a.tensors["embed.weight"].clone()
    server, t, accepted = _stand_in_at(d.socket_path, newer)
    try:
        with caplog.at_level(logging.INFO, "wcached.client"):
            d.stop(signal.SIGKILL)
            d.notify.close()
            deadline = time.monotonic() + 20
            while a.watch.watching:
                assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
                time.sleep(0.05)
            time.sleep(0.3)  # long enough for attempts that should not come
        warnings = [
            r.getMessage()
            for r in caplog.records
            if r.name == "wcached.client" and r.levelno >= logging.WARNING
        ]
        assert warnings == [
            f"wcached: cannot attach to default again (daemon chose protocol 99, this client speaks "
            f"{MIN_PROTOCOL_VERSION}..{PROTOCOL_VERSION}); keeping the weights without a lease"
        ], warnings
        # One attempt: its greeting, and the version-1 greeting it falls back to.
        assert len(accepted) <= 2, accepted
        assert a.tensors["embed.weight"].equal(first)
    finally:
        server.close()
        t.join(10)
        a.close()


def test_a_lease_whose_watch_fails_ends_alone_and_says_so(
    work: Path, ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One lease's trouble (here its check raising) ends that lease's watch
    with the error logged, naming the model; the process's other leases are
    still followed through the restart."""
    cfg, d, target, draft = _two_models_attached(work, ckpt)

    def broken() -> bool:
        raise RuntimeError("a bug in the check")

    draft.watch.ended = broken  # type: ignore[method-assign]
    try:
        with caplog.at_level(logging.INFO, "wcached.client"):
            d = _restarted(d, cfg)
            _wait_reattached(target)
            deadline = time.monotonic() + 10
            while draft.watch.watching:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        failed = [r for r in caplog.records if r.name == "wcached.client" and r.levelno == logging.ERROR]
        assert [r.getMessage() for r in failed] == [
            "wcached: watching the lease on draft failed; no longer watching it"
        ]
        assert failed[0].exc_info is not None and "a bug in the check" in str(failed[0].exc_info[1])
        assert target.watch.watching and draft.watch.reattached == 0
    finally:
        target.close()
        draft.close()
        d.stop()
        d.notify.close()


def test_the_watch_reads_a_quiet_connection_as_held_and_a_closed_one_as_ended(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What the watcher makes of the connection that is the lease, when poll
    says it can be read: nothing to read yet (held), the daemon's end closed
    or the socket gone (ended), bytes written (not a lease any more)."""
    from types import SimpleNamespace

    from wcached.client.lease import LeaseWatch

    def watch(sock: socket.socket) -> LeaseWatch:
        w = object.__new__(LeaseWatch)  # not registered with the process's watcher
        w.attachment = SimpleNamespace(connection=SimpleNamespace(sock=sock, path="/run/wcache/cpu0.sock"))
        return w

    mine, daemons = socket.socketpair()
    w = watch(mine)
    assert w.ended() is False
    daemons.close()
    assert w.ended() is True
    mine.close()
    assert w.ended() is True  # the socket itself gone (an error, not EOF)
    mine, daemons = socket.socketpair()
    daemons.send(b"x")
    with caplog.at_level(logging.WARNING, "wcached.client"):
        assert watch(mine).ended() is None
    assert "wrote to an attached connection" in caplog.text
    mine.close()
    daemons.close()


class _Due:
    """What the watcher reads of a lease its daemon ended, due in ``due_in`` s."""

    def __init__(self, name: str, due_in: float, tried: dict[str, float]) -> None:
        self.name, self.stopped, self.lost_at = name, False, time.monotonic()
        self.retry_at = self.lost_at + due_in
        self._tried = tried

    def try_again(self, now: float) -> bool:
        self._tried[self.name] = now
        self.retry_at = now + 3600  # not due again within the test
        return False


def _wait_tried(tried: dict[str, float], name: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while name not in tried and time.monotonic() < deadline:
        time.sleep(0.05)


def test_of_two_lost_leases_the_one_due_first_is_tried_first() -> None:
    """The watcher sleeps until the earliest lost lease is due, not the one
    it looked at last: a lease due in half a second is tried long before
    one due in a minute that was lost after it."""
    from wcached.client.lease import _Watcher

    tried: dict[str, float] = {}
    watcher = _Watcher()  # its own thread, apart from the process's watcher
    soon, later = _Due("soon", 0.5, tried), _Due("later", 60, tried)
    watcher.add(soon)  # type: ignore[arg-type]
    watcher.add(later)  # type: ignore[arg-type]
    try:
        _wait_tried(tried, "soon")
        assert "soon" in tried and "later" not in tried, tried
        assert tried["soon"] >= soon.lost_at + 0.5
    finally:
        watcher.remove(soon)  # type: ignore[arg-type]
        watcher.remove(later)  # type: ignore[arg-type]


def _never_open_fd(k: int = 0) -> int:
    """An fd number no file can have in this process (past its fd limit)."""
    import resource

    return resource.getrlimit(resource.RLIMIT_NOFILE)[0] + 10 + k


def test_a_lease_whose_socket_closed_unseen_is_taken_up_again_and_ends_no_other_lease() -> None:
    """A lease's socket closed without its watch being stopped first (nothing
    in wcached does that; an engine reaching into the connection might) is
    taken as a connection the daemon ended: attached again, on time, while a
    stopped lease in the same state is let go. Before, the watcher thread
    died of EBADF (the race CI met, when Attachment.close did not yet stop
    the watch under the watcher's lock) and every lease of the process went
    unfollowed, silently."""
    from types import SimpleNamespace

    from wcached.client.lease import FIRST_RETRY_S, _Watcher

    tried: dict[str, float] = {}

    class Gone:
        """A lease whose socket's fd is not open (any more)."""

        lost_at = None

        def __init__(self, name: str, fd: int, stopped: bool) -> None:
            self.name, self.stopped, self.lost_calls = name, stopped, 0
            sock = SimpleNamespace(fileno=lambda: fd)
            self.attachment = SimpleNamespace(connection=SimpleNamespace(sock=sock))

        def ended(self) -> bool:
            return True  # what LeaseWatch.ended says of a closed socket

        def lost(self, now: float) -> None:
            self.lost_calls += 1
            self.lost_at, self.retry_at = now, now + FIRST_RETRY_S

        def try_again(self, now: float) -> bool:
            tried[self.name] = now
            self.retry_at = now + 3600  # not due again within the test
            return False

    closing = Gone("closing", _never_open_fd(0), stopped=True)
    lost = Gone("lost", _never_open_fd(1), stopped=False)
    watcher = _Watcher()
    watcher.add(closing)  # type: ignore[arg-type]
    time.sleep(0.2)  # the watcher idle: no other wake-up than the next add's
    watcher.add(lost)  # type: ignore[arg-type]
    try:
        _wait_tried(tried, "lost")
        assert "lost" in tried and watcher._thread.is_alive()
        assert lost.lost_calls == 1 and closing.lost_calls == 0 and "closing" not in tried
    finally:
        for lease in (closing, lost):
            watcher.remove(lease)  # type: ignore[arg-type]


def test_a_closed_attachment_whose_socket_a_forked_child_holds_does_not_spin_the_watcher() -> None:
    """An engine forks (a data loader, a compile worker) while attached, then
    closes the attachment; the child still holds the socket. When the daemon
    later ends that connection, the watcher must not wake for it: it is
    unwatched when its lease is stopped, while its fd is still open (epoll
    forgets a socket by itself only once no process holds it). Before, it
    woke the watcher in a loop that took a core, saying nothing."""
    from types import SimpleNamespace

    from wcached.client.lease import _Watcher

    mine, daemons = socket.socketpair()
    lease = SimpleNamespace(
        name="closed",
        stopped=False,
        lost_at=None,
        attachment=SimpleNamespace(connection=SimpleNamespace(sock=mine)),
    )
    watcher = _Watcher()
    rounds = [0]
    real_round = watcher._round

    def counted() -> None:
        rounds[0] += 1
        real_round()

    watcher._round = counted  # type: ignore[method-assign]
    watcher.add(lease)  # type: ignore[arg-type]
    deadline = time.monotonic() + 10
    while mine.fileno() not in watcher._sel.get_map() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert mine.fileno() in watcher._sel.get_map()
    childs_copy = os.dup(mine.fileno())  # what a forked child holds
    try:
        lease.stopped = True  # Attachment.close: the watch stopped, then the socket closed
        watcher.remove(lease)  # type: ignore[arg-type]
        mine.close()
        daemons.close()  # the daemon ends the connection: the child's copy reads as ended
        time.sleep(0.2)
        before = rounds[0]
        time.sleep(1.0)
        assert rounds[0] - before <= 2, rounds[0] - before
    finally:
        os.close(childs_copy)


def test_a_lease_stopped_while_its_end_is_read_is_not_taken_up_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The engine closes an attachment just as the watcher reads its socket
    (the read fails: a closed socket reads as ended): nothing is attached
    again and no daemon is said to have ended the lease."""
    from wcached.client.lease import _Watcher

    class Closing:
        name, stopped, lost_calls = "closing", False, 0

        def ended(self) -> bool:
            self.stopped = True  # Attachment.close ran meanwhile
            return True

        def lost(self, now: float) -> None:
            self.lost_calls += 1

    watcher, closing = _Watcher(), Closing()
    watcher._check_ended(closing)  # type: ignore[arg-type]
    assert closing.lost_calls == 0


def test_a_socket_that_takes_a_closed_ones_number_is_watched_for_its_own_lease() -> None:
    """An engine closes one attachment and opens another that gets the very
    fd number, before the watcher looks again: the new socket is watched (its
    end is seen) and its event names its own lease, not the closed one's."""
    import selectors

    from wcached.client.lease import _Watcher

    watcher = _Watcher()
    sel = selectors.DefaultSelector()
    old, old_peer = socket.socketpair()
    fd = old.fileno()
    assert watcher._follow(sel, {fd: ("old lease", old)}) == []  # type: ignore[dict-item]
    old.close()
    old_peer.close()
    new, new_peer = socket.socketpair()
    if new.fileno() != fd:  # give it the closed one's number, as the kernel would
        os.dup2(new.fileno(), fd)
        new.close()
        new = socket.socket(fileno=fd)
    try:
        assert watcher._follow(sel, {fd: ("new lease", new)}) == []  # type: ignore[dict-item]
        new_peer.close()  # the daemon ends the new lease
        events = sel.select(5)
        assert [key.data[0] for key, _ in events] == ["new lease"]
    finally:
        new.close()
        sel.close()


def test_a_failing_round_of_the_watcher_is_said_once_and_the_watch_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Whatever a round of the watcher trips over, the thread that follows
    every lease of the process lives on: the first failure of a run is logged
    with its traceback (not the ones after it), and the leases are followed
    after it."""
    from wcached.client.lease import _Watcher

    class Flaky:
        """A lease whose state cannot be read, the first ``n`` times."""

        name, stopped = "flaky", False

        def __init__(self, n: int) -> None:
            self.n, self.reads = n, 0

        @property
        def lost_at(self) -> float:
            self.reads += 1
            if self.reads <= self.n:
                raise RuntimeError(f"a bug in round {self.reads}")
            return time.monotonic()

        retry_at = time.monotonic() + 3600  # lost, not due within the test

    tried: dict[str, float] = {}
    flaky, due = Flaky(3), _Due("due", 0.3, tried)
    with caplog.at_level(logging.INFO, "wcached.client"):
        watcher = _Watcher()
        watcher.add(flaky)  # type: ignore[arg-type]
        watcher.add(due)  # type: ignore[arg-type]
        try:
            _wait_tried(tried, "due")
            assert "due" in tried and watcher._thread.is_alive() and flaky.reads > 3
        finally:
            watcher.remove(flaky)  # type: ignore[arg-type]
            watcher.remove(due)  # type: ignore[arg-type]
    failed = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in failed] == ["wcached: the lease watcher failed; going on"]
    assert str(failed[0].exc_info[1]) == "a bug in round 1"


def test_a_watcher_whose_very_first_round_fails_says_so_and_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    """Even the first round of a watcher's thread (before any round went
    well) is said when it fails, and followed by the next."""
    from wcached.client.lease import _Watcher

    class FirstRoundFails(_Watcher):
        rounds = 0

        def _round(self) -> None:
            FirstRoundFails.rounds += 1
            if FirstRoundFails.rounds == 1:
                raise RuntimeError("the first round")
            super()._round()

    tried: dict[str, float] = {}
    due = _Due("due", 0.3, tried)
    with caplog.at_level(logging.INFO, "wcached.client"):
        watcher = FirstRoundFails()
        watcher.add(due)  # type: ignore[arg-type]
        try:
            _wait_tried(tried, "due")
            assert "due" in tried and watcher._thread.is_alive()
        finally:
            watcher.remove(due)  # type: ignore[arg-type]
    failed = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [str(r.exc_info[1]) for r in failed if r.exc_info] == ["the first round"]


def test_a_watcher_whose_rounds_keep_failing_does_not_spin() -> None:
    """A round that fails every time (a bug) is tried ever less often, not in a
    loop that takes a core from the engine: a handful of rounds a second."""
    from wcached.client.lease import _Watcher

    class Broken:
        name, stopped, rounds = "broken", False, 0

        @property
        def lost_at(self) -> float:
            Broken.rounds += 1
            raise RuntimeError("a bug in every round")

    watcher, broken = _Watcher(), Broken()
    watcher.add(broken)  # type: ignore[arg-type]
    try:
        time.sleep(1.5)
        # 0.05 s more pause after each failure: 7 rounds in 1.5 s.
        assert 2 <= Broken.rounds <= 12, Broken.rounds
    finally:
        watcher.remove(broken)  # type: ignore[arg-type]


def test_a_lease_taken_up_again_keeps_its_client_name_and_key(work: Path, ckpt: Path) -> None:
    """After a restart the daemon lists the re-attached engine under the name
    it attached with (``wcached status``'s client column), and the lease
    asks again with the key fields the engine required."""
    cfg = tied_model_config(work, ckpt, "64KiB")
    d = _up(cfg)
    a = attach("default", "cpu0", socket_dir=d.socket_dir, client="engine-7", expect={"dtype": "auto"})
    try:
        assert a.watch.expect == {"dtype": "auto"}
        with DaemonConnection(d.socket_path) as conn:
            assert (os.getpid(), "engine-7") in [(c.pid, c.client) for c in conn.status().clients]
        d = _restarted(d, cfg)
        _wait_reattached(a)
        with DaemonConnection(d.socket_path) as conn:
            clients = [(c.pid, c.client) for c in conn.status().clients]
        assert (os.getpid(), "engine-7") in clients, clients
    finally:
        a.close()
        d.stop()
        d.notify.close()


def test_a_daemon_back_with_another_key_than_the_engine_required_is_not_taken_up(
    work: Path, ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine attached requiring dtype "auto"; the daemon came back
    casting to float32 (its reply to the lease is a mismatch): told once,
    the weights kept without a lease, never re-attached to the other key."""
    before = one_model_config(work, ckpt, segment_size="64KiB")
    d = _up(before)
    a = attach("default", "cpu0", socket_dir=d.socket_dir, expect={"dtype": "auto"})
    after = one_model_config(work, ckpt, segment_size="64KiB", dtype="float32")
    try:
        with caplog.at_level(logging.INFO, "wcached.client"):
            d = _restarted(d, after)
            _not_taken_up(a, d, caplog)
    finally:
        a.close()
        d.stop()
        d.notify.close()


def test_the_watcher_thread_is_started_by_an_attach_that_keeps_a_lease_only(work: Path, ckpt: Path) -> None:
    """An attach with a lease has its watcher thread running when it returns;
    one without a lease starts no thread. (That the thread starts while the
    daemon answers, off the attach's timed path, is speed: bench/attach_phases
    shows it, this test does not.)"""
    import subprocess
    import sys

    script = (
        "import sys, threading\n"
        "from wcached.client import attach\n"
        "names = lambda: sorted(t.name for t in threading.enumerate() if t.name.startswith('wcached'))\n"
        "a = attach('default', 'cpu0', socket_dir=sys.argv[1], keep_lease=False)\n"
        "print(names(), a.watch)\n"
        "b = attach('default', 'cpu0', socket_dir=sys.argv[1])\n"
        "print(names(), b.watch.watching)\n"
    )
    d = _up(one_model_config(work, ckpt))
    try:
        r = subprocess.run(
            [sys.executable, "-c", script, d.socket_dir], capture_output=True, text=True, timeout=60
        )
    finally:
        d.stop()
        d.notify.close()
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["[] None", "['wcached-leases'] True"], r.stdout
