"""The client trusts a daemon socket only if root, its own user or a daemon
user serves it: a squatter's fds are never used."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import fill_backlog, peer_as, require_other_users, run_as
from wcached.client.connection import DaemonConnection, check_daemon_peer, trusted_daemon_uids
from wcached.errors import PermissionRefused
from wcached.protocol.messages import PROTOCOL_VERSION

SQUATTER = textwrap.dedent(
    """
    import socket, sys, time
    s = socket.socket(socket.AF_UNIX)
    s.bind(sys.argv[1])
    s.listen(4)
    open(sys.argv[1] + ".up", "w").close()
    for _ in range(int(sys.argv[2])):
        c, _ = s.accept()
        c.settimeout(5)
        try:
            c.recv(4096)  # a hello, from a client that trusted it
        except OSError:
            pass
        c.close()  # and no welcome: that client gets "closed"
    """
)


def test_socket_served_by_an_untrusted_user_is_refused(work: Path) -> None:
    """Refused unless the client's daemon users name the socket's user, by
    name or by uid (then it is greeted: here, the squatter hangs up)."""
    require_other_users()
    import pwd
    import subprocess
    import threading

    from wcached.errors import ProtocolError

    run = work / "squat"
    run.mkdir(mode=0o777)
    run.chmod(0o777)
    path = str(run / "cpu0.sock")
    result: dict = {}
    t = threading.Thread(
        target=lambda: result.update(
            r=run_as("nobody", [sys.executable, "-c", SQUATTER, path, "3"], timeout=30)
        )
    )
    t.start()
    deadline = time.monotonic() + 20
    while not os.path.exists(path + ".up"):
        assert time.monotonic() < deadline, result
        time.sleep(0.05)
    with pytest.raises(
        PermissionRefused, match=rf"^{path} is served by uid \d+ \(pid \d+\), .* refusing to use it$"
    ):
        DaemonConnection(path, timeout=5, daemon_users=["wcache"])
    nobody = pwd.getpwnam("nobody").pw_uid
    for users in (["nobody"], [str(nobody)]):
        with pytest.raises(ProtocolError, match=f"^daemon at {path} closed the connection$"):
            DaemonConnection(path, timeout=5, daemon_users=users)
    t.join(30)
    assert isinstance(result["r"], subprocess.CompletedProcess)


def test_trusted_daemon_users_from_the_environment(monkeypatch) -> None:
    import pwd

    nobody = pwd.getpwnam("nobody").pw_uid
    monkeypatch.setenv("WCACHED_DAEMON_USERS", "nobody, no-such-user")
    assert trusted_daemon_uids() == {0, os.geteuid(), nobody}
    # Named by uid, or by the caller (who wins over the environment).
    monkeypatch.setenv("WCACHED_DAEMON_USERS", "4242")
    assert trusted_daemon_uids() == {0, os.geteuid(), 4242}
    assert trusted_daemon_uids(["nobody"]) == {0, os.geteuid(), nobody}
    monkeypatch.delenv("WCACHED_DAEMON_USERS")
    assert nobody not in trusted_daemon_uids()


def test_a_daemon_user_entry_is_read_as_the_daemons_allowed_users_reads_it(monkeypatch) -> None:
    """The client's list of daemon users takes an entry as the daemon's
    ``allowed_users`` does (wcached.accounts): a name, or ASCII digits below
    2**32 - 1; a non-ASCII digit is no id (before, "²" made every attach
    raise ValueError and "٣" trusted uid 3), nor is an id past uid_t's."""
    monkeypatch.setenv("WCACHED_DAEMON_USERS", "²,٣,4294967295,4294967296,4294967294,root")
    assert trusted_daemon_uids() == {0, os.geteuid(), 4294967294}
    assert trusted_daemon_uids(["a\x00b", "²"]) == {0, os.geteuid()}


def test_a_daemon_user_with_a_uid_past_two_to_the_31_is_trusted_by_its_number() -> None:
    """A daemon running as uid 3,000,000,000 (a container's) is trusted when
    the list names that number, and refused when it does not."""
    with peer_as(3_000_000_000, 3_000_000_000) as (conn, pid):
        assert check_daemon_peer(conn, "/run/wcache/cpu0.sock", ["3000000000"]) == pid
        with pytest.raises(PermissionRefused, match="served by uid 3000000000"):
            check_daemon_peer(conn, "/run/wcache/cpu0.sock", ["wcache"])


