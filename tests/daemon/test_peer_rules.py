"""The peer check's rules without a daemon: what SO_PEERCRED and
SO_PEERGROUPS say of a connection, the /proc fallback of kernels without
SO_PEERGROUPS, and who the config's names allow (tests/daemon/test_peers.py
shows the same rules through a real daemon and clients of other users)."""

from __future__ import annotations

import array
import errno
import os
import socket
import subprocess

import pytest

from wcached.config import AccessLists
from wcached.daemon import peers
from wcached.daemon.peers import AccessPolicy, PeerCredentials
from wcached.errors import ConfigError


class _GroupsSocket:
    """A connection whose SO_PEERGROUPS holds ``groups``: too small a buffer
    gets ERANGE, as Linux answers; ``error`` instead fails every call."""

    def __init__(self, groups: list[int], error: int = 0):
        self.groups = groups
        self.error = error
        self.sizes: list[int] = []

    def getsockopt(self, level: int, option: int, size: int) -> bytes:
        assert (level, option) == (socket.SOL_SOCKET, peers.SO_PEERGROUPS)
        assert isinstance(size, int) and size > 0, size
        self.sizes.append(size)
        assert len(self.sizes) < 20, "the buffer never grows"
        if self.error:
            raise OSError(self.error, os.strerror(self.error))
        if size < 4 * len(self.groups):
            raise OSError(errno.ERANGE, os.strerror(errno.ERANGE))
        return array.array("I", self.groups).tobytes()


def test_a_socket_peer_is_this_process_with_its_groups() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        peer = PeerCredentials.of(a)
    assert (peer.pid, peer.uid, peer.gid) == (os.getpid(), os.getuid(), os.getgid())
    assert peer.groups == frozenset(os.getgroups())


def test_many_groups_grow_the_buffer_until_they_fit() -> None:
    groups = list(range(1000, 1000 + 300))  # more than the first buffer holds
    conn = _GroupsSocket(groups)
    assert peers._peer_groups(conn, pid=0) == groups
    assert conn.sizes[0] < 4 * len(groups) <= conn.sizes[-1]


def test_the_kernels_most_groups_fit() -> None:
    groups = list(range(peers._MAX_GROUPS))  # NGROUPS_MAX on Linux
    assert peers._peer_groups(_GroupsSocket(groups), pid=0) == groups


def test_group_ids_past_two_to_the_31_stay_unsigned() -> None:
    assert peers._peer_groups(_GroupsSocket([3_000_000_000]), pid=0) == [3_000_000_000]


@pytest.fixture
def other_groups_process():
    """A process whose supplementary groups are not ours (needs root)."""
    if os.getuid() != 0:
        pytest.skip("needs root to give a process other groups")
    p = subprocess.Popen(["sleep", "30"], extra_groups=[4242, 4343])
    yield p.pid
    p.kill()
    p.wait()


@pytest.mark.parametrize("error", [errno.ENOPROTOOPT, errno.EINVAL])
def test_without_so_peergroups_the_groups_come_from_proc(other_groups_process: int, error: int) -> None:
    """Kernels before 4.13 answer SO_PEERGROUPS with an error: the peer's
    current groups are read from /proc/<pid>/status instead."""
    got = peers._peer_groups(_GroupsSocket([1, 2], error=error), other_groups_process)
    assert sorted(got) == [4242, 4343]


def test_without_so_peergroups_a_peers_groups_are_those_of_its_own_pid(other_groups_process: int) -> None:
    """The fallback reads the groups of the pid SO_PEERCRED names (the
    peer's), not of some other process."""
    import struct

    class OldKernelSocket(_GroupsSocket):
        def getsockopt(self, level: int, option: int, size: int) -> bytes:
            if option == socket.SO_PEERCRED:
                return struct.pack("iII", other_groups_process, 1234, 1234)
            return super().getsockopt(level, option, size)

    peer = PeerCredentials.of(OldKernelSocket([], error=errno.ENOPROTOOPT))  # type: ignore[arg-type]
    assert (peer.pid, peer.uid, peer.groups) == (other_groups_process, 1234, frozenset({4242, 4343}))


