"""The paths and names everything assumes are written once (wcached.defaults)
and agree with what the package installs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO
from wcached import defaults
from wcached.errors import ConfigError


def test_the_package_creates_what_the_code_assumes() -> None:
    tmpfiles = (REPO / "packaging" / "systemd" / "tmpfiles.conf").read_text()
    assert f"d {defaults.SOCKET_DIR} 0750 {defaults.DAEMON_USER} {defaults.DAEMON_USER} -" in tmpfiles
    sysusers = (REPO / "packaging" / "systemd" / "sysusers.conf").read_text()
    assert f"u {defaults.DAEMON_USER} " in sysusers and f"g {defaults.DAEMON_USER} " in sysusers
    config = (REPO / "etc" / "wcache" / "wcached.toml").read_text()
    assert f'socket_dir = "{defaults.SOCKET_DIR}"' in config
    rules = (REPO / "packaging" / "deb" / "debian" / "rules").read_text()
    assert f"$(PKG){defaults.CONFIG_PATH}" in rules


def test_each_default_is_written_once_in_the_code() -> None:
    """No module but wcached/defaults.py spells these out as a value."""
    values = {defaults.SOCKET_DIR, defaults.CONFIG_PATH, defaults.CONFIG_ENV}
    found = []
    for path in sorted((REPO / "wcached").rglob("*.py")):
        if path.name == "defaults.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in values:
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}")
    assert not found, found


def test_a_client_finds_its_socket_directory_without_the_daemons_config(tmp_path: Path) -> None:
    """Attaching imports no config parser of the daemon's (its import is most
    of a client's start-up) and a mistake elsewhere in the file does not stop
    a client from finding the daemon."""
    cfg = tmp_path / "wcached.toml"
    cfg.write_text('[daemon]\nsocket_dir = "/srv/sockets"\nno_such_key = 1\n\n[[model]]\nname = 3\n')
    code = (
        "import sys\n"
        "from wcached.client.connection import find_socket_dir\n"
        f"print(find_socket_dir(None, {str(cfg)!r}))\n"
        "print('wcached.config' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert r.stdout.split() == ["/srv/sockets", "False"], r.stdout + r.stderr
    cfg.write_text("[daemon]\n")
    assert defaults.configured_socket_dir(str(cfg)) == defaults.SOCKET_DIR
    # Relative: beside the config file, as the daemon resolves it (make run's).
    cfg.write_text('[daemon]\nsocket_dir = "run"\n')
    assert defaults.configured_socket_dir(str(cfg)) == str(tmp_path / "run")
    from wcached.config import load_config

    assert load_config(cfg).daemon.socket_dir == str(tmp_path / "run")
    cfg.write_text('[daemon]\nsocket_dir = ""\n')
    with pytest.raises(ConfigError, match=r"daemon\.socket_dir.*must not be empty"):
        defaults.configured_socket_dir(str(cfg))
    with pytest.raises(ConfigError, match="file not found"):
        defaults.configured_socket_dir(str(tmp_path / "nope.toml"))
