"""A connection to one daemon: hello, then requests and replies."""

from __future__ import annotations

import contextlib
import gc
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence

import msgspec

from wcached import defaults
from wcached.accounts import peer_ids, user_id
from wcached.device import instance_id_for
from wcached.errors import (
    Busy,
    KeyMismatch,
    PermissionRefused,
    ProtocolError,
    VersionMismatch,
    error_for_code,
)
from wcached.protocol.messages import (
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    Attach,
    Attached,
    ErrorReply,
    Hello,
    Manifest,
    Mismatch,
    Release,
    Released,
    Reply,
    StatusReply,
    StatusRequest,
    Welcome,
)
from wcached.protocol.runs import received
from wcached.protocol.wire import MAX_REPLY_BYTES, Channel, PeerClosed, close_fds, connect, prepare_decoding

# At import (an engine imports its loader plugin long before it attaches).
prepare_decoding(Reply)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Bulk construction of acyclic objects (a manifest's entries, tensor
    views) would otherwise trigger collections of the caller's whole heap
    on an engine's attach path."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def find_socket_dir(socket_dir: str | None, config: str | None) -> str:
    """An explicit directory wins; else the config's (if one is readable)."""
    if socket_dir:
        return socket_dir
    path = config or defaults.config_path()
    if config or os.path.exists(path):
        return defaults.configured_socket_dir(path)
    return defaults.SOCKET_DIR


def socket_path(instance: str, socket_dir: str) -> str:
    return os.path.join(socket_dir, f"{instance_id_for(instance)}.sock")


# Users whose daemon a client trusts with fds, besides root and the client's
# own user: the package's daemon user, or a list in this variable.
DAEMON_USERS_ENV = "WCACHED_DAEMON_USERS"
DEFAULT_DAEMON_USERS = (defaults.DAEMON_USER,)


def always_trusted_uids() -> set[int]:
    """Root and this process's user: trusted as a daemon whatever the list."""
    return {0, os.geteuid()}


def daemon_user_uids(users: Sequence[str] | None = None) -> set[int]:
    """The daemon users (``users``, else ``$WCACHED_DAEMON_USERS``
    comma-separated, else ``wcache``), each a name or a numeric id as the
    daemon's ``allowed_users`` takes it; names that do not exist on this host
    are left out."""
    if users is None:
        env = os.environ.get(DAEMON_USERS_ENV)
        users = [u.strip() for u in env.split(",") if u.strip()] if env else DEFAULT_DAEMON_USERS
    return {uid for uid in map(user_id, users) if uid is not None}


def trusted_daemon_uids(users: Sequence[str] | None = None) -> set[int]:
    """Every uid this client accepts a daemon socket from."""
    return always_trusted_uids() | daemon_user_uids(users)


def check_daemon_peer(sock: socket.socket, path: str, users: Sequence[str] | None = None) -> int:
    """Refuse a socket served by a user this client does not trust (a squatter
    on the socket path): nothing it sends, fds least of all, is used. Returns
    the daemon's pid."""
    pid, uid, _ = peer_ids(sock)
    # Root and this user are trusted whatever the list: no user database
    # lookup (NSS can take milliseconds) on an engine's attach path.
    if uid not in always_trusted_uids() and uid not in daemon_user_uids(users):
        raise PermissionRefused(
            f"{path} is served by uid {uid} (pid {pid}), not by root, this user or a daemon user "
            f"(${DAEMON_USERS_ENV}, default {','.join(DEFAULT_DAEMON_USERS)}); refusing to use it"
        )
    return pid


