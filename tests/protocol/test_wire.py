from __future__ import annotations

import os
import socket
import struct
import threading

import pytest

from wcached.errors import DaemonUnavailable, FrameTooLarge, ProtocolError, TimeoutExpired
from wcached.protocol.messages import Hello, Request, StatusRequest
from wcached.protocol.wire import MAX_REQUEST_BYTES, Channel, PeerClosed, close_fds, connect


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
    with pytest.raises(PeerClosed):
        Channel(d, Request).recv(MAX_REQUEST_BYTES)
    d.close()


def test_deadlines(pair) -> None:
    a, b = pair
    with pytest.raises(TimeoutExpired, match="waiting for a frame"):
        Channel(b, Request).recv(MAX_REQUEST_BYTES, idle_timeout=0.1)
    a.sendall(struct.pack(">I", 10) + b"ab")
    with pytest.raises(TimeoutExpired, match="inside a frame"):
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
