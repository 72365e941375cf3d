"""A connection to one daemon: hello, then requests and replies."""

from __future__ import annotations

import os
import socket
import sys

from wcached.config import default_config_path, load_config
from wcached.device import instance_id_for
from wcached.errors import ProtocolError, VersionMismatch, error_for_code
from wcached.protocol.messages import (
    PROTOCOL_VERSION,
    ErrorReply,
    Hello,
    Release,
    Released,
    Reply,
    StatusReply,
    StatusRequest,
    Welcome,
)
from wcached.protocol.wire import MAX_REPLY_BYTES, Channel, PeerClosed, connect

DEFAULT_SOCKET_DIR = "/run/wcache"


def find_socket_dir(socket_dir: str | None, config: str | None) -> str:
    """An explicit directory wins; else the config's (if one is readable)."""
    if socket_dir:
        return socket_dir
    path = config or default_config_path()
    if config or os.path.exists(path):
        return load_config(path).daemon.socket_dir
    return DEFAULT_SOCKET_DIR


def socket_path(instance: str, socket_dir: str) -> str:
    return os.path.join(socket_dir, f"{instance_id_for(instance)}.sock")


class DaemonConnection:
    """Connected and greeted; ``request`` sends one message, returns the reply."""

    def __init__(self, path: str, timeout: float = 10.0, client: str | None = None):
        self.path = path
        self.timeout = timeout
        self.sock: socket.socket = connect(path, timeout)
        self.chan = Channel(self.sock, Reply)
        try:
            name = client or f"{os.path.basename(sys.argv[0] or 'python')}[{os.getpid()}]"
            try:
                self.chan.send(Hello(version=PROTOCOL_VERSION, client=name), timeout=timeout)
            except (BrokenPipeError, ConnectionResetError):
                # A daemon that refuses a peer replies and closes at once,
                # maybe before our hello; its reason is still queued for us.
                pass
            welcome = self.receive()
            if not isinstance(welcome, Welcome):
                raise ProtocolError(f"expected welcome, got {type(welcome).__name__}")
            if welcome.version != PROTOCOL_VERSION:
                raise VersionMismatch(
                    f"daemon speaks protocol {welcome.version}, this client {PROTOCOL_VERSION}"
                )
            self.welcome = welcome
        except BaseException:
            self.sock.close()
            raise

    def receive(self) -> object:
        try:
            reply = self.chan.recv(MAX_REPLY_BYTES, idle_timeout=self.timeout, frame_timeout=self.timeout)
        except PeerClosed:
            raise ProtocolError(f"daemon at {self.path} closed the connection") from None
        if isinstance(reply, ErrorReply):
            raise error_for_code(reply.code, reply.message)
        return reply

    def request(self, msg: object) -> object:
        self.chan.send(msg, timeout=self.timeout)
        return self.receive()

    def status(self) -> StatusReply:
        reply = self.request(StatusRequest())
        if not isinstance(reply, StatusReply):
            raise ProtocolError(f"expected status_reply, got {type(reply).__name__}")
        return reply

    def release(self, model: str) -> Released:
        reply = self.request(Release(model=model))
        if not isinstance(reply, Released):
            raise ProtocolError(f"expected released, got {type(reply).__name__}")
        return reply

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> DaemonConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