class DaemonConnection:
    """Connected and greeted; ``request`` sends one message, returns the reply."""

    def __init__(
        self,
        path: str,
        timeout: float = 10.0,
        client: str | None = None,
        daemon_users: Sequence[str] | None = None,
        first: Attach | None = None,
        meanwhile: Callable[[], object] | None = None,
    ):
        """``first``: a request sent right behind the hello, before its
        welcome (the daemon reads it once it has answered the hello); its
        reply is the next one
        :meth:`receive` reads. ``meanwhile``: called while the daemon answers,
        once its hello is sent (once in all: not again on a retry, and not
        where the daemon closed before taking the hello). Use
        :meth:`attaching` rather than these."""
        self.path = path
        self.timeout = timeout
        self._meanwhile_pending = True
        # A daemon at max_clients answers busy; slots free up as others
        # leave (silent connections are dropped after its timeout), so this
        # tries again until the deadline.
        deadline = time.monotonic() + timeout
        delay = 0.05
        version = PROTOCOL_VERSION
        mismatch: VersionMismatch | None = None
        while True:
            try:
                self._connect(path, timeout, client, daemon_users, version, first, meanwhile)
                return
            except Busy:
                if time.monotonic() + delay >= deadline:
                    raise
                time.sleep(delay)
                delay = min(0.5, delay * 2)
            except VersionMismatch as e:
                # A version-1 daemon wants exactly 1 and knows no range:
                # greet it the way it understands. If that fails too, the
                # first answer says what the daemon and this client speak.
                if mismatch is not None or MIN_PROTOCOL_VERSION > 1:
                    raise mismatch or e from None
                mismatch = e
                version = 1

    def _connect(
        self,
        path: str,
        timeout: float,
        client: str | None,
        daemon_users: Sequence[str] | None,
        version: int = PROTOCOL_VERSION,
        first: Attach | None = None,
        meanwhile: Callable[[], object] | None = None,
    ) -> None:
        self.sock: socket.socket = connect(path, timeout)
        try:
            self.daemon_pid = check_daemon_peer(self.sock, path, daemon_users)
        except BaseException:
            self.sock.close()
            raise
        self.chan = Channel(self.sock, Reply)
        try:
            name = client or f"{os.path.basename(sys.argv[0] or 'python')}[{os.getpid()}]"
            try:
                hello = Hello(version=version, min_version=MIN_PROTOCOL_VERSION, client=name)
                self.chan.send(hello, timeout=timeout)
                if first is not None:
                    self.chan.send(first, timeout=timeout)
            except (BrokenPipeError, ConnectionResetError):
                # A daemon that refuses a peer replies and closes at once,
                # maybe before our hello; its reason is still queued for us.
                pass
            else:
                if meanwhile is not None and self._meanwhile_pending:
                    self._meanwhile_pending = False  # once, whatever tries follow
                    meanwhile()
            welcome = self.receive()
            if not isinstance(welcome, Welcome):
                raise ProtocolError(f"expected welcome, got {type(welcome).__name__}")
            if not MIN_PROTOCOL_VERSION <= welcome.version <= version:
                raise VersionMismatch(
                    f"daemon chose protocol {welcome.version}, "
                    f"this client speaks {MIN_PROTOCOL_VERSION}..{version}"
                )
            self.welcome = welcome
        except BaseException:
            self.sock.close()
            raise

    def receive(self) -> object:
        try:
            reply = self.chan.recv(MAX_REPLY_BYTES, idle_timeout=self.timeout, frame_timeout=self.timeout)
        except (PeerClosed, ConnectionResetError):
            # (Reset: it closed with a request of ours unread, as a daemon
            # stopping between its welcome and a pipelined attach does.)
            raise ProtocolError(f"daemon at {self.path} closed the connection") from None
        if isinstance(reply, ErrorReply):
            raise error_for_code(reply.code, reply.message)
        if isinstance(reply, Attached) and reply.manifest.runs:
            # The manifest as every client reads it, however it travelled.
            reply = msgspec.structs.replace(reply, manifest=received(reply.manifest))
        return reply

    def request(self, msg: object) -> object:
        self.chan.send(msg, timeout=self.timeout)
        return self.receive()

    def status(self) -> StatusReply:
        reply = self.request(StatusRequest())
        if not isinstance(reply, StatusReply):
            raise ProtocolError(f"expected status_reply, got {type(reply).__name__}")
        return reply

    @classmethod
    def attaching(
        cls,
        path: str,
        model: str,
        expect: dict[str, str | int] | None = None,
        timeout: float = 10.0,
        client: str | None = None,
        meanwhile: Callable[[], object] | None = None,
    ) -> tuple[DaemonConnection, Manifest, list[int]]:
        """Connect and attach in one round trip: the attach request goes
        right behind the hello, so an engine does not wait for the welcome before
        asking (a round trip through the daemon's threads, 0.3-0.5 ms);
        ``meanwhile`` is done while the daemon answers. The connection (the
        lease), the manifest and the fds as :meth:`attach` gives them; the
        connection is closed if the attach fails."""
        first = Attach(model=model, expect=dict(expect or {}))
        conn = cls(path, timeout=timeout, client=client, first=first, meanwhile=meanwhile)
        try:
            with gc_paused():
                manifest, fds = conn._attached(conn.receive())
        except BaseException:
            conn.close()
            raise
        return conn, manifest, fds

    def attach(self, model: str, expect: dict[str, str | int] | None = None) -> tuple[Manifest, list[int]]:
        """Ask for ``model``'s memory: its manifest and one fd per segment,
        the caller's to close. A cache key that differs from ``expect``
        raises :class:`KeyMismatch` naming the fields; any other reply, or
        fds that are not one per segment, is a protocol error (with every fd
        received closed). Every client that attaches (an engine, its lease,
        ``wcached verify``) asks through here or :meth:`attaching`."""
        return self._attached(self.request(Attach(model=model, expect=dict(expect or {}))))

    def _attached(self, reply: object) -> tuple[Manifest, list[int]]:
        """The manifest and fds of an attach request's reply."""
        if isinstance(reply, Mismatch):
            raise KeyMismatch(reply.message, reply.fields)
        if not isinstance(reply, Attached):
            raise ProtocolError(f"expected attached, got {type(reply).__name__}")
        fds = self.chan.recv_fds(reply.fd_count, timeout=self.timeout)
        if len(fds) != len(reply.manifest.segments):
            close_fds(fds)
            raise ProtocolError(f"{len(fds)} fds for {len(reply.manifest.segments)} segments")
        return reply.manifest, fds

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
