from __future__ import annotations

import os
import socket
import struct
import sys
import threading
import time

import msgspec
import pytest

from tests.helpers import TEST_USER, fds_opened_since, fill_backlog, open_fds, require_test_user, run_as
from wcached.errors import DaemonUnavailable, FrameTooLarge, ProtocolError, TimeoutExpired
from wcached.protocol.messages import Hello, Request, StatusRequest
from wcached.protocol.wire import MAX_REQUEST_BYTES, Channel, Deadline, PeerClosed, close_fds, connect


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


def test_frames_round_trip(pair) -> None:
    a, b = pair
    Channel(a, Request).send(Hello(version=1, client="c"))
    Channel(a, Request).send(StatusRequest())
    rx = Channel(b, Request)
    assert rx.recv(MAX_REQUEST_BYTES) == Hello(version=1, client="c")
    assert rx.recv(MAX_REQUEST_BYTES) == StatusRequest()


def test_oversized_frame_is_refused_before_reading_it(pair) -> None:
    a, b = pair
    a.sendall(struct.pack(">I", MAX_REQUEST_BYTES + 1))
    with pytest.raises(FrameTooLarge, match="exceeds the limit"):
        Channel(b, Request).recv(MAX_REQUEST_BYTES, frame_timeout=1)


def test_malformed_body_is_a_protocol_error(pair) -> None:
    a, b = pair
    a.sendall(struct.pack(">I", 3) + b"\xc1\xc1\xc1")
    with pytest.raises(ProtocolError, match="malformed"):
        Channel(b, Request).recv(MAX_REQUEST_BYTES, frame_timeout=1)


def test_clean_close_and_truncated_frame(pair) -> None:
    a, b = pair
    a.sendall(struct.pack(">I", 10) + b"abc")
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(ProtocolError, match="inside a frame"):
        Channel(b, Request).recv(MAX_REQUEST_BYTES, frame_timeout=1)
    c, d = socket.socketpair()
    c.close()
    with pytest.raises(PeerClosed, match=r"^peer closed the connection$"):
        Channel(d, Request).recv(MAX_REQUEST_BYTES)
    d.close()


def test_deadlines(pair) -> None:
    a, b = pair
    with pytest.raises(TimeoutExpired, match=r"^timed out waiting for a frame$"):
        Channel(b, Request).recv(MAX_REQUEST_BYTES, idle_timeout=0.1)
    a.sendall(struct.pack(">I", 10) + b"ab")
    with pytest.raises(TimeoutExpired, match=r"^timed out inside a frame$"):
        Channel(b, Request).recv(MAX_REQUEST_BYTES, idle_timeout=1, frame_timeout=0.2)


def test_more_fds_than_one_scm_rights_batch(pair) -> None:
    a, b = pair
    fds = []
    for i in range(600):
        r, w = os.pipe()
        os.write(w, bytes([i % 256]))
        os.close(w)
        fds.append(r)
    t = threading.Thread(target=lambda: Channel(a, Request).send(StatusRequest(), fds=fds))
    t.start()
    rx = Channel(b, Request)
    assert rx.recv(MAX_REQUEST_BYTES, frame_timeout=5) == StatusRequest()
    got = rx.recv_fds(600, timeout=5)
    t.join()
    close_fds(fds)
    assert len(got) == 600
    assert [os.read(fd, 1)[0] for fd in got] == [i % 256 for i in range(600)]
    # Close-on-exec as received: a process the engine spawns gets none.
    assert all(os.get_inheritable(fd) is False for fd in got)
    close_fds(got)


def test_connect_to_missing_socket(tmp_path) -> None:
    with pytest.raises(DaemonUnavailable, match="no daemon socket"):
        connect(str(tmp_path / "none.sock"), 1)
    stale = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(stale))
    s.close()
    with pytest.raises(DaemonUnavailable, match="refuses"):
        connect(str(stale), 1)


