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
from wcached.protocol.messages import PROTOCOL_VERSION

SQUATTER = textwrap.dedent(
    """
    import socket, sys, time
    s = socket.socket(socket.AF_UNIX)
    s.bind(sys.argv[1])
    s.listen(4)
    open(sys.argv[1] + ".up", "w").close()
    for _ in range(int(sys.argv[2])):
        c, _ = s.accept()
        c.settimeout(5)
        try:
            c.recv(4096)  # a hello, from a client that trusted it
        except OSError:
            pass
        c.close()  # and no welcome: that client gets "closed"
    """
)


def test_socket_served_by_an_untrusted_user_is_refused(work: Path) -> None:
    """Refused unless the client's daemon users name the socket's user, by
    name or by uid (then it is greeted: here, the squatter hangs up)."""
    require_other_users()
    import pwd
    import subprocess
    import threading

    from wcached.errors import ProtocolError

    run = work / "squat"
    run.mkdir(mode=0o777)
    run.chmod(0o777)
    path = str(run / "cpu0.sock")
    result: dict = {}
    t = threading.Thread(
        target=lambda: result.update(
            r=run_as("nobody", [sys.executable, "-c", SQUATTER, path, "3"], timeout=30)
        )
    )
    t.start()
    deadline = time.monotonic() + 20
    while not os.path.exists(path + ".up"):
        assert time.monotonic() < deadline, result
        time.sleep(0.05)
    with pytest.raises(PermissionRefused, match=r"served by uid \d+ .* refusing to use it"):
        DaemonConnection(path, timeout=5, daemon_users=["wcache"])
    nobody = pwd.getpwnam("nobody").pw_uid
    for users in (["nobody"], [str(nobody)]):
        with pytest.raises(ProtocolError, match="closed the connection"):
            DaemonConnection(path, timeout=5, daemon_users=users)
    t.join(30)
    assert isinstance(result["r"], subprocess.CompletedProcess)


def test_trusted_daemon_users_from_the_environment(monkeypatch) -> None:
    import pwd

    nobody = pwd.getpwnam("nobody").pw_uid
    monkeypatch.setenv("WCACHED_DAEMON_USERS", "nobody, no-such-user")
    assert trusted_daemon_uids() == {0, os.geteuid(), nobody}
    # Named by uid, or by the caller (who wins over the environment).
    monkeypatch.setenv("WCACHED_DAEMON_USERS", "4242")
    assert trusted_daemon_uids() == {0, os.geteuid(), 4242}
    assert trusted_daemon_uids(["nobody"]) == {0, os.geteuid(), nobody}
    monkeypatch.delenv("WCACHED_DAEMON_USERS")
    assert nobody not in trusted_daemon_uids()


def test_the_socket_directory_comes_from_the_argument_the_config_in_effect_or_the_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wcached import defaults
    from wcached.client.connection import find_socket_dir

    cfg = tmp_path / "wcached.toml"
    cfg.write_text('[daemon]\nsocket_dir = "/srv/sockets"\n')
    assert find_socket_dir("/given", str(cfg)) == "/given"
    assert find_socket_dir(None, str(cfg)) == "/srv/sockets"
    # No --config: the file $WCACHED_CONFIG names, when there is one.
    monkeypatch.setenv(defaults.CONFIG_ENV, str(cfg))
    assert find_socket_dir(None, None) == "/srv/sockets"
    monkeypatch.setenv(defaults.CONFIG_ENV, str(tmp_path / "none.toml"))
    assert find_socket_dir(None, None) == defaults.SOCKET_DIR


def _attach_through(mode: str, work: Path, tmp_path: Path) -> tuple[int, list]:
    """Attach through a daemon of another release (a proxy in front of a real
    one): the version the connection speaks, and the hellos it received."""
    from tests.helpers import one_model_config, run_daemon
    from tests.integrations.fake_daemons import Proxy
    from wcached.cli.demo import generate_llama
    from wcached.client import attach

    ckpt = generate_llama(tmp_path / "model")
    with run_daemon(one_model_config(work, ckpt)) as d:
        proxy = Proxy(tmp_path / mode, d.socket_path, mode)
        try:
            with attach("default", "cpu0", socket_dir=str(tmp_path / mode)) as a:
                assert a.tensors
                return a.connection.welcome.version, proxy.hellos
        finally:
            proxy.close()


def test_a_version_1_daemon_is_greeted_again_at_version_1(work: Path, tmp_path: Path) -> None:
    """The first release's daemons wanted exactly version 1 and knew no
    range: refused at this release's version, the client greets at 1."""
    version, hellos = _attach_through("v1", work, tmp_path)
    assert version == 1
    assert [h["version"] for h in hellos] == [PROTOCOL_VERSION, 1] and "min_version" not in hellos[1]


def test_a_later_daemon_with_unknown_fields_is_attached(work: Path, tmp_path: Path) -> None:
    version, hellos = _attach_through("next", work, tmp_path)
    assert version == PROTOCOL_VERSION and hellos[0]["version"] == PROTOCOL_VERSION


def test_the_replies_types_are_resolved_when_the_client_is_imported() -> None:
    """An engine's first attach does not pay for msgspec's evaluation of the
    reply structs' annotations (~2 ms): importing the client did it."""
    import subprocess
    import sys

    # msgspec evaluates the annotations (strings here) through typing's
    # ForwardRef: counted while a decoder for the replies is made.
    script = """
import typing
from wcached.client import connection
from wcached.protocol.messages import Reply
import msgspec
calls = []
real = typing.ForwardRef._evaluate
typing.ForwardRef._evaluate = lambda *a, **k: calls.append(a) or real(*a, **k)
msgspec.msgpack.Decoder(Reply)
print(len(calls))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0", out.stdout + out.stderr


def test_a_client_at_max_clients_waits_for_a_slot_until_its_timeout(work: Path, sharded_ckpt: Path) -> None:
    """A daemon at max_clients answers busy: the client tries again, with a
    delay that grows to 0.5 s, and is in soon after a slot frees; with none
    freed it gives up at its timeout, not at the first answer."""
    import threading

    from tests.helpers import run_daemon, write_config
    from wcached.errors import Busy

    cfg = write_config(
        work / "wcached.toml",
        models=[{"name": "default", "path": str(sharded_ckpt)}],
        daemon={"socket_dir": str(work / "run"), "max_clients": 1, "connection_timeout_s": 30.0},
    )
    with run_daemon(cfg) as d:
        first = DaemonConnection(d.socket_path, timeout=5)
        started = time.monotonic()
        with pytest.raises(Busy, match="too many clients"):
            DaemonConnection(d.socket_path, timeout=0.6)
        # (Tries at 0, 0.05, 0.15 and 0.35 s; the next would pass the timeout.)
        assert 0.3 <= time.monotonic() - started < 2.0
        threading.Timer(1.0, first.close).start()
        started = time.monotonic()
        with DaemonConnection(d.socket_path, timeout=10) as second:
            waited = time.monotonic() - started
            assert second.status().state == "serving"
        assert 0.9 <= waited < 2.5, waited
