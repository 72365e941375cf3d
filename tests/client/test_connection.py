"""The client trusts a daemon socket only if root, its own user or a daemon
user serves it: a squatter's fds are never used."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import require_other_users, run_as
from wcached.client.connection import DaemonConnection, trusted_daemon_uids
from wcached.errors import PermissionRefused

SQUATTER = textwrap.dedent(
    """
    import socket, sys, time
    s = socket.socket(socket.AF_UNIX)
    s.bind(sys.argv[1])
    s.listen(1)
    open(sys.argv[1] + ".up", "w").close()
    c, _ = s.accept()
    time.sleep(5)
    """
)


def test_socket_served_by_an_untrusted_user_is_refused(work: Path) -> None:
    require_other_users()
    import subprocess
    import threading

    run = work / "squat"
    run.mkdir(mode=0o777)
    run.chmod(0o777)
    path = str(run / "cpu0.sock")
    result: dict = {}
    t = threading.Thread(
        target=lambda: result.update(r=run_as("nobody", [sys.executable, "-c", SQUATTER, path], timeout=30))
    )
    t.start()
    deadline = time.monotonic() + 20
    while not os.path.exists(path + ".up"):
        assert time.monotonic() < deadline, result
        time.sleep(0.05)
    with pytest.raises(PermissionRefused, match=r"served by uid \d+ .* refusing to use it"):
        DaemonConnection(path, timeout=5, daemon_users=["wcache"])
    t.join(30)
    assert isinstance(result["r"], subprocess.CompletedProcess)


def test_trusted_daemon_users_from_the_environment(monkeypatch) -> None:
    import pwd

    nobody = pwd.getpwnam("nobody").pw_uid
    monkeypatch.setenv("WCACHED_DAEMON_USERS", "nobody, no-such-user")
    assert trusted_daemon_uids() == {0, os.geteuid(), nobody}
    monkeypatch.delenv("WCACHED_DAEMON_USERS")
    assert nobody not in trusted_daemon_uids()
