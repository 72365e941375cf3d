"""Users and groups as wcached's settings name them (wcached.accounts): the
one rule the daemon's access lists, doctor and a client's daemon users ask."""

from __future__ import annotations

import grp
import pwd

import pytest

from tests.helpers import peer_as
from wcached.accounts import group_id, peer_ids, user_id


def test_a_name_is_looked_up_in_the_hosts_database() -> None:
    assert user_id("root") == 0 and group_id("root") == 0
    nobody = pwd.getpwnam("nobody")
    assert user_id("nobody") == nobody.pw_uid
    assert group_id(grp.getgrgid(nobody.pw_gid).gr_name) == nobody.pw_gid


def test_a_numeric_id_is_taken_as_it_is_up_to_the_largest_a_kernel_gives() -> None:
    """A container's user need not be in this host's database; 2**32 - 1 is
    the kernel's "no id", and nothing past it is an id."""
    for lookup in (user_id, group_id):
        assert lookup("0") == 0
        assert lookup("4242") == 4242
        assert lookup("4294967294") == 4294967294
        assert lookup("4294967295") is None
        assert lookup("4294967296") is None


@pytest.mark.parametrize(
    "entry", ["²", "٣", "a\x00b", "no-such-user-wcached", "", "-1", " 42", "+42", "4" * 5000, "00000000042"]
)
def test_what_names_no_user_or_group_is_none(entry: str) -> None:
    """Digits that are not ASCII (str.isdigit() takes them; int() raises on
    "²" and reads "٣" as 3), a NUL (getpwnam raises ValueError), a name the
    database lacks, a sign or a space, more digits than any id has (int()
    raises past 4,300 of them): no id, never an exception."""
    assert user_id(entry) is None
    assert group_id(entry) is None


def test_a_peers_ids_past_two_to_the_31_are_read_as_the_kernel_has_them() -> None:
    """uid_t and gid_t are unsigned: a container's uid 3,000,000,000 is that,
    not a negative number no allowed list can name."""
    with peer_as(3_000_000_000, 3_000_000_001) as (conn, pid):
        assert peer_ids(conn) == (pid, 3_000_000_000, 3_000_000_001)
