"""The per-instance lock without a daemon: what it writes, what a second
holder is told, and that a release lets the next daemon in (a real second
daemon: tests/daemon/test_service.py)."""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

import pytest

from wcached.daemon.lock import InstanceLock, group_name, left_by_another_user, user_name
from wcached.errors import LockHeldError


def test_the_lock_holds_the_holders_pid_and_only_its_group_may_read_it(tmp_path: Path) -> None:
    path = tmp_path / "cpu0.lock"
    path.write_text("123456789\nleft by an earlier daemon\n")  # a longer stale content
    lock = InstanceLock(str(path), "cpu0").acquire()
    try:
        assert path.read_text() == f"{os.getpid()}\n"
    finally:
        lock.release()
    fresh = tmp_path / "gpu0.lock"
    old = os.umask(0)
    try:
        InstanceLock(str(fresh), "GPU-x").acquire().release()
    finally:
        os.umask(old)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o640


@pytest.mark.parametrize(("content", "named"), [("4242\n", "4242"), ("", "unknown")])
def test_a_second_holder_is_told_whose_it_is(tmp_path: Path, content: str, named: str) -> None:
    path = tmp_path / "cpu0.lock"
    path.write_text(content)
    with open(path) as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another daemon's, as the kernel sees it
        with pytest.raises(LockHeldError) as e:
            InstanceLock(str(path), "cpu0").acquire()
    assert str(e.value) == f"instance cpu0 is already served by pid {named} (lock {path})"


def test_a_released_lock_lets_the_next_holder_in(tmp_path: Path) -> None:
    path = str(tmp_path / "cpu0.lock")
    first = InstanceLock(path, "cpu0").acquire()
    first.release()
    first.release()  # twice is harmless
    InstanceLock(path, "cpu0").acquire().release()


def test_names_of_ids_without_an_entry_are_the_numbers() -> None:
    assert user_name(0) == "root" and user_name(987654) == "987654"
    assert group_name(0) == "root" and group_name(987655) == "987655"


def test_another_users_file_names_owner_holder_and_the_fix() -> None:
    text = left_by_another_user("/run/wcache/cpu0.lock", 0, "instance cpu0")
    assert text.startswith(f"/run/wcache/cpu0.lock belongs to user root, not to {user_name(os.geteuid())}")
    assert text.endswith(
        "(left by a daemon run as root?); if no daemon of instance cpu0 runs, "
        "fix it with: rm /run/wcache/cpu0.lock"
    )


def test_a_lock_in_a_directory_this_user_cannot_enter_names_user_and_fix(tmp_path: Path) -> None:
    """Neither open nor stat: the lock's directory is closed to the daemon's
    user (a socket directory created by root): the error names the lock, the
    user it was tried as, and where to look."""
    import sys

    from tests.helpers import TEST_USER, require_test_user, run_as

    require_test_user()
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    tmp_path.chmod(0o755)
    lock = closed / "cpu0.lock"
    code = (
        "from wcached.daemon.lock import InstanceLock\n"
        "from wcached.errors import LockForeign\n"
        "try:\n"
        f"    InstanceLock({str(lock)!r}, 'cpu0').acquire()\n"
        "except LockForeign as e:\n"
        "    print(e)\n"
    )
    r = run_as(TEST_USER, [sys.executable, "-c", code], timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        f"cannot open lock {lock} as user {TEST_USER}; check the socket directory's owner"
    )
