"""The server in this process: its socket, its client slots, its sessions.

The daemon's tests start it as a process, which is how it runs; these hold
one Server over a model filled in this process, so that each rule of
wcached/daemon/server.py is stated on its own and checked in milliseconds:
how the socket appears, what a full server does with one more connection
(and with its own liveness probe), what running out of fds does to accept,
what a session counts and what status and release report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from tests.daemon.inprocess import (
    DEVICE,
    CountingMetrics,
    filled_holdings,
    open_policy,
    serving,
    settings_for,
    until,
)
from tests.helpers import TEST_USER, fds_opened_since, open_fds, require_test_user, run_as
from wcached.client.connection import DaemonConnection
from wcached.config import AccessLists
from wcached.daemon.holdings import Holdings
from wcached.daemon.metrics import Metrics
from wcached.daemon.peers import AccessPolicy
from wcached.daemon.server import MAX_CLIENT_NAME, Server, negotiate, printable
from wcached.errors import (
    BadRequest,
    Busy,
    ModelReleased,
    PermissionRefused,
    ProtocolError,
    UnknownModel,
    VersionMismatch,
)
from wcached.protocol.messages import (
    PROTOCOL_VERSION,
    Attach,
    Attached,
    ErrorReply,
    Hello,
    Mismatch,
    Release,
    Reply,
    StatusReply,
    StatusRequest,
)
from wcached.protocol.wire import MAX_REPLY_BYTES, Channel, PeerClosed, close_fds


@pytest.fixture(scope="module")
def holdings(tmp_path_factory, sharded_ckpt: Path) -> Iterator[Holdings]:
    h = filled_holdings(Path(shutil.copytree(sharded_ckpt, tmp_path_factory.mktemp("server") / "ckpt")))
    yield h
    h.close()


@pytest.fixture
def server(work: Path, holdings: Holdings) -> Iterator[Server]:
    with serving(Server(settings_for(work), DEVICE, holdings, open_policy(), CountingMetrics())) as s:
        yield s


def _raw(server: Server) -> Channel:
    """A connection greeted by hand, to send what DaemonConnection would not."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(server.settings.socket_path)
    chan = Channel(sock, Reply)
    chan.send(Hello(version=PROTOCOL_VERSION, min_version=1, client="raw"), timeout=5)
    chan.recv(MAX_REPLY_BYTES, idle_timeout=5, frame_timeout=5)
    return chan


def _reply(chan: Channel) -> object:
    return chan.recv(MAX_REPLY_BYTES, idle_timeout=5, frame_timeout=5)


# -- names and versions ---------------------------------------------------------


def test_a_client_name_is_cut_to_its_limit_with_unprintables_replaced() -> None:
    assert printable("vllm worker 0") == "vllm worker 0"
    assert printable("a\nb\x1b[31mc\x00") == "a?b?[31mc?"
    assert printable("x" * 500) == "x" * MAX_CLIENT_NAME
    assert printable("é" * 3 + "\t", limit=2) == "éé"


@pytest.mark.parametrize(
    ("client", "agreed"),
    [((1, PROTOCOL_VERSION + 5), PROTOCOL_VERSION), ((1, 1), 1), ((2, PROTOCOL_VERSION), PROTOCOL_VERSION)],
)
def test_the_highest_version_both_speak_is_agreed(client: tuple[int, int], agreed: int) -> None:
    assert negotiate(Hello(version=client[1], min_version=client[0])) == agreed


@pytest.mark.parametrize("client", [(PROTOCOL_VERSION + 1, PROTOCOL_VERSION + 2), (3, 2), (0, 0)])
def test_no_common_version_is_refused_naming_both_ranges(client: tuple[int, int]) -> None:
    with pytest.raises(VersionMismatch) as e:
        negotiate(Hello(version=client[1], min_version=client[0]))
    assert str(e.value) == f"daemon speaks protocol 1..{PROTOCOL_VERSION}, client {client[0]}..{client[1]}"


# -- the socket -------------------------------------------------------------------