def test_a_frame_of_exactly_the_limit_is_read(pair) -> None:
    a, b = pair
    body = msgspec.msgpack.encode(Hello(version=1, client="x" * 100))
    a.sendall(struct.pack(">I", len(body)) + body)
    assert Channel(b, Request).recv(len(body), frame_timeout=1) == Hello(version=1, client="x" * 100)
    a.sendall(struct.pack(">I", len(body)) + body)
    with pytest.raises(
        FrameTooLarge, match=f"frame of {len(body)} bytes exceeds the limit of {len(body) - 1}"
    ):
        Channel(b, Request).recv(len(body) - 1, frame_timeout=1)


def _pipes(n: int) -> list[int]:
    fds = []
    for _ in range(n):
        r, w = os.pipe()
        os.close(w)
        fds.append(r)
    return fds


@pytest.mark.parametrize(
    "send, error",
    [
        # fds under another byte than the marker
        (lambda s, fds: socket.send_fds(s, [b"X"], fds[:2]), "^expected an fd batch marker$"),
        # a marker that carries no fds
        (lambda s, fds: s.sendall(b"F"), "^expected an fd batch marker$"),
        # one batch of the two announced, then the peer goes
        (
            lambda s, fds: (socket.send_fds(s, [b"F"], fds[:253]), s.shutdown(socket.SHUT_WR)),
            "^connection closed after 253 of 300 fds$",
        ),
    ],
    ids=["wrong-marker", "marker-without-fds", "closed-part-way"],
)
def test_a_bad_fd_batch_is_a_protocol_error_and_leaves_no_fd_open(pair, send, error) -> None:
    """Whatever fds a peer managed to pass before its batch went wrong are
    closed: an engine that keeps running must not hold memory it never mapped."""
    a, b = pair
    fds = _pipes(300)
    before = open_fds()
    send(a, fds)
    with pytest.raises(ProtocolError, match=error):
        Channel(b, Request).recv_fds(300, timeout=2)
    assert fds_opened_since(before) == {}
    close_fds(fds)


@pytest.mark.parametrize("count", [1, 2, 254], ids=["one", "two", "past-one-batch"])
def test_more_fds_in_a_batch_than_announced_is_a_protocol_error_and_leaves_no_fd_open(pair, count) -> None:
    """The kernel truncates a batch with more fds than the receiver made room
    for (as it does when RLIMIT_NOFILE is too low): refused, none kept. The
    last batch of several has room for what is left of the count only."""
    a, b = pair
    whole, last = divmod(count, 253)
    fds = _pipes(253 * whole + last + 2)
    before = open_fds()
    for i in range(whole):
        socket.send_fds(a, [b"F"], fds[253 * i : 253 * (i + 1)])
    socket.send_fds(a, [b"F"], fds[253 * whole :])
    with pytest.raises(ProtocolError, match=r"^fd batch truncated \(RLIMIT_NOFILE too low\?\)$"):
        Channel(b, Request).recv_fds(count, timeout=2)
    assert fds_opened_since(before) == {}
    close_fds(fds)


def test_fds_that_stop_coming_time_out_and_leave_no_fd_open(pair) -> None:
    a, b = pair
    fds = _pipes(2)
    before = open_fds()
    socket.send_fds(a, [b"F"], fds[:1])
    with pytest.raises(TimeoutExpired, match=r"waiting for fds \(1 of 2\)"):
        Channel(b, Request).recv_fds(2, timeout=0.2)
    assert fds_opened_since(before) == {}
    close_fds(fds)


def test_a_peer_that_does_not_read_times_the_send_out(pair) -> None:
    a, _ = pair
    big = Hello(version=1, client="x" * (8 << 20))  # more than the socket buffers hold
    with pytest.raises(TimeoutExpired, match="did not read a"):
        Channel(a, Request).send(big, timeout=0.2)


def test_no_deadline_never_passes() -> None:
    assert Deadline(None).remaining() is None
    assert 0 < Deadline(5).remaining() <= 5
    with pytest.raises(TimeoutExpired, match=r"^deadline passed$"):
        Deadline(0).remaining()


def test_a_deadline_is_passed_at_its_very_moment(monkeypatch) -> None:
    """Zero seconds left is none left (a timeout of zero expires at once,
    even on a clock that has not moved)."""
    import wcached.protocol.wire as wire

    monkeypatch.setattr(wire.time, "monotonic", lambda: 100.0)
    deadline = Deadline(0)
    with pytest.raises(TimeoutExpired, match=r"^deadline passed$"):
        deadline.remaining()
    assert Deadline(0.5).remaining() == 0.5