def test_a_peer_gone_from_proc_has_no_groups() -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert peers._peer_groups(_GroupsSocket([], error=errno.ENOPROTOOPT), dead.pid) == []


def test_unknown_names_are_config_errors_naming_file_key_and_name() -> None:
    with pytest.raises(ConfigError) as e:
        AccessPolicy.from_lists(
            AccessLists(("root", "no-such-user-here"), (), users_key="instance.0.allowed_users"),
            "/etc/wcache/x.toml",
        )
    assert (e.value.path, e.value.key) == ("/etc/wcache/x.toml", "instance.0.allowed_users[1]")
    assert "no such user 'no-such-user-here'" in str(e.value)
    with pytest.raises(ConfigError) as e:
        AccessPolicy.from_lists(
            AccessLists((), ("root", "no-such-group-here"), groups_key="instance.0.allowed_groups"),
            "/etc/wcache/x.toml",
        )
    assert (e.value.path, e.value.key) == ("/etc/wcache/x.toml", "instance.0.allowed_groups[1]")
    assert "no such group 'no-such-group-here'" in str(e.value)


def test_numeric_ids_need_no_passwd_entry() -> None:
    """A uid or gid given as a number is taken as it is (a container's users
    are often not in the host's passwd)."""
    policy = AccessPolicy.from_lists(AccessLists(("123457",), ("123458",)), "x.toml")
    assert policy.uids == {123457} and policy.gids == {123458}
    assert policy.own_uid == os.getuid()


def _peer(uid: int, gid: int = 99999, groups: tuple[int, ...] = ()) -> PeerCredentials:
    return PeerCredentials(pid=1, uid=uid, gid=gid, groups=frozenset(groups))


def test_root_and_the_daemons_own_user_attach_and_administer_others_do_not() -> None:
    policy = AccessPolicy(own_uid=999, uids=frozenset({1001}), gids=frozenset({2002}))
    for uid in (0, 999):
        assert policy.allows(_peer(uid)) and policy.may_administer(_peer(uid))
    assert policy.allows(_peer(1001)) and not policy.may_administer(_peer(1001))
    assert policy.allows(_peer(1, gid=2002)) and policy.allows(_peer(1, groups=(7, 2002)))
    assert not policy.allows(_peer(1)) and not policy.may_administer(_peer(1))


@pytest.mark.parametrize("entry", ["²", "٣", "4294967295", "4294967296", "a\x00b"])
def test_an_entry_no_id_can_stand_for_is_a_config_error_naming_its_key(entry: str) -> None:
    """A digit that is not ASCII (Python's isdigit takes it, int() may not or
    reads another number), an id past uid_t's (2**32 - 1 is the kernel's "no
    id"), a NUL in a name: refused under the key, like an unknown name."""
    for lists, key in (
        (AccessLists((entry,), ()), "daemon.allowed_users[0]"),
        (
            AccessLists((), ("root", entry), groups_key="instance.0.allowed_groups"),
            "instance.0.allowed_groups[1]",
        ),
    ):
        with pytest.raises(ConfigError) as e:
            AccessPolicy.from_lists(lists, "x.toml")
        assert e.value.key == key


def test_the_largest_id_a_kernel_gives_is_taken() -> None:
    policy = AccessPolicy.from_lists(AccessLists(("4294967294",), ("4294967294",)), "x.toml")
    assert policy.uids == {4294967294} and policy.gids == {4294967294}


def test_a_peer_with_a_uid_past_two_to_the_31_is_allowed_by_its_number() -> None:
    """A client running as uid 3,000,000,000 (a container's) attaches when
    allowed_users names that number: the daemon reads the id unsigned."""
    from tests.helpers import peer_as

    with peer_as(3_000_000_000, 3_000_000_001) as (conn, pid):
        peer = peers.PeerCredentials.of(conn)
    assert (peer.pid, peer.uid, peer.gid) == (pid, 3_000_000_000, 3_000_000_001)
    policy = AccessPolicy.from_lists(AccessLists(("3000000000",), ()), "x.toml")
    assert policy.allows(peer) and not policy.may_administer(peer)
    assert AccessPolicy.from_lists(AccessLists((), ("3000000001",)), "x.toml").allows(peer)