def test_the_socket_directory_comes_from_the_argument_the_config_in_effect_or_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wcached import defaults
    from wcached.client.connection import find_socket_dir

    cfg = tmp_path / "wcached.toml"
    cfg.write_text('[daemon]\nsocket_dir = "/srv/sockets"\n')
    assert find_socket_dir("/given", str(cfg)) == "/given"
    assert find_socket_dir(None, str(cfg)) == "/srv/sockets"
    # No --config: the file $WCACHED_CONFIG names, when there is one.
    monkeypatch.setenv(defaults.CONFIG_ENV, str(cfg))
    assert find_socket_dir(None, None) == "/srv/sockets"
    monkeypatch.setenv(defaults.CONFIG_ENV, str(tmp_path / "none.toml"))
    assert find_socket_dir(None, None) == defaults.SOCKET_DIR


def _attach_through(mode: str, work: Path, tmp_path: Path) -> tuple[int, list]:
    """Attach through a daemon of another release (a proxy in front of a real
    one): the version the connection speaks, and the hellos it received."""
    from tests.helpers import one_model_config, run_daemon
    from tests.integrations.fake_daemons import Proxy
    from wcached.cli.demo import generate_llama
    from wcached.client import attach

    ckpt = generate_llama(tmp_path / "model")
    with run_daemon(one_model_config(work, ckpt)) as d:
        proxy = Proxy(tmp_path / mode, d.socket_path, mode)
        try:
            with attach("default", "cpu0", socket_dir=str(tmp_path / mode)) as a:
                assert a.tensors
                return a.connection.welcome.version, proxy.hellos
        finally:
            proxy.close()


def test_a_version_1_daemon_is_greeted_again_at_version_1(work: Path, tmp_path: Path) -> None:
    """The first release's daemons wanted exactly version 1 and knew no
    range: refused at this release's version, the client greets at 1."""
    version, hellos = _attach_through("v1", work, tmp_path)
    assert version == 1
    assert [h["version"] for h in hellos] == [PROTOCOL_VERSION, 1] and "min_version" not in hellos[1]


def test_a_later_daemon_with_unknown_fields_is_attached(work: Path, tmp_path: Path) -> None:
    version, hellos = _attach_through("next", work, tmp_path)
    assert version == PROTOCOL_VERSION and hellos[0]["version"] == PROTOCOL_VERSION
    # Unnamed, a client is its program and pid in the daemon's log and status.
    assert hellos[0]["client"] == f"{os.path.basename(sys.argv[0])}[{os.getpid()}]"


def _answering(path: str, replies: list, connections: int = 1) -> list:
    """A stand-in daemon at ``path``: ``connections`` connections, on each a
    request answered with each of ``replies`` in turn (bytes are sent as
    they are), then held open a while; returns the requests it got."""
    import contextlib
    import socket
    import threading

    from wcached.protocol.messages import Request
    from wcached.protocol.wire import Channel

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(connections)
    got: list = []

    def serve() -> None:
        with server:
            for _ in range(connections):
                conn, _ = server.accept()
                with conn:
                    chan = Channel(conn, Request)
                    for reply in replies:
                        got.append(chan.recv(65536, idle_timeout=5, frame_timeout=5))
                        if isinstance(reply, bytes):
                            conn.sendall(reply)
                        else:
                            chan.send(reply)
                    # Held until the client hangs up (it may retry at once).
                    conn.settimeout(2)
                    with contextlib.suppress(OSError):
                        conn.recv(1)

    threading.Thread(target=serve, daemon=True).start()
    return got


def _welcome(version: int = PROTOCOL_VERSION):
    from wcached.protocol.messages import Welcome

    return Welcome(version=version, instance="cpu0", device="host memory", daemon_version="t", pid=1)


def test_a_reply_of_the_wrong_kind_is_a_protocol_error_naming_it(tmp_path: Path) -> None:
    """A daemon (of another release, or not one) that answers with another
    message than the request's is refused, naming what it sent."""
    from wcached.errors import ProtocolError
    from wcached.protocol.messages import Released, StatusReply

    _answering(str(tmp_path / "a.sock"), [Released(model="m", attached_clients=0)])
    with pytest.raises(ProtocolError, match=r"^expected welcome, got Released$"):
        DaemonConnection(str(tmp_path / "a.sock"), timeout=5)
    _answering(str(tmp_path / "b.sock"), [_welcome(), Released(model="m", attached_clients=0)])
    with DaemonConnection(str(tmp_path / "b.sock"), timeout=5) as conn:
        with pytest.raises(ProtocolError, match=r"^expected status_reply, got Released$"):
            conn.status()
    status = StatusReply(
        instance="cpu0",
        device="host memory",
        backend="host",
        state="serving",
        pid=1,
        daemon_version="t",
        uptime_s=1.0,
        models=[],
        clients=[],
    )
    _answering(str(tmp_path / "c.sock"), [_welcome(), status])
    with DaemonConnection(str(tmp_path / "c.sock"), timeout=5) as conn:
        with pytest.raises(ProtocolError, match=r"^expected released, got StatusReply$"):
            conn.release("m")


