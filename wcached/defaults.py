"""What the package installs and every part of wcached assumes unless told
otherwise: written here once, read by the daemon, its clients, the engine
plugin, check-config and doctor (and kept equal to the package's files by
tests/test_defaults.py).

Importing this module costs nothing: a client or an engine plugin looking for
a socket directory needs no config parser and no daemon code.
"""

from __future__ import annotations

import os

# The daemons' sockets and locks; the package's tmpfiles.d line creates it
# (d /run/wcache 0750 wcache wcache).
SOCKET_DIR = "/run/wcache"
# The configuration file, unless $WCACHED_CONFIG names another.
CONFIG_PATH = "/etc/wcache/wcached.toml"
CONFIG_ENV = "WCACHED_CONFIG"
# The user (and group) the package's unit runs the daemon as (sysusers.d).
DAEMON_USER = "wcache"


def config_path() -> str:
    """The configuration file in effect: ``$WCACHED_CONFIG`` or the package's."""
    return os.environ.get(CONFIG_ENV) or CONFIG_PATH


def read_config_document(path: str) -> dict:
    """The configuration file as parsed TOML, not yet validated (that is
    :func:`wcached.config.load_config`'s); errors name the file."""
    import tomllib

    from wcached.errors import ConfigError

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(path, None, "file not found") from None
    except PermissionError:
        raise ConfigError(path, None, "permission denied reading the file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, None, f"invalid TOML: {e}") from None


def configured_socket_dir(path: str) -> str:
    """``[daemon] socket_dir`` of the configuration file at ``path`` (or the
    default), read without validating the rest: what a client needs to find
    a daemon, at the cost of a TOML parse, not of the daemon's config."""
    from wcached.errors import ConfigError

    daemon = read_config_document(path).get("daemon", {})
    value = daemon.get("socket_dir", SOCKET_DIR) if isinstance(daemon, dict) else SOCKET_DIR
    if not isinstance(value, str):
        raise ConfigError(path, "daemon.socket_dir", f"must be a string, not {value!r}")
    return resolve_socket_dir(value, path)


def resolve_socket_dir(value: str, config_path: str) -> str:
    """A configured socket directory as the daemon and its clients use it: a
    relative one lies beside the configuration file. The one rule for both
    (:func:`wcached.config.load_config` and :func:`configured_socket_dir`)."""
    from pathlib import Path

    from wcached.errors import ConfigError

    if not value:
        raise ConfigError(config_path, "daemon.socket_dir", "must not be empty")
    if os.path.isabs(value):
        return value
    return str((Path(config_path).resolve().parent / value).resolve())
