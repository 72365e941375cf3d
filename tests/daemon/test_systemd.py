"""The notify channel (wcached.daemon.systemd) under a full queue, and the
watchdog fed only while the daemon's own socket answers."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

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
