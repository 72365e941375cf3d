"""Keeping an attachment's lease across daemon restarts.

The daemon never writes to an attached connection, so the connection becoming
readable means it ended: the daemon stopped, crashed or restarted. The memory
does not go with it (the mappings belong to this process, and systemd's fd
store keeps the daemon's fds), so the watcher attaches again as soon as a
daemon answers. If the new daemon holds the very same fill (restored from the
store: same manifest), the new connection becomes the lease and the tensors
stay as they are; if it holds another fill, this process keeps its weights
without a lease and says so once.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
from typing import TYPE_CHECKING

from wcached.errors import WcacheError
from wcached.protocol.messages import Attach, Attached
from wcached.protocol.wire import close_fds

if TYPE_CHECKING:
    from wcached.client.attach import Attachment
    from wcached.client.connection import DaemonConnection

log = logging.getLogger("wcached.client")

POLL_S = 0.5
RETRY_MAX_S = 5.0


class LeaseWatch:
    def __init__(self, attachment: Attachment, expect: dict[str, str | int], client: str | None):
        self.attachment = attachment
        self.expect = dict(expect)
        self.client = client
        self.reattached = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wcached-lease", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._wait_for_end(self.attachment.connection.sock) or self._stop.is_set():
                return  # stopped: the attachment was closed, not the daemon
            name = self.attachment.manifest.model
            path = self.attachment.connection.path
            log.warning("wcached: the daemon at %s ended the lease on %s; attaching again", path, name)
            conn = self._attach_again(path, name)
            if conn is None:
                return
            if not self.attachment.replace_connection(conn):
                conn.close()
                return
            self.reattached += 1
            log.warning("wcached: attached again to %s at %s: the same memory, tensors unchanged", name, path)

    def _wait_for_end(self, sock: socket.socket) -> bool:
        """True once the connection ended; False if stopped first."""
        while not self._stop.is_set():
            try:
                ready, _, _ = select.select([sock], [], [], POLL_S)
            except (OSError, ValueError):
                return not self._stop.is_set()  # closed under us
            if not ready:
                continue
            try:
                data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            except OSError:
                return not self._stop.is_set()
            if not data:
                return not self._stop.is_set()
            # The daemon never speaks first; whatever this is, it is not ours to read.
            self._stop.wait(POLL_S)
        return False

    def _attach_again(self, path: str, name: str) -> DaemonConnection | None:
        from wcached.client.connection import DaemonConnection

        delay = POLL_S
        while not self._stop.wait(delay):
            delay = min(RETRY_MAX_S, delay * 2)
            try:
                conn = DaemonConnection(path, timeout=self.attachment.connection.timeout, client=self.client)
            except (OSError, WcacheError):
                continue  # not back yet
            try:
                reply = conn.request(Attach(model=name, expect=self.expect))
                same = False
                if isinstance(reply, Attached):
                    close_fds(conn.chan.recv_fds(reply.fd_count, timeout=conn.timeout))
                    same = reply.manifest == self.attachment.manifest
            except (OSError, WcacheError) as e:
                conn.close()
                if isinstance(e, (ConnectionError, TimeoutError)):
                    continue
                log.warning(
                    "wcached: cannot attach to %s again (%s); keeping the weights without a lease", name, e
                )
                return None
            if same:
                return conn
            conn.close()
            log.warning(
                "wcached: the daemon at %s now holds another fill of %s; this process keeps its "
                "weights without a lease (attach again to use the new fill)",
                path,
                name,
            )
            return None
        return None
