"""Users and groups: as wcached's settings name them (a name, or a numeric id
taken as it is: a user of a container, say, that this host's database does not
list), and as a Unix socket's peer is (its pid, uid and gid). The one rule for
the daemon's access lists, doctor's check of them and a client's list of daemon
users, and the one reading of a peer for the daemon and the client alike."""

from __future__ import annotations

import grp
import pwd
import socket
import struct

# 2**32 - 1 is the kernel's "no id" (uid_t's -1): nobody has it.
_NO_ID = 2**32 - 1
_ID_DIGITS = len(str(_NO_ID))
# struct ucred: pid_t pid, uid_t uid, gid_t gid (uid_t and gid_t unsigned).
_UCRED = struct.Struct("iII")


def peer_ids(sock: socket.socket) -> tuple[int, int, int]:
    """The pid, uid and gid of ``sock``'s peer as of its connect(); an id past
    2**31 as the kernel has it, not negative."""
    return _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))


def _numeric(name: str) -> int | None:
    """``name`` as a numeric id, or None if it is not one."""
    # str.isdigit() takes "²" and "٣" too; and int() refuses a string of over
    # 4,300 digits, where no id is anyway.
    if name.isascii() and name.isdigit() and len(name) <= _ID_DIGITS:
        return int(name)
    return None


def user_id(name: str) -> int | None:
    """The uid ``name`` stands for; None if no user has that name, nor any
    id past uid_t's."""
    number = _numeric(name)
    if number is not None:
        return number if number < _NO_ID else None
    try:
        return pwd.getpwnam(name).pw_uid
    except (KeyError, ValueError):  # ValueError: a NUL in the name
        return None


def group_id(name: str) -> int | None:
    """The gid ``name`` stands for (as :func:`user_id`)."""
    number = _numeric(name)
    if number is not None:
        return number if number < _NO_ID else None
    try:
        return grp.getgrnam(name).gr_gid
    except (KeyError, ValueError):
        return None
