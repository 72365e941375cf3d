"""Hostile input, counted: generated frames against a running daemon.

Hypothesis writes connection scripts of frames: random bodies, lying lengths
up to 4 GiB, truncated headers, oversized frames, msgpack of the wrong types
and unknown tags, fds attached by the client, with valid requests mixed in.
A good client attaches over and over beside them; the daemon must never die
and never keep that client past its deadline. The count of frames sent is
printed (the README's Guarantees quote it).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import run_daemon, write_config
from wcached.client import attach
from wcached.protocol.messages import PROTOCOL_VERSION, Attach, Hello, Release, StatusRequest
from wcached.protocol.wire import HEADER, MAX_REQUEST_BYTES, connect

FRAMES_WANTED = 10_000
GOOD_CLIENT_DEADLINE_S = 5.0

_enc = msgspec.msgpack.Encoder()


def _frame(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True),
    st.text(max_size=40),
    st.binary(max_size=40),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
tags = st.sampled_from(["hello", "attach", "status", "release", "welcome", "error", "fill_job", "nope", ""])

valid = st.one_of(
    st.builds(lambda c: _enc.encode(Hello(version=PROTOCOL_VERSION, client=c)), st.text(max_size=80)),
    st.builds(lambda v: _enc.encode(Hello(version=v)), st.integers(-5, 2**31)),
    st.builds(
        lambda m, e: _enc.encode(Attach(model=m, expect=e)),
        st.sampled_from(["default", "nope", "", "x" * 200]),
        st.dictionaries(
            st.sampled_from(["dtype", "tp_rank", "extra.a", "bogus", "extra."]),
            st.one_of(st.text(max_size=10), st.integers(-3, 3)),
            max_size=3,
        ),
    ),
    st.just(_enc.encode(StatusRequest())),
    # Releasing the served model is an administrator's right, not hostile
    # input (and this test runs as the daemon's user): only unknown names.
    st.builds(lambda m: _enc.encode(Release(model=m)), st.sampled_from(["nope", ""])),
).map(_frame)

hostile = st.one_of(
    st.binary(max_size=300).map(_frame),  # random bodies
    st.builds(
        lambda tag, body: _frame(_enc.encode({"type": tag, **body})),
        tags,
        st.dictionaries(st.text(max_size=12), values, max_size=5),
    ),
    st.builds(lambda v: _frame(_enc.encode(v)), values),  # msgpack, not a message
    st.builds(
        lambda n, tail: HEADER.pack(n) + tail, st.integers(0, 2**32 - 1), st.binary(max_size=64)
    ),  # lying length
    st.binary(min_size=1, max_size=3),  # a header cut short
    st.integers(MAX_REQUEST_BYTES + 1, 4 * MAX_REQUEST_BYTES).map(
        lambda n: HEADER.pack(n) + b"\0" * min(n, 70_000)
    ),
)

scripts = st.lists(st.tuples(st.one_of(valid, hostile, hostile), st.booleans()), min_size=1, max_size=16)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, sharded_ckpt: Path):
    work = tmp_path_factory.mktemp("fuzz")
    os.chmod(work, 0o755)
    cfg = write_config(
        work / "wcached.toml",
        models=[{"name": "default", "path": str(sharded_ckpt)}],
        daemon={"socket_dir": str(work / "run"), "connection_timeout_s": 1.0, "max_clients": 64},
    )
    with run_daemon(cfg) as d:
        yield d


class GoodClient(threading.Thread):
    """Attaches again and again; records the slowest attach and any failure."""

    def __init__(self, socket_dir: str):
        super().__init__(daemon=True)
        self.socket_dir = socket_dir
        self.stop = threading.Event()
        self.attaches = 0
        self.slowest = 0.0
        self.failures: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                with attach(
                    "default",
                    "cpu0",
                    socket_dir=self.socket_dir,
                    timeout=GOOD_CLIENT_DEADLINE_S,
                    keep_lease=False,
                ) as a:
                    assert a.tensors
            except Exception as e:  # any failure is what the test reports
                self.failures.append(f"{type(e).__name__}: {e}")
            self.slowest = max(self.slowest, time.monotonic() - started)
            self.attaches += 1
            time.sleep(0.02)


def test_generated_hostile_frames_never_kill_or_stall_the_daemon(daemon) -> None:
    sent = {"frames": 0, "fds": 0, "connections": 0}
    pipe_r, pipe_w = os.pipe()
    good = GoodClient(daemon.socket_dir)
    good.start()

    @settings(
        max_examples=2600,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(scripts)
    def one_connection(script: list[tuple[bytes, bool]]) -> None:
        s = connect(daemon.socket_path, 5.0)  # waits out a full backlog
        try:
            sent["connections"] += 1
            for data, with_fd in script:
                try:
                    if with_fd:
                        socket.send_fds(s, [data], [pipe_r])
                        sent["fds"] += 1
                    else:
                        s.sendall(data)
                except OSError:
                    break  # the daemon ended this connection: that is allowed
                sent["frames"] += 1
            s.settimeout(0.01)
            try:
                while s.recv(65536):
                    pass
            except OSError:
                pass
        finally:
            s.close()

    try:
        one_connection()
    finally:
        good.stop.set()
        good.join(30)
        os.close(pipe_r)
        os.close(pipe_w)
    print(f"fuzz: {sent} ; good client: {good.attaches} attaches, slowest {good.slowest:.2f} s")
    assert daemon.proc.poll() is None, daemon.log()[-3000:]
    assert sent["frames"] >= FRAMES_WANTED, sent
    assert not good.failures, good.failures[:5]
    assert good.attaches > 10 and good.slowest < GOOD_CLIENT_DEADLINE_S
    # And it still serves.
    with attach("default", "cpu0", socket_dir=daemon.socket_dir, keep_lease=False) as a:
        assert a.tensors


@pytest.mark.parametrize("kind", ["silent", "dripping"])
def test_silent_and_dripping_connections_are_dropped_by_the_daemon(daemon, kind: str) -> None:
    """Dropped by the daemon (EOF seen here), within connection_timeout_s
    (1 s) and well before this test's own 10 s limit."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(daemon.socket_path)
    s.settimeout(0.3)
    started = time.monotonic()
    frame = _frame(_enc.encode(Hello(version=PROTOCOL_VERSION, client="drip")))
    closed = False
    i = 0
    try:
        while time.monotonic() - started < 10:
            if kind == "dripping" and i < len(frame) - 1:
                try:
                    s.send(frame[i : i + 1])  # a byte at a time, never the last one
                    i += 1
                except OSError:
                    closed = True
                    break
            try:
                data = s.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                closed = True
                break
            if data == b"":
                closed = True
                break
    finally:
        s.close()
    elapsed = time.monotonic() - started
    assert closed, f"{kind} connection still open after {elapsed:.1f} s"
    assert elapsed < 3.0, elapsed
