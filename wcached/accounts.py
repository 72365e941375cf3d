"""Users and groups as wcached's settings name them: a name, or a numeric id
taken as it is (a user of a container, say, that this host's database does not
list). The one rule for the daemon's access lists, doctor's check of them and a
client's list of daemon users."""

from __future__ import annotations

import grp
import pwd

# 2**32 - 1 is the kernel's "no id" (uid_t's -1): nobody has it.
_NO_ID = 2**32 - 1


def _numeric(name: str) -> int | None:
    """``name`` as a numeric id, or None if it is not one."""
    if name.isascii() and name.isdigit():  # str.isdigit() takes "²" and "٣" too
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