def test_the_socket_appears_listening_0660_under_its_name_and_the_umask_is_left_alone(
    work: Path, holdings: Holdings
) -> None:
    """Bound under ``.cpu0.tmp`` (a leftover of a killed daemon replaced),
    renamed into place once listening; the process's umask is its own again."""
    (work / ".cpu0.tmp").write_text("left by a killed daemon")
    server = Server(settings_for(work), DEVICE, holdings, open_policy())
    umask = os.umask(0o022)
    try:
        sock = server.bind()
        assert os.umask(0o022) == 0o022
    finally:
        os.umask(umask)
    try:
        st = os.stat(work / "cpu0.sock")
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660
        assert sorted(os.listdir(work)) == ["cpu0.sock"]
        assert sock is server.listener and not sock.getblocking()
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(str(work / "cpu0.sock"))  # queued in the backlog: it listens
        assert sock.get_inheritable() is False
    finally:
        server.close()
    assert not os.path.lexists(work / "cpu0.sock") and server.listener is None
    server.close()  # twice is harmless


def test_the_socket_is_never_wider_than_0660_not_even_before_its_chmod(
    work: Path, holdings: Holdings, monkeypatch
) -> None:
    """Created under a umask of 0117: a local user never finds it writable
    in the moment between bind() and chmod(), whatever the daemon's umask."""
    seen: list[int] = []
    real_chmod = os.chmod

    def chmod(path, mode, *a, **k):
        seen.append(stat.S_IMODE(os.lstat(path).st_mode))
        return real_chmod(path, mode, *a, **k)

    monkeypatch.setattr(os, "chmod", chmod)
    umask = os.umask(0)  # the widest a daemon could inherit
    try:
        Server(settings_for(work), DEVICE, holdings, open_policy()).bind().close()
    finally:
        os.umask(umask)
    assert seen == [0o660]


def test_a_socket_that_cannot_be_put_in_place_leaves_nothing(work: Path, holdings: Holdings) -> None:
    (work / "cpu0.sock").mkdir()  # a directory where the socket goes: rename fails
    server = Server(settings_for(work), DEVICE, holdings, open_policy())
    before = open_fds()
    with pytest.raises(OSError):
        server.bind()
    assert sorted(os.listdir(work)) == ["cpu0.sock"] and server.listener is None
    assert fds_opened_since(before) == {}


# -- sessions ---------------------------------------------------------------------


def test_an_attach_is_counted_once_the_client_holds_it_and_status_lists_leases_only(
    server: Server,
) -> None:
    path = server.settings.socket_path
    with DaemonConnection(path, client="engine\n0") as lease, DaemonConnection(path, client="status"):
        assert server.client_count == 0  # connected, not attached: no lease
        manifest, fds = lease.attach("default")
        close_fds(fds)
        assert server.client_count == 1
        status = server.status()
        assert [(c.pid, c.uid, c.gid, c.client, c.models) for c in status.clients] == [
            (os.getpid(), os.getuid(), os.getgid(), "engine?0", ["default"])
        ]
        assert status.state == "serving" and status.instance == "cpu0" and status.pid == os.getpid()
        assert [m.name for m in status.models] == ["default"]
        assert manifest == server.holdings.get("default").manifest
        close_fds(lease.attach("default")[1])  # a second attach of one connection: one lease
        assert server.client_count == 1
    assert until(lambda: server.client_count == 0)
    assert server.metrics.attaches == [("default", "ok"), ("default", "ok")]  # type: ignore[attr-defined]


def test_a_key_that_differs_gets_its_fields_and_no_fds_and_the_connection_goes_on(server: Server) -> None:
    chan = _raw(server)
    try:
        chan.send(Attach(model="default", expect={"dtype": "float64"}), timeout=5)
        reply = _reply(chan)
        assert isinstance(reply, Mismatch) and reply.fields == ["dtype"] and "dtype" in reply.message
        assert server.client_count == 0
        chan.send(Attach(model="nope"), timeout=5)
        reply = _reply(chan)
        assert isinstance(reply, ErrorReply) and reply.code == UnknownModel.code
        chan.send(StatusRequest(), timeout=5)
        assert isinstance(_reply(chan), StatusReply)
    finally:
        chan.sock.close()
    assert server.metrics.attaches == [("default", "mismatch"), ("nope", UnknownModel.code)]  # type: ignore[attr-defined]
    assert server.metrics.errors == [UnknownModel.code]  # type: ignore[attr-defined]


def test_a_second_hello_is_a_bad_request_and_the_connection_goes_on(server: Server) -> None:
    chan = _raw(server)
    try:
        chan.send(Hello(version=PROTOCOL_VERSION, min_version=1), timeout=5)
        reply = _reply(chan)
        assert isinstance(reply, ErrorReply)
        assert (reply.code, reply.message) == (BadRequest.code, "hello was already exchanged")
        chan.send(StatusRequest(), timeout=5)
        assert isinstance(_reply(chan), StatusReply)
    finally:
        chan.sock.close()
    assert server.metrics.errors == [BadRequest.code]  # type: ignore[attr-defined]


