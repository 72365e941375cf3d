"""A daemon that runs as its own non-root user, as the package's unit does
(User=wcache): its user and root may attach and administer, an allowed user
may attach only, anyone else is refused; each client trusts a daemon of its
own user, and root's trusts one only when told to. As root all of these are
the same user, so the suite's own user (helpers.TEST_USER) runs the daemon."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, TEST_USER, require_test_user, run_as, run_daemon, write_config

CLIENT = """
import sys
from wcached.client import DaemonConnection, PermissionRefused
from wcached.protocol.messages import Attach, Attached, Release, Released, ErrorReply
from wcached.protocol.wire import close_fds
sock, action = sys.argv[1], sys.argv[2]
try:
    with DaemonConnection(sock) as c:
        if action == "attach":
            reply = c.request(Attach(model="m"))
            assert isinstance(reply, Attached), reply
            close_fds(c.chan.recv_fds(reply.fd_count))
            print("attached", len(reply.manifest.tensors))
        else:
            reply = c.request(Release(model="m"))
            print("released" if isinstance(reply, Released) else f"error: {reply}")
except PermissionRefused as e:
    print("refused:", e)
"""


@pytest.fixture
def own_user_daemon(work: Path, sharded_ckpt: Path):
    """A daemon running as TEST_USER; nobody is an allowed user."""
    require_test_user()
    pw = pwd.getpwnam(TEST_USER)
    ckpt = Path(shutil.copytree(sharded_ckpt, work / "ckpt"))
    for p in [ckpt, *ckpt.iterdir()]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    run = work / "run"
    run.mkdir()
    os.chown(run, pw.pw_uid, pw.pw_gid)
    run.chmod(0o750)
    cfg = write_config(
        work / "wcached.toml",
        models=[{"name": "m", "path": str(ckpt)}],
        daemon={"socket_dir": str(run), "allowed_users": ["nobody"]},
    )
    cfg.chmod(0o644)
    with run_daemon(cfg, user=TEST_USER) as d:
        yield d, cfg


def _client(
    user: str, sock: str, action: str, env: dict | None = None, groups: list[int] | None = None
) -> str:
    # The socket directory is the daemon user's (0750): others reach the
    # socket through its group, as the package's allowed group does.
    gid = pwd.getpwnam(TEST_USER).pw_gid
    argv = [sys.executable, "-c", CLIENT, sock, action]
    if env:
        argv = ["env", *(f"{k}={v}" for k, v in env.items()), f"PYTHONPATH={REPO}", *argv]
    r = run_as(user, argv, extra_groups=groups if groups is not None else [gid])
    assert "Traceback" not in r.stderr, r.stderr
    return r.stdout.strip()


def test_the_daemons_own_user_attaches_and_administers(own_user_daemon) -> None:
    """The daemon's own user needs no allowed_users entry, and may release."""
    d, _ = own_user_daemon
    assert _client(TEST_USER, d.socket_path, "attach").startswith("attached 16"), d.log()
    assert _client(TEST_USER, d.socket_path, "release") == "released", d.log()


def test_an_allowed_user_attaches_but_may_not_administer(own_user_daemon) -> None:
    """allowed_users may attach; release stays with root and the daemon's user."""
    d, _ = own_user_daemon
    env = {"WCACHED_DAEMON_USERS": TEST_USER}  # nobody's client trusts this daemon
    assert _client("nobody", d.socket_path, "attach", env).startswith("attached"), d.log()
    out = _client("nobody", d.socket_path, "release", env)
    assert out == "refused: release is reserved to root and the daemon's own user", out


def test_a_user_neither_own_nor_allowed_is_refused_by_the_daemon(own_user_daemon) -> None:
    """Reaching the socket (here through its group) is not permission."""
    d, _ = own_user_daemon
    out = _client("daemon", d.socket_path, "attach", {"WCACHED_DAEMON_USERS": TEST_USER})
    assert out.startswith("refused:"), out
    uid = pwd.getpwnam("daemon").pw_uid
    assert f"uid {uid} gid" in d.log() and "not allowed" in d.log(), d.log()


def test_a_client_trusts_a_daemon_of_its_own_user_and_root_only_when_told(own_user_daemon) -> None:
    """A socket served by another user may be a squatter: root's client
    refuses it unless WCACHED_DAEMON_USERS names that user."""
    d, _ = own_user_daemon
    root = [sys.executable, "-c", CLIENT, d.socket_path, "attach"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    import subprocess

    refused = subprocess.run(root, capture_output=True, text=True, env=env).stdout
    assert refused.startswith("refused:") and f"uid {pwd.getpwnam(TEST_USER).pw_uid}" in refused, refused
    told = subprocess.run(
        root, capture_output=True, text=True, env={**env, "WCACHED_DAEMON_USERS": TEST_USER}
    ).stdout
    assert told.startswith("attached"), told


def test_verify_and_status_run_as_the_daemons_user(own_user_daemon) -> None:
    """An operator who is the daemon's user checks it without root."""
    _, cfg = own_user_daemon
    group = grp.getgrgid(pwd.getpwnam(TEST_USER).pw_gid).gr_gid
    verify = run_as(
        TEST_USER, [sys.executable, "-m", "wcached", "verify", "cpu0", "--config", str(cfg)], 120, [group]
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    status = run_as(TEST_USER, [sys.executable, "-m", "wcached", "status", "--config", str(cfg)], 60, [group])
    assert status.returncode == 0 and "serving" in status.stdout, status.stdout + status.stderr
