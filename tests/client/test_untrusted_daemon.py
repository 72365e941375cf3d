"""What a client does with a daemon (or an impostor passing SO_PEERCRED) that
hands it fds and a manifest that do not agree: it refuses them with a
ProtocolError naming what is wrong, and never maps memory it would fault on.

The fake daemon answers from a thread of the test; the engine side runs in a
child process, so that a SIGBUS (the break these tests guard against) fails
the test instead of killing the run.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import pytest

from wcached.keys import CacheKey
from wcached.protocol.messages import (
    PROTOCOL_VERSION,
    Attached,
    Manifest,
    Request,
    SegmentInfo,
    TensorInfo,
    Welcome,
)
from wcached.protocol.wire import Channel

ALL_SEALS = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL

# The engine: attach, then read every tensor's bytes.
ENGINE = textwrap.dedent(
    """
    import sys
    from wcached.client import attach
    from wcached.errors import ProtocolError, TimeoutExpired
    import time
    started = time.monotonic()
    try:
        a = attach("default", "cpu0", socket_dir=sys.argv[1], timeout=float(sys.argv[2]), keep_lease=False)
    except ProtocolError as e:
        print("refused:", e)
        sys.exit(0)
    except TimeoutExpired as e:
        print(f"gave up after {time.monotonic() - started:.1f} s:", e)
        sys.exit(0)
    print("attached", flush=True)
    for name, t in a.tensors.items():
        print(name, t.view(-1).view(__import__("torch").uint8).tolist())
    """
)


def _memfd(data: bytes, seals: int = ALL_SEALS) -> int:
    fd = os.memfd_create("fake", os.MFD_ALLOW_SEALING)
    os.write(fd, data)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    return fd


def _manifest(segment_bytes: int, tensors: list[TensorInfo]) -> Manifest:
    return Manifest(
        model="default",
        key=CacheKey(model="default", loader="safetensors", fingerprint="", dtype="auto"),
        segments=[SegmentInfo(index=0, nbytes=segment_bytes, backend="host", device="cpu0")],
        tensors=tensors,
        total_bytes=sum(t.nbytes for t in tensors),
        filled_at=0.0,
    )


def _u8(name: str, offset: int, n: int) -> TensorInfo:
    return TensorInfo(name=name, dtype="uint8", shape=(n,), stride=(1,), segment=0, offset=offset, nbytes=n)


@contextlib.contextmanager
def _fake_daemon(
    sdir: Path,
    make_fd: Callable[[], int],
    manifest: Manifest,
    answer: Callable[[Channel], None] | None = None,
) -> Iterator[None]:
    """A daemon impostor at ``sdir/cpu0.sock`` answering one hello and one
    attach: with one memfd and ``manifest``, or as ``answer`` does."""
    sdir.mkdir()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sdir / "cpu0.sock"))
    server.listen(1)
    done = threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = server.accept()
            with conn:
                chan = Channel(conn, Request)
                chan.recv(65536, idle_timeout=10, frame_timeout=10)  # hello
                chan.send(
                    Welcome(
                        version=PROTOCOL_VERSION,
                        instance="cpu0",
                        device="host memory",
                        daemon_version="fake",
                        pid=1,
                    )
                )
                chan.recv(65536, idle_timeout=10, frame_timeout=10)  # attach
                if answer is not None:
                    answer(chan)
                else:
                    fd = make_fd()
                    chan.send(Attached(manifest=manifest, fd_count=1), fds=[fd])
                    os.close(fd)
                done.wait(30)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        server.close()
        t.join(10)


def _engine(sdir: Path, timeout: float = 5) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", ENGINE, str(sdir), str(timeout)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=os.getcwd(),
    )


def test_a_memfd_smaller_than_its_manifest_is_refused_not_a_sigbus(work: Path) -> None:
    """A daemon whose memfd holds fewer bytes than its manifest says is refused
    at attach, naming both sizes; the engine never reads past the memfd (SIGBUS)."""
    manifest = _manifest(8192, [_u8("head", 0, 16), _u8("tail", 4096, 16)])
    with _fake_daemon(work / "fake", lambda: _memfd(b"\7" * 4096), manifest):
        r = _engine(work / "fake")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "refused: segment memfd holds 4096 bytes, manifest says 8192" in r.stdout, r.stdout


def test_a_memfd_the_daemon_could_still_shrink_is_refused(work: Path) -> None:
    """A memfd sealed against writes and growth but not shrinking could be cut
    under the engine's feet later (a SIGBUS mid-inference): refused at attach."""
    seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
    manifest = _manifest(4096, [_u8("w", 0, 16)])
    with _fake_daemon(work / "fake", lambda: _memfd(b"\7" * 4096, seals), manifest):
        r = _engine(work / "fake")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "refused: segment memfd is not sealed read-only" in r.stdout, r.stdout