@pytest.mark.parametrize("attached_before", [False, True], ids=["first-attach", "again"])
def test_an_attach_the_client_never_receives_is_not_counted_as_its_lease(
    server: Server, monkeypatch, caplog, attached_before: bool
) -> None:
    """The reply cannot be sent (the peer gone as it goes): the session does
    not keep a model it never handed over (no "detached" line for it), keeps
    one it had handed over before, and the attach is counted as an error."""
    chan = _raw(server)
    real_send = Channel.send
    if attached_before:
        real_send(chan, Attach(model="default"), timeout=5)
        assert isinstance(_reply(chan), Attached)
        close_fds(chan.recv_fds(len(server.holdings.get("default").manifest.segments), timeout=5))

    def fail_with_fds(self, msg, timeout=None, fds=()):
        if fds:
            raise BrokenPipeError(errno.EPIPE, "peer gone")
        return real_send(self, msg, timeout=timeout, fds=fds)

    monkeypatch.setattr(Channel, "send", fail_with_fds)
    with caplog.at_level(logging.INFO, "wcached.server"):
        try:
            real_send(chan, Attach(model="default"), timeout=5)
            with pytest.raises(PeerClosed):
                _reply(chan)  # the server ended the connection
        finally:
            chan.sock.close()
        assert until(lambda: "connection of pid" in caplog.text)
    detached = f"client pid {os.getpid()} detached from default"
    assert (detached in caplog.text) == attached_before, caplog.text
    assert server.metrics.attaches[-1] == ("default", "error")  # type: ignore[attr-defined]


def test_close_ends_every_connection_and_status_says_stopping(server: Server) -> None:
    chan = _raw(server)
    try:
        chan.send(Attach(model="default"), timeout=5)
        reply = _reply(chan)
        assert isinstance(reply, Attached)
        server.close()
        assert server.status().state == "stopping"
        assert not os.path.lexists(server.settings.socket_path)
        chan.sock.settimeout(5)
        while chan.sock.recv(65536):  # the fds' marker, then the end
            pass
    finally:
        chan.sock.close()


# -- client slots -----------------------------------------------------------------


_OTHER_PROCESS = textwrap.dedent(
    """
    import sys
    from wcached.client.connection import DaemonConnection
    from wcached.errors import Busy
    try:
        DaemonConnection(sys.argv[1], timeout=0.3).close()
        print("served")
    except Busy as e:
        print("busy:", e)
    """
)


