"""Accepting connections, checking peers, and serving requests.

One thread per connection keeps the code plain and lets a connection idle for
as long as its client stays attached (the connection is the lease). Deadlines
bound everything a client could stall: the hello, the rest of a frame once
started, and reading our reply. A bad request gets an error reply and the
connection goes on; a framing error ends that connection only.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field

from wcached import __version__
from wcached.config import InstanceSettings
from wcached.daemon.holdings import Holdings
from wcached.daemon.metrics import NoMetrics
from wcached.daemon.peers import AccessPolicy, PeerCredentials
from wcached.device import Device
from wcached.errors import (
    BadRequest,
    Busy,
    FrameTooLarge,
    PermissionRefused,
    ProtocolError,
    TimeoutExpired,
    VersionMismatch,
    WcacheError,
)
from wcached.keys import describe_mismatch, mismatched_fields
from wcached.protocol.messages import (
    MIN_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    Attach,
    Attached,
    ClientStatus,
    ErrorReply,
    Hello,
    Mismatch,
    Release,
    Released,
    Request,
    StatusReply,
    StatusRequest,
    Welcome,
)
from wcached.protocol.wire import MAX_REQUEST_BYTES, Channel, PeerClosed, close_fds

log = logging.getLogger("wcached.server")


MAX_CLIENT_NAME = 128


def printable(name: str, limit: int = MAX_CLIENT_NAME) -> str:
    """A client-supplied name as it may appear in a log line or a status
    table: control characters (newlines, escape sequences) and other
    unprintables become ``?``, at most ``limit`` characters."""
    return "".join(c if c.isprintable() else "?" for c in name[:limit])


def negotiate(hello: Hello) -> int:
    """The highest protocol version both sides speak."""
    version = min(hello.version, PROTOCOL_VERSION)
    if version < max(hello.min_version, MIN_PROTOCOL_VERSION) or hello.min_version > hello.version:
        raise VersionMismatch(
            f"daemon speaks protocol {MIN_PROTOCOL_VERSION}..{PROTOCOL_VERSION}, "
            f"client {hello.min_version}..{hello.version}"
        )
    return version


@dataclass
class Session:
    sock: socket.socket
    peer: PeerCredentials
    connected_at: float = field(default_factory=time.monotonic)
    client: str = ""
    models: set[str] = field(default_factory=set)
    # The protocol version agreed in the hello: what the replies may carry.
    version: int = 1


class Server:
    def __init__(
        self,
        settings: InstanceSettings,
        device: Device,
        holdings: Holdings,
        policy: AccessPolicy,
        metrics: NoMetrics | None = None,
    ):
        self.settings = settings
        self.device = device
        self.holdings = holdings
        self.policy = policy
        # Counters incremented here (nothing is, with metrics off); the
        # gauges read status() when scraped.
        self.metrics = metrics or NoMetrics()
        self.metrics.watch(self.status)
        self.started = time.monotonic()
        self.state = "serving"
        self.listener: socket.socket | None = None
        self._sessions: dict[int, Session] = {}
        self._lock = threading.Lock()
        # Something counted changed (a client, an attach, an error reply, a
        # release): refresh STATUS= and the metrics textfile.
        self.changed = threading.Event()
        self._threads = 0  # connection threads running (at most max_clients)
        self._starved = False  # accept() ran out of fds
        self._busy_refused = 0
        self._busy_logged_at = 0.0
        self._own_probe = False  # the daemon's own liveness probe is being served

    # -- listening --------------------------------------------------------

    def bind(self) -> socket.socket:
        path = self.settings.socket_path
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        # Bound under a temporary name, made 0660 and listening, then renamed
        # into place: the path never names nothing, a half-made socket or
        # another process's socket once this one exists.
        # (".<id>.tmp": exactly as long as "<id>.sock", whose length was
        # checked; ours alone while this daemon holds the instance's lock).
        tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path).removesuffix('.sock')}.tmp")
        old = os.umask(0o117)  # created 0660 from the start, never briefly wider
        try:
            if os.path.lexists(tmp):
                os.unlink(tmp)
            sock.bind(tmp)
        finally:
            os.umask(old)
        try:
            os.chmod(tmp, 0o660)
            sock.listen(128)
            os.rename(tmp, path)
        except BaseException:
            sock.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        sock.setblocking(False)
        self.listener = sock
        return sock

    def accept_pending(self) -> bool:
        """Accept what is queued, one thread per connection and at most
        ``max_clients`` of them; beyond that a connection gets a ``busy``
        reply from here and is closed. False when out of fds: the caller stops
        polling the listener for a moment instead of spinning on it."""
        assert self.listener is not None
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return True
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    if not self._starved:
                        log.error("accept failed: %s; pausing accepts (connections wait in the backlog)", e)
                    self._starved = True
                    return False
                log.error("accept failed: %s", e)
                return True
            if self._starved:
                log.warning("accepting again")
                self._starved = False
            with self._lock:
                full = self._threads >= self.settings.max_clients
                if not full:
                    self._threads += 1
            if full and self._is_own_probe(conn):
                # Leases hold their threads for good: the watchdog's probe
                # must not be refused because every client slot is a lease.
                conn.setblocking(True)
                threading.Thread(target=self._serve_probe, args=(conn,), daemon=True).start()
                continue
            if full:
                self._refuse_busy(conn)
                continue
            conn.setblocking(True)
            threading.Thread(target=self._serve_counted, args=(conn,), daemon=True).start()

    def _is_own_probe(self, conn: socket.socket) -> bool:
        """This process connecting to itself, and no other such connection served now."""
        try:
            pid = PeerCredentials.of(conn).pid
        except OSError:
            return False
        with self._lock:
            if pid != os.getpid() or self._own_probe:
                return False
            self._own_probe = True
            return True

    def _serve_probe(self, conn: socket.socket) -> None:
        try:
            self._serve_connection(conn)
        finally:
            with self._lock:
                self._own_probe = False

    def _refuse_busy(self, conn: socket.socket) -> None:
        with conn:
            self._busy_refused += 1
            now = time.monotonic()
            if now - self._busy_logged_at >= 1.0:  # one line a second, however many
                log.warning(
                    "refused %d connection(s): %d clients connected (max_clients)",
                    self._busy_refused,
                    self.settings.max_clients,
                )
                self._busy_refused = 0
                self._busy_logged_at = now
            self._try_send(Channel(conn, Request), self._error_reply(Busy.code, "too many clients"), 0.0)

    def _serve_counted(self, conn: socket.socket) -> None:
        try:
            self._serve_connection(conn)
        finally:
            with self._lock:
                self._threads -= 1

    def close(self) -> None:
        """Stop accepting, unlink the socket, and drop every connection."""
        self.state = "stopping"
        if self.listener is not None:
            self.listener.close()
            self.listener = None
            try:
                os.unlink(self.settings.socket_path)
            except FileNotFoundError:
                pass
        with self._lock:
            sessions = list(self._sessions.values())
        for s in sessions:
            try:
                s.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @property
    def client_count(self) -> int:
        """Leases: connections holding an attached model (a status query or a
        connection that has not attached yet is not one)."""
        with self._lock:
            return sum(1 for s in self._sessions.values() if s.models)

    # -- one connection ---------------------------------------------------

    def _serve_connection(self, conn: socket.socket) -> None:
        with conn:
            try:
                peer = PeerCredentials.of(conn)
            except OSError as e:
                log.warning("could not read peer credentials: %s", e)
                return
            chan = Channel(conn, Request)
            timeout = self.settings.connection_timeout_s
            if not self.policy.allows(peer):
                log.warning("refused pid %d uid %d gid %d: not allowed", peer.pid, peer.uid, peer.gid)
                self._try_send(
                    chan,
                    self._error_reply(
                        PermissionRefused.code,
                        f"uid {peer.uid} is not allowed to attach to {self.device.instance_id}",
                    ),
                )
                return
            session = Session(conn, peer)
            with self._lock:
                self._sessions[id(session)] = session
            self.changed.set()
            try:
                self._converse(chan, session, timeout)
            finally:
                with self._lock:
                    del self._sessions[id(session)]
                self.changed.set()
                # One record per model: journalctl WCACHED_MODEL=<name> finds it.
                for name in sorted(session.models):
                    log.info("client pid %d detached from %s", peer.pid, name, extra={"model": name})

    def _converse(self, chan: Channel, session: Session, timeout: float) -> None:
        peer = session.peer
        try:
            hello = chan.recv(MAX_REQUEST_BYTES, idle_timeout=timeout, frame_timeout=timeout)
            if not isinstance(hello, Hello):
                raise ProtocolError(f"first message must be hello, got {type(hello).__name__}")
            version = session.version = negotiate(hello)
            session.client = printable(hello.client)
            chan.send(
                Welcome(
                    version=version,
                    instance=self.device.instance_id,
                    device=self.device.name,
                    daemon_version=__version__,
                    pid=os.getpid(),
                ),
                timeout=timeout,
            )
            while True:
                try:
                    request = chan.recv(MAX_REQUEST_BYTES, idle_timeout=None, frame_timeout=timeout)
                except ProtocolError as e:
                    if isinstance(e, FrameTooLarge):
                        raise
                    # A whole frame was read, so the stream is still in step.
                    log.warning("bad request from pid %d: %s", peer.pid, e)
                    chan.send(self._error_reply(e.code, str(e)), timeout=timeout)
                    continue
                try:
                    self._dispatch(chan, session, request, timeout)
                except (TimeoutExpired, ProtocolError):
                    raise
                except WcacheError as e:
                    log.warning("request from pid %d failed: %s", peer.pid, e)
                    chan.send(self._error_reply(e.code, str(e)), timeout=timeout)
        except PeerClosed:
            pass
        except TimeoutExpired as e:
            log.warning("dropped pid %d: %s", peer.pid, e)
        except ProtocolError as e:
            log.warning("dropped pid %d: %s", peer.pid, e)
            self._try_send(chan, self._error_reply(e.code, str(e)))
        except OSError as e:
            log.info("connection of pid %d ended: %s", peer.pid, e)

    def _dispatch(self, chan: Channel, session: Session, request: object, timeout: float) -> None:
        if isinstance(request, Attach):
            self._attach(chan, session, request, timeout)
        elif isinstance(request, StatusRequest):
            chan.send(self.status(), timeout=timeout)
        elif isinstance(request, Release):
            self._release(chan, session, request, timeout)
        elif isinstance(request, Hello):
            raise BadRequest("hello was already exchanged")
        else:
            raise BadRequest(f"unexpected request {type(request).__name__}")

    def _attach(self, chan: Channel, session: Session, req: Attach, timeout: float) -> None:
        # An OSError (the peer gone mid-send, out of fds) leaves "error".
        result = "error"
        try:
            held = self.holdings.get(req.model)
            held.check_served()
            fields = mismatched_fields(held.manifest.key, req.expect)
            if fields:
                message = describe_mismatch(held.manifest.key, req.expect, fields)
                log.warning(
                    "pid %d: cache key mismatch for %s: %s",
                    session.peer.pid,
                    req.model,
                    message,
                    extra={"model": req.model},
                )
                chan.send(Mismatch(model=req.model, fields=fields, message=message), timeout=timeout)
                result = "mismatch"
                return
            fds = held.dup_fds()
            # Recorded before the reply goes: a status asked the moment the
            # client holds its fds lists it as attached (it raced the reply).
            with self._lock:
                first = req.model not in session.models
                session.models.add(req.model)
            try:
                chan.send(
                    Attached(manifest=held.manifest_for(session.version), fd_count=len(fds)),
                    timeout=timeout,
                    fds=fds,
                )
            except BaseException:
                if first:
                    with self._lock:
                        session.models.discard(req.model)
                raise
            finally:
                close_fds(fds)
            result = "ok"
        except WcacheError as e:
            result = e.code
            raise
        finally:
            # The metrics label only configured names: an unknown one is "".
            self.metrics.count_attach(req.model, result)
            self.changed.set()
        log.info(
            "pid %d (uid %d, %s) attached to %s",
            session.peer.pid,
            session.peer.uid,
            session.client or "client",
            req.model,
            extra={"model": req.model},
        )

    def _release(self, chan: Channel, session: Session, req: Release, timeout: float) -> None:
        if not self.policy.may_administer(session.peer):
            raise PermissionRefused("release is reserved to root and the daemon's own user")
        self.holdings.release(req.model)
        self.changed.set()
        with self._lock:
            attached = sum(1 for s in self._sessions.values() if req.model in s.models)
        log.warning(
            "model %s released by pid %d; %d attached client(s) keep their mappings",
            req.model,
            session.peer.pid,
            attached,
            extra={"model": req.model},
        )
        chan.send(Released(model=req.model, attached_clients=attached), timeout=timeout)

    def status(self) -> StatusReply:
        now = time.monotonic()
        with self._lock:
            clients = [
                ClientStatus(
                    pid=s.peer.pid,
                    uid=s.peer.uid,
                    gid=s.peer.gid,
                    client=s.client,
                    models=sorted(s.models),
                    connected_s=round(now - s.connected_at, 3),
                )
                for s in self._sessions.values()
                if s.models
            ]
        return StatusReply(
            instance=self.device.instance_id,
            device=self.device.name,
            backend=self.device.backend,
            state=self.state,
            pid=os.getpid(),
            daemon_version=__version__,
            uptime_s=round(now - self.started, 3),
            models=self.holdings.statuses(),
            clients=clients,
            device_memory_bytes=self.device.memory_bytes,
            device_index=self.device.index,
        )

    def _error_reply(self, code: str, message: str) -> ErrorReply:
        """An error reply, counted (when sent, whether or not the peer reads it)."""
        self.metrics.count_error(code)
        self.changed.set()
        return ErrorReply(code=code, message=message)

    @staticmethod
    def _try_send(chan: Channel, msg: object, timeout: float = 1.0) -> None:
        try:
            chan.send(msg, timeout=timeout)
        except (OSError, WcacheError):
            pass
