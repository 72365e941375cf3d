"""SO_PEERCRED checks against clients running as other users."""

from __future__ import annotations

import contextlib
import os
import pwd
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import Daemon, require_other_users, run_as, run_daemon, write_config


@pytest.fixture(autouse=True)
def _other_users() -> None:
    require_other_users()


@contextlib.contextmanager
def _open_daemon(work: Path, ckpt: Path, **daemon: object) -> Iterator[Daemon]:
    """A daemon serving ``ckpt`` with ``daemon`` settings, its socket opened
    to everyone on the filesystem, so that only SO_PEERCRED decides."""
    cfg = write_config(
        work / "wcached.toml",
        models=[{"name": "default", "path": str(ckpt)}],
        daemon={"socket_dir": str(work / "run"), **daemon},
    )
    with run_daemon(cfg) as d:
        os.chmod(d.socket_dir, 0o755)
        os.chmod(d.socket_path, 0o666)
        yield d


CLIENT = textwrap.dedent(
    """
    import sys
    from wcached.client import attach, PermissionRefused
    try:
        with attach("default", "cpu0", socket_dir=sys.argv[1]) as a:
            print("attached", len(a.tensors))
    except PermissionRefused as e:
        print("refused:", e)
    """
)


def _run_as(user: str, socket_dir: str, extra_groups: list[int] | None = None) -> str:
    r = run_as(user, [sys.executable, "-c", CLIENT, socket_dir], extra_groups=extra_groups)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_allowed_group_attaches_and_others_are_refused(work: Path, sharded_ckpt: Path) -> None:
    nobody_group = pwd.getpwnam("nobody").pw_gid
    with _open_daemon(work, sharded_ckpt, allowed_groups=[str(nobody_group)]) as d:
        assert _run_as("nobody", d.socket_dir).startswith("attached")
        out = _run_as("daemon", d.socket_dir)
        assert out.startswith("refused:") and f"uid {pwd.getpwnam('daemon').pw_uid}" in out
        assert "not allowed" in d.log()
        assert d.proc.poll() is None


def test_peer_allowed_only_through_a_supplementary_group(work: Path, sharded_ckpt: Path) -> None:
    """nobody's primary group is not allowed; the group "daemon" is, and
    nobody attaches only while it holds that group as a supplementary one."""
    import grp

    allowed = grp.getgrnam("daemon").gr_gid
    assert pwd.getpwnam("nobody").pw_gid != allowed
    with _open_daemon(work, sharded_ckpt, allowed_groups=["daemon"]) as d:
        assert _run_as("nobody", d.socket_dir).startswith("refused:")
        assert _run_as("nobody", d.socket_dir, extra_groups=[allowed]).startswith("attached")


def test_allowed_user_attaches(work: Path, sharded_ckpt: Path) -> None:
    with _open_daemon(work, sharded_ckpt, allowed_users=["daemon"]) as d:
        assert _run_as("daemon", d.socket_dir).startswith("attached")
        assert _run_as("nobody", d.socket_dir).startswith("refused:")


def test_release_is_reserved_to_the_daemon_user(work: Path, sharded_ckpt: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        from wcached.client import DaemonConnection, PermissionRefused
        with DaemonConnection(sys.argv[1]) as c:
            try:
                c.release("default")
                print("released")
            except PermissionRefused as e:
                print("refused:", e)
        """
    )
    with _open_daemon(work, sharded_ckpt, allowed_users=["nobody"]) as d:
        r = run_as("nobody", [sys.executable, "-c", script, d.socket_path])
        assert r.stdout.startswith("refused:"), r.stderr