def _from_another_process(path: str) -> str:
    r = subprocess.run(
        [sys.executable, "-c", _OTHER_PROCESS, path], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def test_a_full_server_refuses_others_busy_but_serves_its_own_probe_one_at_a_time(
    work: Path, holdings: Holdings, caplog
) -> None:
    """max_clients slots are leases for good: one more client gets "busy"
    (counted, logged), the daemon's own liveness probe is served beside them,
    but only one probe at a time; a slot given back is taken again."""
    metrics = CountingMetrics()
    with serving(
        Server(settings_for(work, max_clients=1), DEVICE, holdings, open_policy(), metrics)
    ) as server:
        path = server.settings.socket_path
        lease = DaemonConnection(path)
        with caplog.at_level(logging.WARNING, "wcached.server"):
            assert _from_another_process(path) == "busy: too many clients"
        assert "refused 1 connection(s): 1 clients connected (max_clients)" in caplog.text
        assert metrics.errors and set(metrics.errors) == {Busy.code}  # (the client tries again)
        probe = DaemonConnection(path)  # this process: the daemon's own probe
        with pytest.raises(Busy, match="too many clients"):
            DaemonConnection(path, timeout=0.2)  # a second probe at once
        probe.close()
        DaemonConnection(path, timeout=5).close()  # the probe's place is free again
        lease.close()
        assert until(lambda: _from_another_process(path) == "served"), "the lease's slot was not given back"


def _unread_pair() -> tuple[socket.socket, socket.socket]:
    """A connection whose peer has stopped reading: its buffer full."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:
            ours.send(b"\0" * 65536)
    return ours, theirs


def _seconds_to(step) -> float:
    """How long ``step()`` took, in a thread: a step that would wait forever
    fails the test after 5 s instead of hanging it."""
    took: list[float] = []

    def run() -> None:
        started = time.monotonic()
        step()
        took.append(time.monotonic() - started)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(5)
    assert took, "still waiting after 5 s"
    return took[0]


def test_a_busy_refusal_never_waits_for_a_peer_that_does_not_read(work: Path, holdings: Holdings) -> None:
    """The refusal is sent from the accept loop: a refused client that reads
    nothing must not hold up the connections queued behind it."""
    server = Server(settings_for(work, max_clients=1), DEVICE, holdings, open_policy())
    ours, theirs = _unread_pair()
    try:
        assert _seconds_to(lambda: server._refuse_busy(ours)) < 0.5
        assert ours.fileno() == -1
    finally:
        theirs.close()


def test_a_last_word_to_a_peer_that_does_not_read_waits_a_second_at_most() -> None:
    """The error a connection is dropped with (or refused with) is sent on a
    best-effort basis: a peer that stopped reading holds the thread for
    about a second, not for good."""
    ours, theirs = _unread_pair()
    try:
        took = _seconds_to(
            lambda: Server._try_send(Channel(ours, Reply), ErrorReply(code="protocol", message="x"))
        )
        assert 0.9 <= took < 1.9, took
    finally:
        ours.close()
        theirs.close()


def test_busy_refusals_are_logged_once_a_second_with_their_count(
    work: Path, holdings: Holdings, caplog
) -> None:
    metrics = CountingMetrics()
    server = Server(settings_for(work, max_clients=1), DEVICE, holdings, open_policy(), metrics)
    replies = []
    with caplog.at_level(logging.WARNING, "wcached.server"):
        for i in range(4):
            if i == 3:
                server._busy_logged_at -= 1.0  # a second has passed
            ours, theirs = socket.socketpair()
            server._refuse_busy(ours)
            assert ours.fileno() == -1  # closed once refused
            reply = Channel(theirs, Reply).recv(MAX_REPLY_BYTES, idle_timeout=1, frame_timeout=1)
            replies.append((reply.code, reply.message))
            theirs.close()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "refused 1 connection(s): 1 clients connected (max_clients)",
        "refused 3 connection(s): 1 clients connected (max_clients)",
    ]
    assert replies == [(Busy.code, "too many clients")] * 4 and metrics.errors == [Busy.code] * 4


class _Listener:
    """accept() as the kernel answers it: each of ``results`` in turn, an
    exception raised, then "nothing queued"."""

    def __init__(self, results: list[object]):
        self.results = list(results)

    def accept(self):
        if not self.results:
            raise BlockingIOError(errno.EAGAIN, "nothing queued")
        r = self.results.pop(0)
        if isinstance(r, BaseException):
            raise r
        return r, None


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM])
def test_out_of_fds_pauses_accepts_said_once_until_one_is_accepted(
    work: Path, holdings: Holdings, caplog, code: int
) -> None:
    server = Server(settings_for(work), DEVICE, holdings, open_policy())
    starved = OSError(code, os.strerror(code))
    with caplog.at_level(logging.INFO, "wcached.server"):
        for round_ in range(2):  # and once more: each time fds run out is said again
            server.listener = _Listener([starved])  # type: ignore[assignment]
            assert server.accept_pending() is False
            assert len(caplog.records) == 2 * round_ + 1  # said at once, not when it happens again
            server.listener = _Listener([starved])  # type: ignore[assignment]
            assert server.accept_pending() is False
            ours, theirs = socket.socketpair()
            server.listener = _Listener([ours])  # type: ignore[assignment]
            assert server.accept_pending() is True
            theirs.close()
            assert until(lambda: server._threads == 0)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    said = (
        "ERROR",
        f"accept failed: [Errno {code}] {os.strerror(code)}; "
        "pausing accepts (connections wait in the backlog)",
    )
    assert lines == [said, ("WARNING", "accepting again")] * 2


def test_another_accept_error_is_logged_and_accepting_goes_on(work: Path, holdings: Holdings, caplog) -> None:
    server = Server(settings_for(work), DEVICE, holdings, open_policy())
    with caplog.at_level(logging.INFO, "wcached.server"):
        server.listener = _Listener([ConnectionAbortedError(errno.ECONNABORTED, "aborted")])  # type: ignore[assignment]
        assert server.accept_pending() is True
        server.listener = _Listener([InterruptedError(errno.EINTR, "interrupted")])  # type: ignore[assignment]
        assert server.accept_pending() is True
    assert [r.getMessage() for r in caplog.records] == ["accept failed: [Errno 103] aborted"]


def test_one_call_takes_every_queued_connection_beyond_the_full_ones(work: Path, holdings: Holdings) -> None:
    """accept_pending() empties the backlog: a slot's client, then (the
    slots full) the daemon's own probe served beside it and one more
    refused busy, all in one call, which says accepting may go on."""
    server = Server(settings_for(work, max_clients=1), DEVICE, holdings, open_policy())
    pairs = [socket.socketpair() for _ in range(3)]  # this process at both ends: its own probe
    try:
        server.listener = _Listener([ours for ours, _ in pairs])  # type: ignore[assignment]
        assert server.accept_pending() is True
        assert server.listener.results == []  # type: ignore[attr-defined]
        lease, probe, refused = (Channel(theirs, Reply) for _, theirs in pairs)
        for chan in (lease, probe):
            chan.send(Hello(version=PROTOCOL_VERSION, min_version=1), timeout=5)
            assert _reply(chan).instance == "cpu0"  # type: ignore[attr-defined]
        busy = _reply(refused)
        assert isinstance(busy, ErrorReply) and (busy.code, busy.message) == (Busy.code, "too many clients")
    finally:
        for _, theirs in pairs:
            theirs.close()
    assert until(lambda: server._threads == 0 and not server._own_probe)


def test_a_lease_holds_its_slot_until_it_leaves(server: Server) -> None:
    path = server.settings.socket_path
    conns = [DaemonConnection(path) for _ in range(3)]
    try:
        assert server._threads == 3
    finally:
        for c in conns:
            c.close()
    assert until(lambda: server._threads == 0)


def test_release_tells_how_many_attached_clients_keep_their_mappings(
    work: Path, sharded_ckpt: Path, caplog
) -> None:
    h = filled_holdings(Path(shutil.copytree(sharded_ckpt, work / "ckpt")))
    try:
        with serving(Server(settings_for(work), DEVICE, h, open_policy())) as server:
            path = server.settings.socket_path
            with DaemonConnection(path) as a, DaemonConnection(path) as b, DaemonConnection(path) as admin:
                close_fds(a.attach("default")[1])
                close_fds(b.attach("default")[1])
                with caplog.at_level(logging.WARNING, "wcached.server"):
                    r = admin.release("default")
                assert (r.model, r.attached_clients) == ("default", 2)
                said = (
                    f"model default released by pid {os.getpid()}; 2 attached client(s) keep their mappings"
                )
                assert [(r.levelname, r.getMessage(), r.model) for r in caplog.records] == [  # type: ignore[attr-defined]
                    ("WARNING", said, "default")
                ]
                with pytest.raises(ModelReleased):
                    admin.attach("default")
                assert server.client_count == 2  # they keep their mappings, and their leases
    finally:
        h.close()


def test_status_reply_is_of_this_device(work: Path, holdings: Holdings) -> None:
    device = dataclasses.replace(DEVICE, memory_bytes=141 * 2**30)  # as NVML gives a GPU's
    with serving(Server(settings_for(work), device, holdings, open_policy())) as server:
        status = server.status()
    assert (status.device, status.backend, status.device_index, status.device_memory_bytes) == (
        DEVICE.name,
        DEVICE.backend,
        DEVICE.index,
        141 * 2**30,
    )
    assert 0 <= status.uptime_s < 60


def test_status_says_how_long_the_daemon_and_each_lease_have_been_there_in_milliseconds(
    server: Server,
) -> None:
    """What a client is told: the daemon serving, its uptime and each
    lease's age, both counted from when they began and to the millisecond."""
    with DaemonConnection(server.settings.socket_path) as lease:
        close_fds(lease.attach("default")[1])
        for pause in (0.05, 0.1, 0.2):  # three readings: a figure with more digits shows in one
            time.sleep(pause)
            status = lease.status()
            assert status.state == "serving"
            age = status.clients[0].connected_s
            assert pause <= age < 5 and age <= status.uptime_s < age + 2  # the server began just before
            assert (round(age, 3), round(status.uptime_s, 3)) == (age, status.uptime_s)


