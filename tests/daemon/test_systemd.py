"""The notify channel (wcached.daemon.systemd) under a full queue, and the
watchdog fed only while the daemon's own socket answers."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import NotifyListener, start_daemon, wait_ready
from wcached.daemon.systemd import Notifier, fdstore_limit


def _fill_queue(path: str) -> list[socket.socket]:
    """Datagrams until the receiver's queue takes no more."""
    senders = []
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.setblocking(False)
        try:
            s.sendto(b"X=1", path)
        except BlockingIOError:
            s.close()
            return senders
        senders.append(s)
        while True:
            try:
                s.sendto(b"X=1", path)
            except BlockingIOError:
                break


def test_status_never_waits_and_store_messages_are_never_dropped(work: Path) -> None:
    listener = NotifyListener(work)
    notifier = Notifier({"NOTIFY_SOCKET": listener.path})
    senders = _fill_queue(listener.path)
    r, w = os.pipe()
    try:
        # A connection thread storing an fd while the queue is full ...
        stored = []
        store = threading.Thread(
            target=lambda: stored.append(notifier.notify("FDSTORE=1", "FDNAME=x", fds=[r], wait=True))
        )
        store.start()
        time.sleep(0.2)
        # ... never holds up the main loop's status line (sent later, not lost).
        loop = threading.Thread(target=lambda: [notifier.status(f"serving {i}") for i in range(50)])
        loop.start()
        loop.join(0.5)
        waited = loop.is_alive()
        if waited:
            listener.drain()  # let it finish, then fail
            loop.join(120)
        assert not waited, "STATUS= waited for room in the notify queue"
        assert store.is_alive()  # still waiting for room, not dropped
        listener.drain()  # systemd reads its queue
        store.join(10)
        assert stored == [True]
        listener.drain()
        assert [name for name, _ in listener.store] == ["x"]
        notifier.flush()  # the main loop's next turn sends the newest line
        listener.drain()
        statuses = [m for m in listener.messages if m.startswith("STATUS=")]
        assert statuses and statuses[-1] == "STATUS=serving 49", statuses
    finally:
        for s in senders:
            s.close()
        os.close(w)
        os.close(r)
        listener.close()


def test_fdstore_limit_from_systemd() -> None:
    assert fdstore_limit({"FDSTORE": "4096"}) == 4096
    assert fdstore_limit({}) is None
    assert fdstore_limit({"FDSTORE": "x"}) is None


def test_the_watchdog_is_fed_only_while_the_socket_answers(work: Path, cpu_config: Path) -> None:
    """WATCHDOG_USEC set as systemd sets it: pings come while serving, and
    stop once the daemon's socket is gone (an engine could not attach)."""
    d = start_daemon(cpu_config, env={"WATCHDOG_USEC": "1000000"})
    try:
        wait_ready(d, 60)

        def pings_within(seconds: float) -> int:
            d.notify.drain()
            before = sum(m == "WATCHDOG=1" for m in d.notify.messages)
            time.sleep(seconds)
            d.notify.drain()
            return sum(m == "WATCHDOG=1" for m in d.notify.messages) - before

        assert pings_within(2.0) >= 2
        os.unlink(d.socket_path)
        time.sleep(2.0)  # the last answer ages out
        assert pings_within(2.0) == 0, d.log()
        assert "does not answer" in d.log()
        assert d.proc.poll() is None  # systemd, not the daemon, acts on it
    finally:
        d.stop()
        d.notify.close()


def test_a_ping_a_full_queue_dropped_stays_due(work: Path) -> None:
    """WATCHDOG=1 never waits, but one the queue did not take is sent on the
    main loop's next turn, not half a WatchdogSec later (when systemd would
    already have killed the daemon)."""
    listener = NotifyListener(work)
    notifier = Notifier({"NOTIFY_SOCKET": listener.path, "WATCHDOG_USEC": "30000000"})
    senders = _fill_queue(listener.path)
    try:
        assert notifier.watchdog_due()
        notifier.ping_watchdog()  # dropped: the queue is full
        assert notifier.watchdog_due()
        listener.drain()
        notifier.ping_watchdog()
        assert not notifier.watchdog_due()
        listener.drain()
        assert "WATCHDOG=1" in listener.messages
    finally:
        for s in senders:
            s.close()
        listener.close()