def test_a_daemon_that_chose_a_version_this_client_does_not_speak_is_refused(tmp_path: Path) -> None:
    """Greeted at this release's range and again at version 1, it chose a
    later version both times: the error says what each side speaks."""
    from wcached.errors import VersionMismatch
    from wcached.protocol.messages import MIN_PROTOCOL_VERSION

    hellos = _answering(str(tmp_path / "a.sock"), [_welcome(PROTOCOL_VERSION + 1)], connections=2)
    with pytest.raises(VersionMismatch) as e:
        DaemonConnection(str(tmp_path / "a.sock"), timeout=2)
    assert str(e.value) == (
        f"daemon chose protocol {PROTOCOL_VERSION + 1}, "
        f"this client speaks {MIN_PROTOCOL_VERSION}..{PROTOCOL_VERSION}"
    )
    assert [h.version for h in hellos] == [PROTOCOL_VERSION, 1]


def test_a_named_client_is_greeted_by_its_name(tmp_path: Path) -> None:
    hellos = _answering(str(tmp_path / "a.sock"), [_welcome()])
    with DaemonConnection(str(tmp_path / "a.sock"), timeout=5, client="engine-7"):
        assert hellos[0].client == "engine-7"


def test_a_daemon_whose_backlog_stays_full_times_the_client_out(tmp_path: Path) -> None:
    """A daemon that stopped accepting (wedged) while clients queue: the
    client's timeout bounds its connect too."""
    import socket

    from wcached.errors import DaemonUnavailable

    path = str(tmp_path / "full.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(0)
    queued = []
    try:
        queued += fill_backlog(path)
        started = time.monotonic()
        with pytest.raises(DaemonUnavailable, match=f"^timed out connecting to {path}$"):
            DaemonConnection(path, timeout=0.3)
        assert time.monotonic() - started < 2
    finally:
        for s in queued:
            s.close()
        server.close()


def test_a_daemon_that_stops_answering_times_the_client_out(tmp_path: Path) -> None:
    """Accepted and never welcomed, or welcomed and then silent mid-reply:
    the client gives up at its timeout, naming where it waited."""
    import socket

    from wcached.errors import TimeoutExpired
    from wcached.protocol.wire import HEADER

    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(tmp_path / "silent.sock"))
    silent.listen(1)
    started = time.monotonic()
    with pytest.raises(TimeoutExpired, match="waiting for a frame"):
        DaemonConnection(str(tmp_path / "silent.sock"), timeout=0.5)
    assert time.monotonic() - started < 3
    silent.close()
    # A reply that starts and never ends: the frame's own deadline.
    _answering(str(tmp_path / "half.sock"), [_welcome(), HEADER.pack(100) + b"ab"])
    with DaemonConnection(str(tmp_path / "half.sock"), timeout=0.5) as conn:
        started = time.monotonic()
        with pytest.raises(TimeoutExpired, match="inside a frame"):
            conn.status()
        assert time.monotonic() - started < 1.5


