"""The socket directory's one rule, asked by serve, check-config and doctor.

The daemon binds ``<id>.sock`` and keeps ``<id>.lock`` there, so the
directory must be the daemon's own: owned by the daemon's user (root's only
when the daemon runs as root), writable and searchable by it, and writable by
no one else. A group that may write (the group engine users join) could plant
the lock or remove the socket; a directory the daemon's user cannot write
fails every start. The package's ``/run/wcache`` (tmpfiles.d: ``d /run/wcache
0750 wcache wcache``) is exactly this.
"""

from __future__ import annotations

import os
import pwd
import stat

from wcached import defaults


def daemon_uid() -> int:
    """Whom the directory must belong to, as seen by the caller: itself when
    it is the daemon (or a check re-run as the daemon's user); for root, the
    package's daemon user where it exists (root runs the checks of a packaged
    host), else root."""
    me = os.geteuid()
    if me != 0:
        return me
    try:
        return pwd.getpwnam(defaults.DAEMON_USER).pw_uid
    except KeyError:
        return 0


def problem(path: str, owner_uid: int | None = None) -> str:
    """What is wrong with ``path`` as the socket directory of a daemon
    running as ``owner_uid`` (default :func:`daemon_uid`); "" if nothing."""
    uid = daemon_uid() if owner_uid is None else owner_uid
    st = os.lstat(path)
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        return "is not a directory (a symlink or a file): another user could point it elsewhere"
    if st.st_uid != uid:
        return (
            f"belongs to {_user(st.st_uid)}, not to the daemon's user {_user(uid)}: "
            "the daemon could not create its socket there, or its owner could remove it"
        )
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by others than {_user(uid)} (mode {mode:04o}): they could plant a socket or lock"
    if mode & (stat.S_IWUSR | stat.S_IXUSR) != stat.S_IWUSR | stat.S_IXUSR:
        return f"is not writable by its owner {_user(uid)} (mode {mode:04o}): the daemon could not bind there"
    return ""


def fix(path: str, owner_uid: int | None = None) -> str:
    """The commands that make ``path`` right for that daemon (tested to let it start)."""
    uid = daemon_uid() if owner_uid is None else owner_uid
    user = _user(uid)
    try:
        import grp

        group = grp.getgrgid(pwd.getpwuid(uid).pw_gid).gr_name
    except KeyError:
        group = user
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        # chown and chmod would follow the link: replace it with a directory.
        return f"rm {path} && install -d -o {user} -g {group} -m 0750 {path}"
    return f"chown {user}:{group} {path} && chmod 0750 {path}"


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