def test_the_liveness_probe_is_served_when_every_slot_is_a_lease(work: Path, sharded_ckpt: Path) -> None:
    """Leases hold their connection threads for good: with max_clients of
    them attached, the daemon's own probe is still answered, so a daemon
    full of engines is not restarted by its watchdog."""
    from tests.helpers import tied_model_config
    from wcached.client import attach

    cfg = tied_model_config(work, sharded_ckpt, "64KiB", max_clients=1)
    d = start_daemon(cfg, env={"WATCHDOG_USEC": "1000000"})
    try:
        wait_ready(d, 60)
        with attach("default", "cpu0", socket_dir=d.socket_dir):
            time.sleep(2.0)  # an answer from before the lease ages out
            d.notify.drain()
            before = sum(m == "WATCHDOG=1" for m in d.notify.messages)
            time.sleep(2.0)
            d.notify.drain()
            assert sum(m == "WATCHDOG=1" for m in d.notify.messages) - before >= 2, d.log()
            assert "does not answer" not in d.log()
    finally:
        d.stop()
        d.notify.close()


# -- the notify channel's own rules, without a daemon --------------------------


def _receiver(address: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(address)
    s.settimeout(2.0)
    return s


def _received(s: socket.socket) -> list[str]:
    """Every datagram queued at ``s``, as text."""
    got = []
    s.settimeout(0.05)
    while True:
        try:
            got.append(s.recv(65536).decode())
        except TimeoutError:
            return got


@pytest.mark.parametrize("env", [{}, {"NOTIFY_SOCKET": ""}])
def test_without_a_notify_socket_every_call_is_a_quiet_no_op(env: dict[str, str], caplog) -> None:
    notifier = Notifier(env)
    assert not notifier.enabled
    assert notifier.notify("READY=1") is False
    assert notifier.notify("FDSTORE=1", "FDNAME=x", fds=[0], wait=True) is False
    notifier.ready("serving")
    notifier.status("filling")
    notifier.flush()
    notifier.extend_timeout(30)
    notifier.stopping()
    notifier.ping_watchdog()
    assert not notifier.watchdog_due()
    assert caplog.records == []


def test_an_abstract_notify_socket_is_reached_by_its_at_name() -> None:
    name = f"wcached-test-{os.getpid()}-{time.monotonic_ns()}"
    s = _receiver("\0" + name)
    try:
        notifier = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert notifier.enabled
        notifier.ready("serving m")
        assert _received(s) == ["READY=1\nSTATUS=serving m"]
    finally:
        s.close()


def test_each_message_is_one_datagram_of_its_fields(work: Path) -> None:
    s = _receiver(str(work / "notify"))
    try:
        notifier = Notifier({"NOTIFY_SOCKET": str(work / "notify")})
        notifier.ready("serving m")
        notifier.status("filling m")
        notifier.extend_timeout(1.5)
        notifier.stopping()
        notifier.stopping("stopping: signal 15")
        assert _received(s) == [
            "READY=1\nSTATUS=serving m",
            "STATUS=filling m",
            "EXTEND_TIMEOUT_USEC=1500000",
            "STOPPING=1\nSTATUS=stopping",
            "STOPPING=1\nSTATUS=stopping: signal 15",
        ]
        notifier.flush()  # the status line was sent: nothing is pending
        assert _received(s) == []
    finally:
        s.close()


@pytest.mark.parametrize("final", ["ready", "stopping"])
def test_a_held_back_status_line_is_not_sent_after_ready_or_stopping(work: Path, final: str) -> None:
    """A status line a full queue held back is older than READY=1's or
    STOPPING=1's: sent after them, `systemctl status` would show it."""
    listener = NotifyListener(work)
    notifier = Notifier({"NOTIFY_SOCKET": listener.path})
    senders = _fill_queue(listener.path)
    try:
        notifier.status("filling m")  # held back: the queue is full
        listener.drain()
        assert not any(m.startswith("STATUS=filling") for m in listener.messages)
        getattr(notifier, final)("done")
        notifier.flush()
        listener.drain()
        assert not any(m.startswith("STATUS=filling") for m in listener.messages), listener.messages
        assert listener.messages[-1].endswith("\nSTATUS=done")
    finally:
        for s in senders:
            s.close()
        listener.close()


def test_a_state_change_gives_up_on_a_queue_that_stays_full_and_says_so(
    work: Path, monkeypatch, caplog
) -> None:
    monkeypatch.setattr("wcached.daemon.systemd.STATE_SEND_TIMEOUT_S", 1.2)
    listener = NotifyListener(work)
    notifier = Notifier({"NOTIFY_SOCKET": listener.path})
    senders = _fill_queue(listener.path)
    try:
        started, cpu = time.monotonic(), time.process_time()
        assert notifier.notify("FDSTOREREMOVE=1", "FDNAME=x", wait=True) is False
        assert time.monotonic() - started >= 1.2
        assert time.process_time() - cpu < 0.2  # waited for room, not spun
        assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
            "sd_notify ('FDSTOREREMOVE=1', 'FDNAME=x') not sent: "
            "the notify socket's queue stayed full for 1 s"
        ]
    finally:
        for s in senders:
            s.close()
        listener.close()


