"""Who is on the other end of a connection, and may they attach.

``SO_PEERCRED`` gives the peer's pid, uid and gid as of connect(); its
supplementary groups come from ``SO_PEERGROUPS`` (Linux 4.13+). The rule: the
daemon's own uid, root, and the users and groups the config allows. Everyone
else is refused before the first frame, so no fd ever reaches them.
"""

from __future__ import annotations

import array
import os
import socket
from dataclasses import dataclass

from wcached.accounts import group_id, peer_ids, user_id
from wcached.config import AccessLists
from wcached.errors import ConfigError

SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
_MAX_GROUPS = 65536


@dataclass(frozen=True)
class PeerCredentials:
    pid: int
    uid: int
    gid: int
    groups: frozenset[int]

    @classmethod
    def of(cls, conn: socket.socket) -> PeerCredentials:
        pid, uid, gid = peer_ids(conn)
        return cls(pid, uid, gid, frozenset(_peer_groups(conn, pid)))


def _peer_groups(conn: socket.socket, pid: int) -> list[int]:
    size = 256 * 4
    while size <= _MAX_GROUPS * 4:
        try:
            raw = conn.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, size)
            return list(array.array("I", raw))
        except OSError as e:
            if e.errno == 34:  # ERANGE: buffer too small
                size *= 4
                continue
            break
    # Old kernels: the process's current groups (racy with exec, but only as a fallback).
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return [int(g) for g in line.split()[1:]]
    except OSError:
        pass
    return []


@dataclass(frozen=True)
class AccessPolicy:
    own_uid: int
    uids: frozenset[int]
    gids: frozenset[int]

    @classmethod
    def from_lists(cls, lists: AccessLists, config_path: str) -> AccessPolicy:
        """The policy of an instance's lists of user and group names (or
        numeric ids); a name that does not resolve is a ConfigError naming
        ``config_path`` and the key it came from with its position
        (``instance.0.allowed_users[1]``)."""
        uids = set()
        for i, name in enumerate(lists.users):
            uid = user_id(name)
            if uid is None:
                raise ConfigError(config_path, f"{lists.users_key}[{i}]", f"no such user {name!r}")
            uids.add(uid)
        gids = set()
        for i, name in enumerate(lists.groups):
            gid = group_id(name)
            if gid is None:
                raise ConfigError(config_path, f"{lists.groups_key}[{i}]", f"no such group {name!r}")
            gids.add(gid)
        return cls(os.getuid(), frozenset(uids), frozenset(gids))

    def allows(self, peer: PeerCredentials) -> bool:
        if peer.uid in (0, self.own_uid) or peer.uid in self.uids:
            return True
        return peer.gid in self.gids or bool(peer.groups & self.gids)

    def may_administer(self, peer: PeerCredentials) -> bool:
        """Release and other state changes: the daemon's own uid and root only."""
        return peer.uid in (0, self.own_uid)