def test_the_metrics_read_the_servers_status_when_scraped(work: Path, holdings: Holdings) -> None:
    metrics = Metrics.for_device(DEVICE, ["default"])
    with serving(Server(settings_for(work), DEVICE, holdings, open_policy(), metrics)) as server:
        with DaemonConnection(server.settings.socket_path) as lease:
            close_fds(lease.attach("default")[1])
            lines = metrics.exposition().decode().splitlines()
    assert 'wcached_up{gpu_uuid="",instance="cpu0"} 1.0' in lines
    assert 'wcached_leases{gpu_uuid="",instance="cpu0",model="default"} 1.0' in lines


# -- who may connect, and who may release ---------------------------------------------

_CLIENT_AS_ANOTHER_USER = textwrap.dedent(
    """
    import os, sys
    from wcached.client.connection import DaemonConnection
    from wcached.errors import WcacheError
    print(os.getpid(), os.getuid(), os.getgid())
    try:
        with DaemonConnection(sys.argv[1], timeout=5) as conn:
            if sys.argv[2] == "release":
                conn.release("default")
            print("served")
    except WcacheError as e:
        print(e.code, e)
    """
)


def _as_test_user(server: Server, ask: str) -> tuple[tuple[int, int, int], str]:
    """A client run as the suite's own unprivileged user, in the socket's
    group (so the socket's mode lets it connect and only the daemon's policy
    decides): its pid, uid and gid, and what it was told."""
    require_test_user()
    path = server.settings.socket_path
    r = run_as(
        TEST_USER,
        [sys.executable, "-c", _CLIENT_AS_ANOTHER_USER, path, ask],
        timeout=60,
        extra_groups=[os.stat(path).st_gid],
    )
    assert r.returncode == 0, r.stderr
    ids, told = r.stdout.strip().split("\n")
    pid, uid, gid = map(int, ids.split())
    return (pid, uid, gid), told