def test_the_replies_types_are_resolved_when_the_client_is_imported() -> None:
    """An engine's first attach does not pay for msgspec's evaluation of the
    reply structs' annotations (~2 ms): importing the client did it."""
    import subprocess
    import sys

    # msgspec evaluates the annotations (strings here) through typing's
    # ForwardRef: counted while a decoder for the replies is made.
    script = """
import typing
from wcached.client import connection
from wcached.protocol.messages import Reply
import msgspec
calls = []
real = typing.ForwardRef._evaluate
typing.ForwardRef._evaluate = lambda *a, **k: calls.append(a) or real(*a, **k)
msgspec.msgpack.Decoder(Reply)
print(len(calls))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0", out.stdout + out.stderr


def test_a_client_at_max_clients_waits_for_a_slot_until_its_timeout(work: Path, sharded_ckpt: Path) -> None:
    """A daemon at max_clients answers busy: the client tries again, with a
    delay that grows to 0.5 s, and is in soon after a slot frees; with none
    freed it gives up at its timeout, not at the first answer."""
    import threading

    from tests.helpers import run_daemon, write_config
    from wcached.errors import Busy

    cfg = write_config(
        work / "wcached.toml",
        models=[{"name": "default", "path": str(sharded_ckpt)}],
        daemon={"socket_dir": str(work / "run"), "max_clients": 1, "connection_timeout_s": 30.0},
    )
    with run_daemon(cfg) as d:
        first = DaemonConnection(d.socket_path, timeout=5)
        started = time.monotonic()
        with pytest.raises(Busy, match="too many clients"):
            DaemonConnection(d.socket_path, timeout=0.6)
        # (Tries at 0, 0.05, 0.15 and 0.35 s; the next would pass the timeout.)
        assert 0.3 <= time.monotonic() - started < 2.0
        threading.Timer(1.0, first.close).start()
        started = time.monotonic()
        with DaemonConnection(d.socket_path, timeout=10) as second:
            waited = time.monotonic() - started
            assert second.status().state == "serving"
        assert 0.9 <= waited < 2.5, waited


def test_an_attach_request_goes_right_behind_the_hello(tmp_path: Path) -> None:
    """attach() does not wait for the welcome before asking: this stand-in
    daemon reads the attach request before it answers the hello (a client
    that waited for the welcome would wait in vain: it times out), and its
    reply to it is read as the attach's (here a mismatch: the connection is
    closed, nothing kept)."""
    import socket
    import threading

    from wcached.errors import KeyMismatch
    from wcached.protocol.messages import Attach, Hello, Mismatch, Request
    from wcached.protocol.wire import Channel

    path = str(tmp_path / "d.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    seen: dict = {}

    def serve() -> None:
        with server:
            conn, _ = server.accept()
            with conn:
                chan = Channel(conn, Request)
                seen["hello"] = chan.recv(65536, idle_timeout=5, frame_timeout=5)
                seen["request"] = chan.recv(65536, idle_timeout=3, frame_timeout=3)
                chan.send(_welcome())
                chan.send(Mismatch(model="m", fields=["dtype"], message="dtype: bfloat16 != float16"))
                conn.settimeout(5)
                seen["after"] = conn.recv(1)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with pytest.raises(KeyMismatch, match="dtype"):
        DaemonConnection.attaching(path, "m", {"dtype": "float16"}, timeout=5)
    t.join(10)
    assert isinstance(seen["hello"], Hello)
    assert seen["request"] == Attach(model="m", expect={"dtype": "float16"})
    assert seen["after"] == b""  # the client hung up: nothing held after a failed attach


def test_meanwhile_runs_once_across_retries_before_the_welcome_is_read(tmp_path: Path) -> None:
    """The work an attach does while it waits (starting the lease watcher)
    runs once, after its hello went out and before the welcome was read, not
    again when the client greets a second time (here after a busy reply)."""
    import socket
    import threading

    from wcached.errors import Busy, KeyMismatch
    from wcached.protocol.messages import ErrorReply, Mismatch, Request
    from wcached.protocol.wire import Channel

    path = str(tmp_path / "d.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(2)
    events: list[str] = []

    def serve() -> None:
        with server:
            conn, _ = server.accept()
            with conn:  # the first greeting: busy
                Channel(conn, Request).recv(65536, idle_timeout=5, frame_timeout=5)
                Channel(conn, Request).send(ErrorReply(code=Busy.code, message="too many clients"))
            conn, _ = server.accept()
            with conn:
                chan = Channel(conn, Request)
                chan.recv(65536, idle_timeout=5, frame_timeout=5)
                chan.recv(65536, idle_timeout=5, frame_timeout=5)
                events.append("welcome sent")
                chan.send(_welcome())
                chan.send(Mismatch(model="m", fields=["dtype"], message="dtype differs"))
                conn.settimeout(5)
                conn.recv(1)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with pytest.raises(KeyMismatch):
        DaemonConnection.attaching(path, "m", timeout=5, meanwhile=lambda: events.append("meanwhile"))
    t.join(10)
    assert events == ["meanwhile", "welcome sent"]


def test_a_daemon_that_closes_with_the_pipelined_attach_unread_is_said_to_have_closed(
    tmp_path: Path,
) -> None:
    """A daemon stopping between its welcome and the attach queued behind the
    hello closes with that request unread: the kernel then says "reset", and
    the client reports the daemon closing the connection (a protocol error a
    caller handles), not a bare ConnectionResetError."""
    import socket
    import threading

    from wcached.errors import ProtocolError
    from wcached.protocol.messages import Request
    from wcached.protocol.wire import Channel

    path = str(tmp_path / "d.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def serve() -> None:
        with server:
            conn, _ = server.accept()
            with conn:
                chan = Channel(conn, Request)
                chan.recv(65536, idle_timeout=5, frame_timeout=5)  # the hello; the attach stays unread
                chan.send(_welcome())

    threading.Thread(target=serve, daemon=True).start()
    with pytest.raises(ProtocolError, match=r"closed the connection$"):
        DaemonConnection.attaching(path, "m", timeout=5)


def test_an_attach_answered_with_another_kind_of_reply_is_a_protocol_error_naming_it(tmp_path: Path) -> None:
    from wcached.errors import ProtocolError
    from wcached.protocol.messages import Released

    _answering(str(tmp_path / "a.sock"), [_welcome(), Released(model="m", attached_clients=0)])
    with pytest.raises(ProtocolError, match=r"^expected attached, got Released$"):
        DaemonConnection.attaching(str(tmp_path / "a.sock"), "m", timeout=5)
