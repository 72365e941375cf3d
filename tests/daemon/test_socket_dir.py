"""The socket directory must be the daemon's own: one another user could
redirect, write in or own is refused at start (exit 78, not retried),
naming the directory and the fix; the fix, applied as printed, lets the
daemon start."""

from __future__ import annotations

import grp
import os
import pwd
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import one_model_config, run_daemon, start_daemon
from wcached.client import attach
from wcached.errors import EX_CONFIG

# case -> the reason the daemon gives (the operator reads it in the journal).
CASES = {
    "symlink": "is not a directory (a symlink or a file)",
    "dangling-symlink": "is not a directory (a symlink or a file)",
    "a-file": "is not a directory (a symlink or a file)",
    "writable-by-another-group": "is writable by others than",
    "world-writable": "is writable by others than",
    "foreign-owner": "belongs to nobody, not to the daemon's user",
    "owner-cannot-write": "is not writable by its owner",
}


def _other_group() -> int:
    """A group that is not the daemon's own (this process's)."""
    return next(g.gr_gid for g in grp.getgrall() if g.gr_gid != os.getegid())


def plant(case: str, run: Path) -> Path:
    """Make ``run`` the socket directory gone wrong as ``case`` says; returns
    where the daemon's files would land (the link's target, for a link)."""
    if case == "symlink":
        target = run.parent / "elsewhere"
        target.mkdir(mode=0o750)
        run.symlink_to(target)
        return target
    if case == "dangling-symlink":
        run.symlink_to(run.parent / "nowhere")
        return run.parent / "nowhere"
    if case == "a-file":
        run.write_text("")
        return run.parent / "nowhere"
    run.mkdir()
    if case == "writable-by-another-group":
        os.chown(run, -1, _other_group())
        run.chmod(0o770)
    elif case == "world-writable":
        run.chmod(0o757)  # by everyone but its group: the rule, not a group check, refuses it
    elif case == "owner-cannot-write":
        run.chmod(0o550)  # root could still write in it: the rule, not EACCES, refuses it
    else:
        if os.geteuid() != 0:
            pytest.skip("needs root to give the directory away")
        os.chown(run, pwd.getpwnam("nobody").pw_uid, -1)
        run.chmod(0o750)
    return run


@pytest.mark.parametrize("case", CASES)
def test_an_untrusted_socket_directory_stops_the_daemon_and_its_fix_lets_it_start(
    work: Path, sharded_ckpt: Path, case: str
) -> None:
    """A socket directory another user could redirect, write in or own: the
    daemon exits 78 before filling, naming the directory and a fix; that
    fix, run as printed, lets the next start serve."""
    run = work / "run"
    lands = plant(case, run)
    cfg = one_model_config(work, sharded_ckpt, run)
    d = start_daemon(cfg)
    assert d.wait_exit(30) == EX_CONFIG, d.log()
    log = d.log()
    assert "daemon.socket_dir" in log and f"{run} " in log and str(cfg) in log, log
    assert CASES[case] in log, log
    assert "loader worker" not in log and "Traceback" not in log, log
    assert not lands.exists() or not list(lands.iterdir()), "the daemon put files in it"
    if case == "a-file":
        assert run.is_file() and not run.is_symlink(), "the file was replaced before the fix"
    d.notify.close()
    (fix,) = re.findall(r"fix with: (.*)$", log, re.M)
    subprocess.run(fix, shell=True, check=True)
    with (
        run_daemon(cfg) as d,
        attach("default", "cpu0", socket_dir=str(run), timeout=10, keep_lease=False) as a,
    ):
        assert not os.path.islink(run) and "embed.weight" in a.tensors


def test_root_checks_the_directory_for_the_packages_daemon_user(monkeypatch) -> None:
    """Root runs the checks of a packaged host (doctor, check-config): the
    directory must then be the package's daemon user's, not root's; any
    other user checks for itself."""
    from wcached import defaults
    from wcached.daemon import socket_dir

    if os.geteuid() != 0:
        assert socket_dir.daemon_uid() == os.geteuid()
        return
    monkeypatch.setattr(defaults, "DAEMON_USER", "nobody")
    assert socket_dir.daemon_uid() == pwd.getpwnam("nobody").pw_uid
    monkeypatch.setattr(defaults, "DAEMON_USER", "no-such-user-here")
    assert socket_dir.daemon_uid() == 0
    monkeypatch.setattr(os, "geteuid", lambda: 4321)
    assert socket_dir.daemon_uid() == 4321