def _policy(**names: tuple[str, ...]) -> AccessPolicy:
    return AccessPolicy.from_lists(AccessLists(names.get("users", ()), names.get("groups", ())), "")


def test_a_user_the_policy_does_not_allow_is_refused_by_uid_and_nothing_is_served(
    work: Path, holdings: Holdings, caplog
) -> None:
    metrics = CountingMetrics()
    with serving(Server(settings_for(work), DEVICE, holdings, _policy(), metrics)) as server:
        with caplog.at_level(logging.INFO, "wcached.server"):
            (pid, uid, gid), told = _as_test_user(server, "connect")
        assert told == f"{PermissionRefused.code} uid {uid} is not allowed to attach to cpu0"
        assert uid not in (0, os.getuid())
        assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
            ("WARNING", f"refused pid {pid} uid {uid} gid {gid}: not allowed")
        ]
        assert metrics.errors == [PermissionRefused.code]
        assert until(lambda: server._threads == 0) and not server._sessions
        assert metrics.attaches == []


def test_an_allowed_user_that_is_not_the_daemons_own_may_not_release(
    work: Path, holdings: Holdings, caplog
) -> None:
    """Attaching is for the users the config names; release (which ends what
    every engine shares) for root and the daemon's own user only."""
    policy = _policy(users=(TEST_USER,))
    with serving(Server(settings_for(work), DEVICE, holdings, policy, CountingMetrics())) as server:
        assert _as_test_user(server, "connect")[1] == "served"
        with caplog.at_level(logging.WARNING, "wcached.server"):
            (pid, _, _), told = _as_test_user(server, "release")
        said = "release is reserved to root and the daemon's own user"
        assert told == f"{PermissionRefused.code} {said}"
        assert caplog.messages == [f"request from pid {pid} failed: {said}"]
        assert [m.state for m in holdings.statuses()] == ["ready"]


def test_a_peer_whose_credentials_cannot_be_read_is_dropped_unserved(
    server: Server, monkeypatch, caplog
) -> None:
    from wcached.daemon import server as server_module

    def unreadable(conn: socket.socket) -> object:
        raise OSError(errno.ENOTCONN, "Transport endpoint is not connected")

    monkeypatch.setattr(server_module.PeerCredentials, "of", unreadable)
    with caplog.at_level(logging.INFO, "wcached.server"), socket.socket(socket.AF_UNIX) as sock:
        sock.connect(server.settings.socket_path)
        sock.settimeout(5)
        assert sock.recv(65536) == b""  # closed, not a word sent
        assert until(lambda: server._threads == 0)
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "could not read peer credentials: [Errno 107] Transport endpoint is not connected")
    ]
    assert server.metrics.errors == []  # type: ignore[attr-defined]


