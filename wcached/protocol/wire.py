"""Framing, size limits, deadlines and fd passing.

A frame is a 4-byte big-endian length followed by a msgpack body. File
descriptors never ride on frame bytes: after a frame that announces
``fd_count``, the sender writes one marker byte per batch of at most
:data:`FD_BATCH` fds (the kernel's SCM_MAX_FD), and the receiver reads exactly
those bytes with ``recvmsg``. Because every read is exact, a reader never
swallows a marker byte with plain ``recv`` (which would close its fds).
"""

from __future__ import annotations

import array
import os
import socket
import struct
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from wcached.errors import (
    DaemonUnavailable,
    FrameTooLarge,
    PermissionRefused,
    ProtocolError,
    TimeoutExpired,
)

HEADER = struct.Struct(">I")
MAX_REQUEST_BYTES = 64 * 1024
# A manifest for 100k tensors is tens of MiB; leave room, but bound it.
MAX_REPLY_BYTES = 512 * 1024 * 1024
FD_BATCH = 253
_FD_MARKER = b"F"


class PeerClosed(ConnectionError):
    """The peer closed the connection at a frame boundary."""


class Deadline:
    """A point in monotonic time; ``None`` seconds means never."""

    def __init__(self, seconds: float | None):
        self.at = None if seconds is None else time.monotonic() + seconds

    def remaining(self) -> float | None:
        if self.at is None:
            return None
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutExpired("deadline passed")
        return left


def prepare_decoding(union: Any) -> None:
    """Resolve the types of ``union`` now. msgspec evaluates a struct's
    annotations once, when the process makes its first decoder for it, and
    keeps them on the class: ~2 ms for the replies, which an engine's first
    attach would otherwise spend on its timed path."""
    msgspec.msgpack.Decoder(union)


class Channel:
    """One side of a framed connection, decoding into ``union``."""

    def __init__(self, sock: socket.socket, union: Any):
        self.sock = sock
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(union)

    # -- sending ----------------------------------------------------------

    def send(self, msg: Any, timeout: float | None = None, fds: Sequence[int] = ()) -> None:
        body = self._encoder.encode(msg)
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(HEADER.pack(len(body)) + body)
            for start in range(0, len(fds), FD_BATCH):
                batch = list(fds[start : start + FD_BATCH])
                socket.send_fds(self.sock, [_FD_MARKER], batch)
        except TimeoutError:
            raise TimeoutExpired(f"peer did not read a {len(body)}-byte frame in time") from None

    # -- receiving --------------------------------------------------------

    def recv(
        self,
        max_bytes: int,
        idle_timeout: float | None = None,
        frame_timeout: float | None = None,
    ) -> Any:
        """Wait up to ``idle_timeout`` for a frame to start, then up to
        ``frame_timeout`` for all of it. Raises :class:`PeerClosed` on a clean
        close between frames."""
        first = self._recv_exact(1, Deadline(idle_timeout), allow_eof=True)
        if not first:
            raise PeerClosed("peer closed the connection")
        deadline = Deadline(frame_timeout)
        header = first + self._recv_exact(HEADER.size - 1, deadline)
        (length,) = HEADER.unpack(header)
        if length > max_bytes:
            raise FrameTooLarge(f"frame of {length} bytes exceeds the limit of {max_bytes}")
        body = self._recv_exact(length, deadline)
        try:
            return self._decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise ProtocolError(f"malformed message: {e}") from None

    def recv_fds(self, count: int, timeout: float | None = None) -> list[int]:
        """Receive exactly ``count`` fds sent by :meth:`send`."""
        fds: list[int] = []
        deadline = Deadline(timeout)
        try:
            while len(fds) < count:
                self.sock.settimeout(deadline.remaining())
                want = min(FD_BATCH, count - len(fds))
                data, got, flags = _recv_fd_batch(self.sock, want)
                fds.extend(got)
                if not data:
                    raise ProtocolError(f"connection closed after {len(fds)} of {count} fds")
                if flags & socket.MSG_CTRUNC:
                    raise ProtocolError("fd batch truncated (RLIMIT_NOFILE too low?)")
                if data != _FD_MARKER or not got:
                    raise ProtocolError("expected an fd batch marker")
        except TimeoutError:
            # The same error as a frame that does not come: a caller handles
            # one kind of timeout, not the socket module's as well.
            close_fds(fds)
            raise TimeoutExpired(f"timed out waiting for fds ({len(fds)} of {count})") from None
        except BaseException:
            close_fds(fds)
            raise
        return fds

    def _recv_exact(self, n: int, deadline: Deadline, allow_eof: bool = False) -> bytes:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            self.sock.settimeout(deadline.remaining())
            try:
                k = self.sock.recv_into(view[got:])
            except TimeoutError:
                raise TimeoutExpired(
                    "timed out waiting for a frame" if got == 0 else "timed out inside a frame"
                ) from None
            if k == 0:
                if got == 0 and allow_eof:
                    return b""
                raise ProtocolError(f"connection closed inside a frame ({got} of {n} bytes)")
            got += k
        return bytes(buf)


def close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _recv_fd_batch(sock: socket.socket, want: int) -> tuple[bytes, list[int], int]:
    """One marker byte and up to ``want`` fds, close-on-exec from the start
    (an engine that spawns a process must not hand it the weights' memory;
    socket.recv_fds does not pass its flags on before Python 3.12)."""
    data, anc, flags, _ = sock.recvmsg(1, socket.CMSG_SPACE(want * 4), socket.MSG_CMSG_CLOEXEC)
    fds: list[int] = []
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds += array.array("i", payload[: len(payload) - len(payload) % 4])
    return data, fds, flags


def connect(path: str, timeout: float | None) -> socket.socket:
    """Connect to a daemon socket, mapping absence to DaemonUnavailable."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    deadline = Deadline(timeout)
    try:
        while True:
            try:
                sock.connect(path)
                break
            except BlockingIOError:
                # The daemon's listen backlog is full (a Unix socket with a
                # timeout says EAGAIN rather than waiting): it drains as the
                # daemon accepts, so try again until the deadline.
                try:
                    left = deadline.remaining()
                except TimeoutExpired:
                    raise TimeoutError from None
                time.sleep(0.01 if left is None else min(0.01, left))
    except FileNotFoundError:
        sock.close()
        raise DaemonUnavailable(f"no daemon socket at {path}") from None
    except ConnectionRefusedError:
        sock.close()
        raise DaemonUnavailable(f"daemon socket {path} refuses connections (stale?)") from None
    except PermissionError:
        sock.close()
        raise PermissionRefused(
            f"no permission to connect to {path} (is this user in the socket's group?)"
        ) from None
    except TimeoutError:
        sock.close()
        raise DaemonUnavailable(f"timed out connecting to {path}") from None
    return sock