def test_a_notify_socket_gone_fails_at_once_and_is_logged(work: Path, caplog) -> None:
    """Not a full queue: a state change does not wait for a receiver that is
    gone, and the failure is in the log."""
    s = _receiver(str(work / "notify"))
    notifier = Notifier({"NOTIFY_SOCKET": str(work / "notify")})
    s.close()
    started = time.monotonic()
    assert notifier.notify("FDSTORE=1", "FDNAME=x", wait=True) is False
    assert time.monotonic() - started < 10  # STATE_SEND_TIMEOUT_S is 60
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and warnings[0].startswith("sd_notify ('FDSTORE=1', 'FDNAME=x') failed: "), (
        warnings
    )


def test_a_notify_socket_that_appears_late_is_addressed_per_message(work: Path, monkeypatch, caplog) -> None:
    path = str(work / "notify")
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.enabled
    assert [r.getMessage() for r in caplog.records] == [
        f"cannot connect to the notify socket {path}: [Errno 2] No such file or directory"
    ]
    s = _receiver(path)
    try:
        assert notifier.notify("STATUS=late") is True
        notifier.ready("serving m")
        assert _received(s) == ["STATUS=late", "READY=1\nSTATUS=serving m"]
        # Unconnected, a full queue is waited for by time, and given up on.
        monkeypatch.setattr("wcached.daemon.systemd.STATE_SEND_TIMEOUT_S", 0.5)
        senders = _fill_queue(path)
        try:
            cpu = time.process_time()
            assert notifier.notify("FDSTORE=1", "FDNAME=x", wait=True) is False
            assert time.process_time() - cpu < 0.1  # waited, not spun
            assert notifier.notify("STATUS=x") is False
        finally:
            for x in senders:
                x.close()
    finally:
        s.close()


def test_the_watchdog_is_half_its_interval_and_only_for_this_process(work: Path) -> None:
    def interval(**env: str) -> float | None:
        return Notifier(env).watchdog_interval

    assert interval(WATCHDOG_USEC="30000000") == 15.0
    assert interval(WATCHDOG_USEC="30000000", WATCHDOG_PID=str(os.getpid())) == 15.0
    assert interval(WATCHDOG_USEC="30000000", WATCHDOG_PID=str(os.getpid() + 1)) is None
    assert interval(WATCHDOG_USEC="") is None
    assert interval(WATCHDOG_USEC="30s") is None
    assert interval() is None


