"""The per-instance lock: one daemon per device, stale sockets removed safely.

flock is released by the kernel when its holder dies, so a crashed daemon never
leaves a lock behind; only the lock holder may unlink a socket path, so a
second daemon can never remove a live daemon's socket.
"""

from __future__ import annotations

import errno
import fcntl
import grp
import os
import pwd

from wcached.errors import LockForeign, LockHeldError


class InstanceLock:
    def __init__(self, path: str, instance_id: str):
        self.path = path
        self.instance_id = instance_id
        self.fd: int | None = None

    def acquire(self) -> InstanceLock:
        try:
            # O_NOFOLLOW: a symlink planted at the lock path is refused, not followed.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o640)
        except PermissionError:
            raise LockForeign(self._foreign()) from None
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise LockForeign(f"lock {self.path} is a symlink; remove it: rm {self.path}") from None
            raise
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

    def _foreign(self) -> str:
        """A lock file this user may not open: left by a daemon run as
        another user (a manual ``wcached serve`` as root, say)."""
        try:
            st = os.stat(self.path)
        except OSError:
            return (
                f"cannot open lock {self.path} as user {user_name(os.geteuid())}; "
                "check the socket directory's owner"
            )
        return "lock " + left_by_another_user(self.path, st.st_uid, f"instance {self.instance_id}")

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def left_by_another_user(path: str, owner_uid: int, holder: str) -> str:
    """What to tell about a lock or socket of another user: whose it is and
    the command that clears it."""
    owner = user_name(owner_uid)
    return (
        f"{path} belongs to user {owner}, not to {user_name(os.geteuid())} (left by a daemon run as "
        f"{owner}?); if no daemon of {holder} runs, fix it with: rm {path}"
    )
