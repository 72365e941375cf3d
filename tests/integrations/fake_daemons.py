"""Daemons that misbehave, or speak another protocol version, over real sockets.

Each serves ``<socket_dir>/<instance>.sock`` from threads of the test process:

- :class:`Silent` accepts and never answers (a hung daemon);
- :class:`Garbage` answers the hello with a frame that is no message;
- :class:`RefusesVersions` answers every hello ``version_mismatch``;
- :class:`Proxy` forwards to a real daemon, as a daemon of another release
  would answer: ``"v1"`` like the first release (a hello with anything but
  exactly ``version = 1`` refused, no range), ``"next"`` like a later one
  (speaks 1..4, adds fields this release does not know to every reply,
  manifest, tensor entry and run), ``"corrupt"`` with one tensor's shape changed
  in the manifest it hands out.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from pathlib import Path
from typing import Any

from wcached.protocol.wire import HEADER, MAX_REPLY_BYTES, Channel, PeerClosed, close_fds

Raw = Any  # msgpack decoded as builtins


class Server:
    def __init__(self, socket_dir: Path, instance: str = "cpu0"):
        socket_dir.mkdir(parents=True, exist_ok=True)
        self.path = str(socket_dir / f"{instance}.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        os.chmod(self.path, 0o666)
        self.sock.listen(16)
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError, PeerClosed, Exception):
            self.handle(Channel(conn, Raw))
        conn.close()

    def handle(self, chan: Channel) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class Silent(Server):
    def handle(self, chan: Channel) -> None:
        threading.Event().wait(600)


class Garbage(Server):
    def handle(self, chan: Channel) -> None:
        chan.recv(MAX_REPLY_BYTES)
        chan.sock.sendall(HEADER.pack(3) + b"\xc1\xc1\xc1")  # 0xc1: never used in msgpack
        threading.Event().wait(600)


class RefusesVersions(Server):
    def handle(self, chan: Channel) -> None:
        chan.recv(MAX_REPLY_BYTES)
        chan.send({"type": "error", "code": "version_mismatch", "message": "daemon speaks protocol 9..9"})


class Proxy(Server):
    def __init__(self, socket_dir: Path, upstream: str, mode: str, instance: str = "cpu0"):
        self.upstream, self.mode = upstream, mode
        self.hellos: list[Raw] = []
        super().__init__(socket_dir, instance)

    def handle(self, chan: Channel) -> None:
        hello = chan.recv(MAX_REPLY_BYTES)
        self.hellos.append(hello)
        version = 2
        if self.mode == "v1":
            if set(hello) - {"type", "version", "client"} or hello.get("version") != 1:
                chan.send(
                    {
                        "type": "error",
                        "code": "version_mismatch",
                        "message": f"daemon speaks protocol 1, client sent {hello.get('version')}",
                    }
                )
                return
            version = 1
        elif self.mode == "next":
            version = min(hello["version"], 4)
            if version < hello.get("min_version", 1):
                chan.send({"type": "error", "code": "version_mismatch", "message": "daemon speaks 1..4"})
                return
        up_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        up_sock.connect(self.upstream)
        up = Channel(up_sock, Raw)
        try:
            up.send({"type": "hello", "version": min(version, 3), "client": hello.get("client", "")})
            self._reply(up, chan, version)
            while True:
                up.send(chan.recv(MAX_REPLY_BYTES))
                self._reply(up, chan, version)
        finally:
            up_sock.close()

    def _reply(self, up: Channel, chan: Channel, version: int) -> None:
        reply = up.recv(MAX_REPLY_BYTES)
        fds = up.recv_fds(reply["fd_count"]) if reply.get("type") == "attached" else []
        try:
            if reply.get("type") == "welcome":
                reply["version"] = version
            if self.mode == "next":
                _add_unknown_fields(reply)
            if self.mode == "corrupt" and reply.get("type") == "attached":
                manifest = reply["manifest"]
                # An entry's shape, or a run's (array-like: its second field).
                shapes = [t["shape"] for t in manifest["tensors"]] + [r[1] for r in manifest.get("runs", [])]
                next(s for s in shapes if len(s) == 2)[0] -= 1
            chan.send(reply, fds=fds)
        finally:
            close_fds(fds)


def _add_unknown_fields(reply: dict) -> None:
    reply["issued_by"] = "wcached 9.0"
    manifest = reply.get("manifest")
    if manifest is not None:
        manifest["compression"] = "none"
        manifest["key"]["epoch"] = 3
        for s in manifest["segments"]:
            s["numa_node"] = 0
        for t in manifest["tensors"]:
            t["checksum_algo"] = "xxh3_128"
        for r in manifest.get("runs", []):
            r.append("xxh3_128")  # a field a later release appends to a run