def test_a_tensor_running_past_its_segment_is_refused_naming_it(work: Path) -> None:
    """A tensor whose offset plus size runs past its segment is refused naming
    the tensor; one that ends on the segment's last byte is served whole."""
    data = bytes(range(256)) * 16
    edge = _manifest(4096, [_u8("edge", 4088, 8)])
    with _fake_daemon(work / "ok", lambda: _memfd(data), edge):
        r = _engine(work / "ok")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert f"edge {list(data[4088:])}" in r.stdout, r.stdout
    f32 = TensorInfo(name="w", dtype="float32", shape=(2,), stride=(1,), segment=0, offset=4092, nbytes=8)
    with _fake_daemon(work / "past", lambda: _memfd(data), _manifest(4096, [f32])):
        r = _engine(work / "past")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "refused: tensor 'w' lies outside segment 0" in r.stdout, r.stdout


def test_segments_of_two_backends_are_refused_naming_both(work: Path) -> None:
    """One attach maps its segments with one backend: a manifest mixing host
    and cuda segments is refused naming both, before anything is mapped."""
    tensors = [_u8("a", 0, 16), msgspec.structs.replace(_u8("b", 0, 16), segment=1)]
    manifest = _manifest(4096, tensors)
    manifest = msgspec.structs.replace(
        manifest,
        segments=[*manifest.segments, SegmentInfo(index=1, nbytes=4096, backend="cuda", device="0")],
    )

    def two_fds(chan: Channel) -> None:
        fds = [_memfd(b"\7" * 4096), _memfd(b"\7" * 4096)]
        chan.send(Attached(manifest=manifest, fd_count=2), fds=fds)
        for fd in fds:
            os.close(fd)

    with _fake_daemon(work / "fake", lambda: -1, manifest, answer=two_fds):
        r = _engine(work / "fake")
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "refused: segments of several backends: ['cuda', 'host']" in r.stdout, r.stdout


def test_fewer_fds_than_segments_are_refused_and_the_ones_received_closed(work: Path) -> None:
    """A daemon announcing one fd for a two-segment manifest: the engine
    refuses it naming both counts, and does not keep the one fd it got (an
    engine that keeps running must not hold memory it never mapped)."""
    from tests.helpers import fds_opened_since, open_fds
    from wcached.client import attach
    from wcached.errors import ProtocolError

    one = _manifest(4096, [_u8("w", 0, 16)])
    two = msgspec.structs.replace(
        one, segments=[one.segments[0], msgspec.structs.replace(one.segments[0], index=1)]
    )
    with _fake_daemon(work / "fake", lambda: _memfd(b"\7" * 4096), two):
        before = open_fds()
        with pytest.raises(ProtocolError, match=r"^1 fds for 2 segments$"):
            attach("default", "cpu0", socket_dir=str(work / "fake"), timeout=5, keep_lease=False)
    assert fds_opened_since(before) == {}  # the impostor's end of the socket closed too


def test_the_callers_timeout_bounds_a_daemon_that_stalls(work: Path) -> None:
    """A daemon that stops mid-reply (after its attach reply, before the fds;
    or before any reply) costs the engine the timeout it passed, not the
    connection's default of 10 s nor forever."""
    manifest = _manifest(4096, [_u8("w", 0, 16)])

    def reply_without_fds(chan: Channel) -> None:
        chan.send(Attached(manifest=manifest, fd_count=1))

    for answer in (reply_without_fds, lambda chan: None):
        with _fake_daemon(work / "fake", lambda: -1, manifest, answer=answer):
            r = _engine(work / "fake", timeout=0.5)
        shutil.rmtree(work / "fake")
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
        seconds = float(r.stdout.split("gave up after ")[1].split()[0])
        assert seconds < 5, r.stdout  # 0.5 s asked; the default would be 10
