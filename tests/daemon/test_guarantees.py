"""Tests aimed at single safety lines: each fails when its line is broken.

READY strictly after bind; the request size limit at its exact edge; a
malformed frame after hello answered on a connection that goes on; a fake
daemon's unsealed memfd refused by the client; ``extra.*`` key fields matched
by their exact names.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import msgspec
import pytest

from tests.helpers import NotifyListener, run_daemon, start_daemon
from wcached.client import attach
from wcached.client.connection import DaemonConnection
from wcached.errors import BadRequest, FrameTooLarge, ProtocolError, UnknownModel
from wcached.keys import CacheKey, mismatched_fields
from wcached.protocol.messages import (
    PROTOCOL_VERSION,
    Attach,
    Attached,
    ErrorReply,
    Manifest,
    Reply,
    Request,
    SegmentInfo,
    StatusReply,
    StatusRequest,
    TensorInfo,
    Welcome,
)
from wcached.protocol.wire import HEADER, Channel

# The documented request limit, written out: the test must not follow the constant.
MAX_REQUEST_BYTES = 64 * 1024


def _fill_queue(listener: NotifyListener) -> list[socket.socket]:
    """Fill the notify socket's datagram queue, so that the daemon's next
    state message (READY, sent with a 5 s wait) blocks until it is read."""
    senders = []
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.setblocking(False)
        try:
            s.sendto(b"X=1", listener.path)
        except BlockingIOError:
            s.close()
            return senders  # even a fresh socket cannot queue: the queue is full
        senders.append(s)
        while True:
            try:
                s.sendto(b"X=1", listener.path)
            except BlockingIOError:
                break


def test_ready_is_sent_only_after_the_socket_accepts(work: Path, cpu_config: Path) -> None:
    """With the queue full the daemon blocks sending READY: the socket must
    already accept then, and READY must still come once the queue drains.
    (READY before bind would block with no socket, time out and be lost.)"""
    listener = NotifyListener(work)
    senders = _fill_queue(listener)
    # No fd store (FileDescriptorStoreMax=0): its messages, sent as each
    # model is filled, would wait for the queue before the bind does.
    env = {"NOTIFY_SOCKET": listener.path, "FDSTORE": "0"}
    d = start_daemon(cpu_config, env=env)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert d.proc.poll() is None, d.log()
            assert time.monotonic() < deadline, d.log()
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(d.socket_path)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                time.sleep(0.02)
            finally:
                probe.close()
        # The socket accepts; READY is pending in the daemon, not yet lost.
        listener.wait_for("READY=1", 10, d.proc)
    finally:
        for s in senders:
            s.close()
        d.stop()
        d.notify.close()
        listener.close()


def _attach_frame(size: int) -> bytes:
    """An Attach request whose msgpack body is exactly ``size`` bytes."""
    enc = msgspec.msgpack.Encoder()
    n = size
    while True:
        body = enc.encode(Attach(model="m" * n))
        if len(body) == size:
            return HEADER.pack(size) + body
        n += size - len(body)


def test_request_of_exactly_the_limit_is_read_one_byte_more_is_refused(cpu_config: Path) -> None:
    with run_daemon(cpu_config) as d, DaemonConnection(d.socket_path) as conn:
        conn.sock.sendall(_attach_frame(MAX_REQUEST_BYTES))
        with pytest.raises(UnknownModel):  # read and answered, not too large
            conn.receive()
        conn.sock.sendall(_attach_frame(MAX_REQUEST_BYTES + 1))
        with pytest.raises(FrameTooLarge):
            conn.receive()


def test_malformed_frame_after_hello_gets_an_error_and_the_connection_goes_on(cpu_config: Path) -> None:
    with run_daemon(cpu_config) as d, DaemonConnection(d.socket_path) as conn:
        for body in (b"\xc1\xc1\xc1", msgspec.msgpack.encode({"type": "attach", "model": 5})):
            conn.sock.sendall(HEADER.pack(len(body)) + body)
            with pytest.raises((ProtocolError, BadRequest)) as e:
                conn.receive()
            assert not isinstance(e.value, FrameTooLarge)
        status = conn.request(StatusRequest())
        assert isinstance(status, StatusReply) and status.state == "serving"


def test_client_refuses_an_unsealed_memfd_from_a_fake_daemon(work: Path) -> None:
    """A daemon impostor (same user, so SO_PEERCRED passes) hands a writable
    memfd: attach refuses it before mapping anything."""
    sdir = work / "fake"
    sdir.mkdir()
    path = str(sdir / "cpu0.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    done = threading.Event()

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            chan = Channel(conn, Request)
            chan.recv(65536, idle_timeout=5, frame_timeout=5)  # hello
            welcome = Welcome(
                version=PROTOCOL_VERSION, instance="cpu0", device="host memory", daemon_version="fake", pid=1
            )
            chan.send(welcome)
            chan.recv(65536, idle_timeout=5, frame_timeout=5)  # attach
            fd = os.memfd_create("fake", os.MFD_ALLOW_SEALING)
            os.ftruncate(fd, 4096)
            key = CacheKey(model="default", loader="safetensors", fingerprint="", dtype="auto")
            manifest = Manifest(
                model="default",
                key=key,
                segments=[SegmentInfo(index=0, nbytes=4096, backend="host", device="cpu0")],
                tensors=[
                    TensorInfo(
                        name="w", dtype="uint8", shape=(16,), stride=(1,), segment=0, offset=0, nbytes=16
                    )
                ],
                total_bytes=4096,
                filled_at=0.0,
            )
            chan.send(Attached(manifest=manifest, fd_count=1), fds=[fd])
            os.close(fd)
            done.wait(5)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(ProtocolError, match="not sealed read-only"):
            attach("default", "cpu0", socket_dir=str(sdir), timeout=5, keep_lease=False)
    finally:
        done.set()
        t.join(5)
        server.close()


def test_extra_key_fields_are_matched_by_their_exact_names() -> None:
    held = CacheKey(
        model="m", loader="vllm", fingerprint="f", dtype="bfloat16", extra={"a": "1", "ab": "2", "b": "3"}
    )
    assert mismatched_fields(held, {"extra.a": "1", "extra.ab": "2", "extra.b": "3"}) == []
    assert mismatched_fields(held, {"extra.a": "2"}) == ["extra.a"]
    assert mismatched_fields(held, {"extra.ab": "1", "extra.a": "1"}) == ["extra.ab"]
    assert mismatched_fields(held, {"extra.zz": "1"}) == ["extra.zz"]  # absent is a difference
    assert mismatched_fields(held, {"dtype": "bfloat16", "tp_rank": 0}) == []
    assert mismatched_fields(held, {"dtype": "float16"}) == ["dtype"]
    for bad in ({"extra.": "1"}, {"extra": "1"}, {"colour": "blue"}):
        with pytest.raises(BadRequest, match="unknown cache key field"):
            mismatched_fields(held, bad)


def test_error_reply_and_reply_union_decode() -> None:
    """The client decodes an ErrorReply sent after hello (what the tests
    above rely on) rather than failing on it."""
    body = msgspec.msgpack.encode(ErrorReply(code="protocol", message="x"))
    assert isinstance(msgspec.msgpack.decode(body, type=Reply), ErrorReply)


def test_a_client_name_cannot_forge_log_lines_or_terminal_escapes(cpu_config: Path) -> None:
    """The hello's client name reaches log lines and `wcached status`:
    newlines and escape sequences arrive as ``?``."""
    evil = "engine\nwcached daemon: serving FAKE\x1b[31mred\x07" + "x" * 300
    with run_daemon(cpu_config) as d:
        with attach("default", "cpu0", socket_dir=d.socket_dir, client=evil) as a:
            assert a.tensors
            with DaemonConnection(d.socket_path, client="status") as conn:
                (client,) = conn.status().clients
        log = d.log()
    assert client.client == "engine?wcached daemon: serving FAKE?[31mred?" + "x" * 84
    assert "\nwcached daemon: serving FAKE" not in log and "\x1b" not in log
    assert "(uid 0, engine?wcached daemon: serving FAKE?[31mred?" in log
