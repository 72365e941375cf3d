"""The per-instance lock: one daemon per device, stale sockets removed safely.

flock is released by the kernel when its holder dies, so a crashed daemon never
leaves a lock behind; only the lock holder may unlink a socket path, so a
second daemon can never remove a live daemon's socket.
"""

from __future__ import annotations

import fcntl
import os

from wcached.errors import LockHeldError


class InstanceLock:
    def __init__(self, path: str, instance_id: str):
        self.path = path
        self.instance_id = instance_id
        self.fd: int | None = None

    def acquire(self) -> InstanceLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise LockHeldError(
                f"instance {self.instance_id} is already served by pid {owner} (lock {self.path})"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