def test_connect_waits_out_a_full_backlog_until_its_timeout(tmp_path) -> None:
    """A daemon busy accepting has a full listen backlog: a client keeps
    trying until its timeout, and gets in once the daemon accepts."""
    path = str(tmp_path / "busy.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(0)
    queued = []
    try:
        queued += fill_backlog(path)
        with pytest.raises(DaemonUnavailable, match="timed out connecting"):
            connect(path, 0.2)
        threading.Timer(0.3, lambda: [server.accept()[0].close() for _ in queued]).start()
        conn = connect(path, 5)
        conn.close()
    finally:
        for s in queued:
            s.close()
        server.close()


@pytest.mark.parametrize(
    ("sent", "error"),
    [
        (b"\x00", r"^connection closed inside a frame \(0 of 3 bytes\)$"),
        (struct.pack(">I", 10), r"^connection closed inside a frame \(0 of 10 bytes\)$"),
        (struct.pack(">I", 10) + b"abcd", r"^connection closed inside a frame \(4 of 10 bytes\)$"),
    ],
    ids=["inside-the-header", "after-the-header", "inside-the-body"],
)
def test_a_close_inside_a_frame_is_a_protocol_error_saying_where(pair, sent, error) -> None:
    """Only a close between frames is a clean one."""
    a, b = pair
    a.sendall(sent)
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(ProtocolError, match=error):
        Channel(b, Request).recv(MAX_REQUEST_BYTES, frame_timeout=1)


def test_a_frame_that_arrives_in_pieces_is_read_whole(pair) -> None:
    a, b = pair
    body = msgspec.msgpack.encode(Hello(version=1, client="piecemeal"))
    frame = struct.pack(">I", len(body)) + body

    def dribble() -> None:
        for i in range(0, len(frame), 3):
            a.sendall(frame[i : i + 3])
            time.sleep(0.01)

    t = threading.Thread(target=dribble)
    t.start()
    assert Channel(b, Request).recv(MAX_REQUEST_BYTES, frame_timeout=5) == Hello(
        version=1, client="piecemeal"
    )
    t.join()


def test_fds_then_the_next_frame_at_once_are_both_read(pair) -> None:
    """The fd batch's marker is read alone: the frame right behind it is not
    swallowed with it."""
    a, b = pair
    fds = _pipes(2)
    tx = Channel(a, Request)
    tx.send(StatusRequest(), fds=fds)
    tx.send(Hello(version=1, client="next"))
    rx = Channel(b, Request)
    assert rx.recv(MAX_REQUEST_BYTES, frame_timeout=2) == StatusRequest()
    got = rx.recv_fds(2, timeout=2)
    assert rx.recv(MAX_REQUEST_BYTES, frame_timeout=2) == Hello(version=1, client="next")
    assert len(got) == 2
    close_fds(got + fds)


def test_connect_without_a_timeout_waits_for_a_full_backlog_to_drain(tmp_path) -> None:
    path = str(tmp_path / "busy.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(0)
    queued = fill_backlog(path)
    try:
        threading.Timer(0.3, lambda: [server.accept()[0].close() for _ in queued]).start()
        connect(path, None).close()
    finally:
        for s in queued:
            s.close()
        server.close()


def test_a_socket_this_user_may_not_open_is_a_permission_refusal_saying_so(tmp_path) -> None:
    """Not a daemon that is down: the fix is the socket's group."""
    require_test_user()
    path = tmp_path / "private.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    path.chmod(0o600)
    tmp_path.chmod(0o755)
    script = (
        "import sys\n"
        "from wcached.errors import PermissionRefused\n"
        "from wcached.protocol.wire import connect\n"
        "try:\n"
        "    connect(sys.argv[1], 2)\n"
        "except PermissionRefused as e:\n"
        "    print('refused:', e)\n"
    )
    try:
        r = run_as(TEST_USER, [sys.executable, "-c", script, str(path)])
    finally:
        server.close()
    assert r.stdout.strip() == (
        f"refused: no permission to connect to {path} (is this user in the socket's group?)"
    ), r.stderr