# -- what a client cannot stall, and what the journal says --------------------------


@pytest.fixture
def quick(work: Path, holdings: Holdings) -> Iterator[Server]:
    """A server whose connections time out in 0.3 s."""
    settings = settings_for(work, connection_timeout_s=0.3)
    with serving(Server(settings, DEVICE, holdings, open_policy(), CountingMetrics())) as s:
        yield s


def _dropped(server: Server, sock: socket.socket, caplog) -> str:
    """What the journal said when the server dropped ``sock``'s connection,
    once it has (an end of stream, its thread gone)."""
    sock.settimeout(10)
    with contextlib.suppress(ConnectionResetError):
        while sock.recv(65536):
            pass
    assert until(lambda: server._threads == 0)
    return next(m for m in caplog.messages if m.startswith("dropped pid"))


@pytest.mark.parametrize(
    ("sent", "why"),
    [(b"", "timed out waiting for a frame"), (b"\0\0", "timed out inside a frame")],
    ids=["nothing", "half-a-frame"],
)
def test_a_client_that_never_says_hello_is_dropped_after_the_timeout(
    quick: Server, caplog, sent: bytes, why: str
) -> None:
    with caplog.at_level(logging.WARNING, "wcached.server"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(quick.settings.socket_path)
        sock.sendall(sent)
        started = time.monotonic()
        said = _dropped(quick, sock, caplog)
        sock.close()
    assert 0.25 <= time.monotonic() - started < 5
    assert said == f"dropped pid {os.getpid()}: {why}"


def test_a_first_message_that_is_not_hello_ends_the_connection_saying_why(server: Server, caplog) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(server.settings.socket_path)
    chan = Channel(sock, Reply)
    with caplog.at_level(logging.WARNING, "wcached.server"):
        chan.send(StatusRequest(), timeout=5)
        reply = _reply(chan)
        said = _dropped(server, sock, caplog)
        sock.close()
    why = "first message must be hello, got StatusRequest"
    assert isinstance(reply, ErrorReply) and (reply.code, reply.message) == (ProtocolError.code, why)
    assert said == f"dropped pid {os.getpid()}: {why}"
    assert server.metrics.errors == [ProtocolError.code]  # type: ignore[attr-defined]


def test_a_request_cut_off_mid_frame_is_dropped_after_the_timeout_but_idling_is_not(
    quick: Server, caplog
) -> None:
    """Between requests a client may idle for as long as it likes (the
    connection is its lease); half a frame, sent and never finished, is
    dropped after connection_timeout_s."""
    chan = _raw(quick)
    time.sleep(0.6)  # idle for twice the timeout: still served
    chan.send(StatusRequest(), timeout=5)
    assert isinstance(_reply(chan), StatusReply)
    with caplog.at_level(logging.WARNING, "wcached.server"):
        chan.sock.sendall(b"\0\0")  # two bytes of a frame's four-byte length
        said = _dropped(quick, chan.sock, caplog)
        chan.sock.close()
    assert said == f"dropped pid {os.getpid()}: timed out inside a frame"


_UNREAD = {
    "status": msgspec.msgpack.encode(StatusRequest()),
    "attach": msgspec.msgpack.encode(Attach(model="default")),
    "mismatch": msgspec.msgpack.encode(Attach(model="default", expect={"dtype": "float64"})),
    "unknown-model": msgspec.msgpack.encode(Attach(model="nope")),
    "bad-request": b"\xc1",  # a whole frame, no msgpack: its error reply
    "release": msgspec.msgpack.encode(Release(model="default")),
}


class _ReleasesAnything:
    """Holdings that take any number of releases (each one a reply)."""

    def release(self, name: str) -> None:
        pass

    def statuses(self) -> list:
        return []


@pytest.mark.parametrize("asked", list(_UNREAD))
def test_a_client_that_never_reads_its_replies_is_dropped_after_the_timeout(
    work: Path, holdings: Holdings, caplog, asked: str
) -> None:
    """Requests sent and their replies never read, whatever the reply (one
    served, a mismatch, an error, a release): once the socket's buffer is
    full the server waits connection_timeout_s for room, then drops the
    connection (a thread held for good by a client that stopped reading
    would be a slot lost)."""
    held = _ReleasesAnything() if asked == "release" else holdings
    settings = settings_for(work, connection_timeout_s=0.3)
    with serving(Server(settings, DEVICE, held, open_policy(), CountingMetrics())) as quick:  # type: ignore[arg-type]
        chan = _raw(quick)
        chan.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        frame = _UNREAD[asked]
        with caplog.at_level(logging.WARNING, "wcached.server"):
            chan.sock.settimeout(0.5)
            with contextlib.suppress(TimeoutError, BlockingIOError, BrokenPipeError, ConnectionResetError):
                for _ in range(20000):
                    chan.sock.sendall(len(frame).to_bytes(4, "big") + frame)
            assert until(lambda: quick._threads == 0, seconds=10)
            chan.sock.close()
    dropped = [m for m in caplog.messages if m.startswith(f"dropped pid {os.getpid()}: ")]
    assert len(dropped) == 1 and re.fullmatch(
        r".*: peer did not read a \d+-byte frame in time", dropped[0]
    ), dropped


def test_the_journal_names_each_request_that_failed_and_its_model(server: Server, caplog) -> None:
    """One line per failed or bad request, naming the pid and the cause;
    the lines about one model carry it as the record's ``model`` (the
    journal's WCACHED_MODEL=, which journalctl filters by)."""
    pid = os.getpid()
    with caplog.at_level(logging.INFO, "wcached.server"):
        chan = _raw(server)
        try:
            body = b"\xc1"  # no msgpack at all: a whole frame, so the stream is in step
            chan.sock.sendall(len(body).to_bytes(4, "big") + body)
            bad = _reply(chan)
            chan.send(Attach(model="nope"), timeout=5)
            nope = _reply(chan)
            chan.send(Attach(model="default", expect={"dtype": "float64"}), timeout=5)
            mismatch = _reply(chan)
            chan.send(Attach(model="default"), timeout=5)
            assert isinstance(_reply(chan), Attached)
            close_fds(chan.recv_fds(len(server.holdings.get("default").manifest.segments), timeout=5))
        finally:
            chan.sock.close()
        assert until(lambda: any("detached" in m for m in caplog.messages))
    lines = {r.getMessage(): r for r in caplog.records}
    assert isinstance(bad, ErrorReply)
    assert lines[f"bad request from pid {pid}: {bad.message}"].levelname == "WARNING"
    assert isinstance(nope, ErrorReply)
    failed = f"request from pid {pid} failed: {nope.message}"
    assert lines[failed].levelname == "WARNING"
    assert isinstance(mismatch, Mismatch)
    said = f"pid {pid}: cache key mismatch for default: {mismatch.message}"
    attached = f"pid {pid} (uid {os.getuid()}, raw) attached to default"
    detached = f"client pid {pid} detached from default"
    for line in (said, attached, detached):
        assert getattr(lines[line], "model", None) == "default", line
    assert lines[said].levelname == "WARNING" and lines[attached].levelname == "INFO"


def test_a_client_without_a_name_is_logged_as_client(server: Server, caplog) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(server.settings.socket_path)
    chan = Channel(sock, Reply)
    with caplog.at_level(logging.INFO, "wcached.server"):
        chan.send(Hello(version=PROTOCOL_VERSION, min_version=1), timeout=5)
        _reply(chan)
        chan.send(Attach(model="default"), timeout=5)
        assert isinstance(_reply(chan), Attached)
        close_fds(chan.recv_fds(len(server.holdings.get("default").manifest.segments), timeout=5))
        sock.close()
        said = f"pid {os.getpid()} (uid {os.getuid()}, client) attached to default"
        assert until(lambda: said in caplog.messages), caplog.messages


def test_a_connection_that_ends_under_the_server_is_said_at_info(server: Server, caplog) -> None:
    """The peer resetting the connection mid-conversation is no error of
    the daemon's: one line at info, naming the pid."""
    chan = _raw(server)
    with caplog.at_level(logging.INFO, "wcached.server"):
        chan.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, (1).to_bytes(4, "little") * 2)
        chan.send(StatusRequest(), timeout=5)
        time.sleep(0.2)  # the reply sent, unread: closing with it unread resets
        chan.sock.close()
        assert until(lambda: server._threads == 0)
    ended = [
        r for r in caplog.records if r.getMessage().startswith(f"connection of pid {os.getpid()} ended: ")
    ]
    assert [r.levelname for r in ended] == ["INFO"], caplog.messages
    cause = ended[0].getMessage().removeprefix(f"connection of pid {os.getpid()} ended: ")
    assert cause == f"[Errno {errno.ECONNRESET}] {os.strerror(errno.ECONNRESET)}", cause