def test_a_ping_taken_is_due_again_after_half_the_interval(work: Path) -> None:
    listener = NotifyListener(work)
    try:
        notifier = Notifier({"NOTIFY_SOCKET": listener.path, "WATCHDOG_USEC": "400000"})
        assert notifier.watchdog_due()
        notifier.ping_watchdog()
        assert not notifier.watchdog_due()
        time.sleep(0.25)  # past half of 0.4 s
        assert notifier.watchdog_due()
        listener.drain()
        assert listener.messages == ["WATCHDOG=1"]
        # Without WATCHDOG_USEC (or for another process) nothing is pinged.
        other = Notifier({"NOTIFY_SOCKET": listener.path, "WATCHDOG_USEC": "400000", "WATCHDOG_PID": "1"})
        assert not other.watchdog_due()
        other.ping_watchdog()
        listener.drain()
        assert listener.messages == ["WATCHDOG=1"]
    finally:
        listener.close()


@pytest.mark.parametrize(
    "env, limit",
    [({"FDSTORE": "0"}, 0), ({"FDSTORE": "-1"}, None), ({"FDSTORE": ""}, None), ({"FDSTORE": " 12 "}, 12)],
)
def test_fdstore_limit_edges(env: dict[str, str], limit: int | None) -> None:
    assert fdstore_limit(env) == limit


def test_fdstore_limit_is_read_from_the_process_environment_by_default(monkeypatch) -> None:
    monkeypatch.setenv("FDSTORE", "77")
    assert fdstore_limit() == 77
    monkeypatch.delenv("FDSTORE")
    assert fdstore_limit() is None


@pytest.mark.parametrize("final", ["ready", "stopping"])
def test_ready_and_stopping_wait_for_room_in_a_full_queue(work: Path, final: str) -> None:
    listener = NotifyListener(work)
    notifier = Notifier({"NOTIFY_SOCKET": listener.path})
    senders = _fill_queue(listener.path)
    try:
        sent = threading.Thread(target=getattr(notifier, final), args=("done",))
        sent.start()
        time.sleep(0.3)
        assert sent.is_alive()  # waiting for room, not dropped
        listener.drain()
        sent.join(10)
        listener.drain()
        assert any(m.endswith("=1\nSTATUS=done") for m in listener.messages), listener.messages
    finally:
        for s in senders:
            s.close()
        listener.close()


def test_the_notify_socket_is_read_from_the_process_environment_by_default(work: Path, monkeypatch) -> None:
    s = _receiver(str(work / "notify"))
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", str(work / "notify"))
        Notifier().status("serving")
        assert _received(s) == ["STATUS=serving"]
    finally:
        s.close()


def test_a_notify_socket_never_there_fails_naming_the_messages_and_why(work: Path, caplog) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": str(work / "none")})
    caplog.clear()
    assert notifier.notify("STATUS=x") is False
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "sd_notify ('STATUS=x',) failed: [Errno 2] No such file or directory"
    ]


def test_a_status_line_is_sent_once_and_a_fresh_notifier_has_none_held_back(work: Path) -> None:
    listener = NotifyListener(work)
    try:
        notifier = Notifier({"NOTIFY_SOCKET": listener.path})
        notifier.flush()
        notifier.status("serving m")
        notifier.flush()
        notifier.flush()
        listener.drain()
        assert listener.messages == ["STATUS=serving m"]
    finally:
        listener.close()


def test_a_ping_is_due_exactly_half_the_interval_after_the_last(work: Path, monkeypatch) -> None:
    from types import SimpleNamespace

    import wcached.daemon.systemd as systemd

    now = [1000.0]
    monkeypatch.setattr(systemd, "time", SimpleNamespace(monotonic=lambda: now[0], sleep=time.sleep))
    listener = NotifyListener(work)
    try:
        notifier = Notifier({"NOTIFY_SOCKET": listener.path, "WATCHDOG_USEC": "4000000"})
        notifier.ping_watchdog()
        now[0] = 1001.5
        assert not notifier.watchdog_due()
        now[0] = 1002.0
        assert notifier.watchdog_due()
    finally:
        listener.close()
