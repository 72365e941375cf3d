"""TOML configuration -> frozen, typed config.

Every mistake is a :class:`~wcached.errors.ConfigError` naming the file, the key
and the problem; ``wcached serve`` turns it into exit status 78 (EX_CONFIG) so
that systemd's ``RestartPreventExitStatus=78`` stops a restart loop.
"""

from __future__ import annotations

import os
import re
import sys
import typing
from pathlib import Path
from typing import Literal

import msgspec

from wcached import defaults
from wcached.device import is_instance_name
from wcached.errors import ConfigError
from wcached.loaders.base import DEFAULT_LOADER, ModelConfig, loader_names, options_for, parse_size

__all__ = ["Config", "ConfigError", "InstanceSettings", "ModelConfig", "load_config", "parse_size"]

MAX_SOCKET_PATH = 107
LONGEST_SOCKET_NAME = "GPU-00000000-0000-0000-0000-000000000000.sock"
MAX_PORT = 65535
_INDEX_RE = re.compile(r"^(?:cpu)?(\d+)$")


class _Table(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    pass


class DaemonConfig(_Table):
    # Where each instance binds <instance id>.sock and keeps its lock; it must
    # belong to root or the daemon's user and be writable by no one else.
    socket_dir: str = defaults.SOCKET_DIR
    # Users whose engines may attach, besides root and the daemon's own user.
    allowed_users: list[str] = []
    # Groups whose members' engines may attach (the package's is "wcache").
    allowed_groups: list[str] = []
    # Deadline for a hello after connect, and for the rest of any frame once its
    # first byte arrived. Idle attached clients are leases and never time out.
    connection_timeout_s: float = 10.0
    # Connections served at once; more get a "busy" reply (engines fall back
    # to loading from disk).
    max_clients: int = 256
    # Interpreter that runs the loader worker (a virtualenv holding torch/vLLM);
    # empty means the daemon's own interpreter.
    worker_python: str = ""
    # The lowest priority logged (to the journal under the unit).
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # node-exporter's textfile collector directory: each instance keeps
    # <metrics_dir>/wcached-<instance id>.prom there. Empty: none written.
    metrics_dir: str = ""
    # /metrics over HTTP on 127.0.0.1:<metrics_port + device index>, so that
    # one line serves every GPU of a host; 0: off.
    metrics_port: int = 0


class InstanceConfig(_Table):
    # The [[model]] names this instance fills and serves (unset: every model).
    models: list[str] | None = None
    # Replaces [daemon] allowed_users for this instance.
    allowed_users: list[str] | None = None
    # Replaces [daemon] allowed_groups for this instance.
    allowed_groups: list[str] | None = None
    # Replaces [daemon] connection_timeout_s for this instance.
    connection_timeout_s: float | None = None
    # Replaces [daemon] max_clients for this instance.
    max_clients: int | None = None
    # This instance's port exactly (no index added); 0: no HTTP endpoint here.
    metrics_port: int | None = None


class Config(_Table):
    daemon: DaemonConfig = DaemonConfig()
    # Each [[model]] table, as its loader's options struct (tagged by
    # `loader`); parsed one by one, see _parse_models.
    model: list[ModelConfig] = []
    instance: dict[str, InstanceConfig] = {}
    # Where it was read from; not a TOML key.
    source: str = ""


class AccessLists(msgspec.Struct, frozen=True):
    """Who may attach to an instance, and the keys each list came from (for
    errors about a name that does not resolve). Empty: the daemon's own user
    and root alone."""

    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    users_key: str = "daemon.allowed_users"
    groups_key: str = "daemon.allowed_groups"


class InstanceSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What one instance runs with, daemon defaults overlaid by its table."""

    instance_id: str
    socket_dir: str
    models: tuple[ModelConfig, ...]
    # Who may attach, from the instance's table or [daemon] (access_lists).
    access: AccessLists
    connection_timeout_s: float
    max_clients: int
    worker_python: str
    log_level: str
    metrics_dir: str = ""
    # Resolved: the daemon's base plus the device index, or the instance's own.
    metrics_port: int = 0
    # The key metrics_port came from, for errors about the port (in use).
    metrics_port_key: str = "daemon.metrics_port"
    # The config file this came from (for errors that name it).
    source: str = ""

    @property
    def socket_path(self) -> str:
        return os.path.join(self.socket_dir, f"{self.instance_id}.sock")

    @property
    def worker_interpreter(self) -> str:
        """The Python the loader worker runs, and whose environment a fill's
        provenance records: ``worker_python``, else the daemon's own."""
        return self.worker_python or sys.executable

    @property
    def lock_path(self) -> str:
        return os.path.join(self.socket_dir, f"{self.instance_id}.lock")

    @property
    def metrics_path(self) -> str:
        """The textfile collector's file of this instance ("" without metrics_dir)."""
        if not self.metrics_dir:
            return ""
        return os.path.join(self.metrics_dir, f"wcached-{self.instance_id}.prom")


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Read and validate a config file."""
    path = str(path or defaults.config_path())
    return parse_config(defaults.read_config_document(path), path)


def parse_config(raw: dict, path: str) -> Config:
    """Validate an already-parsed TOML document."""
    if "source" in raw:
        raise ConfigError(path, "source", "unknown key")
    raw = dict(raw)
    models = _parse_models(raw.pop("model", []), path)
    try:
        cfg = msgspec.convert(raw, Config)
    except msgspec.ValidationError as e:
        key, problem = _split_validation_error(str(e))
        if key and key.startswith("instance[...]"):
            key = _instance_key(raw.get("instance", {}), key)
        raise ConfigError(path, key, problem) from None
    base = Path(path).resolve().parent
    models = [
        m if _is_hub_id(m, base) else msgspec.structs.replace(m, path=str((base / m.path).resolve()))
        for m in models
    ]
    daemon = cfg.daemon
    daemon = msgspec.structs.replace(daemon, socket_dir=defaults.resolve_socket_dir(daemon.socket_dir, path))
    cfg = msgspec.structs.replace(cfg, daemon=daemon, model=models, source=path)
    _check(cfg, path)
    return cfg


def _parse_models(tables: object, path: str) -> list[ModelConfig]:
    """Each ``[[model]]`` table as the options struct of its ``loader``."""
    if not isinstance(tables, list):
        raise ConfigError(path, "model", "must be an array of tables ([[model]])")
    models = []
    for i, table in enumerate(tables):
        key = f"model[{i}]"
        if not isinstance(table, dict):
            raise ConfigError(path, key, "must be a table")
        loader = table.get("loader", DEFAULT_LOADER)
        if not isinstance(loader, str) or loader not in loader_names():
            known = ", ".join(sorted(loader_names()))
            raise ConfigError(path, f"{key}.loader", f"unknown loader {loader!r} (known: {known})")
        try:
            options = options_for(loader)
        except Exception as e:  # a loader plugin that does not import or is no loader
            raise ConfigError(path, f"{key}.loader", f"loader {loader!r} cannot be used: {e}") from None
        try:
            model = msgspec.convert({**table, "loader": loader}, options)
        except msgspec.ValidationError as e:
            sub, problem = _split_validation_error(str(e), options)
            if problem == "unknown key" and sub:
                problem = _unknown_model_key(sub, loader)
            raise ConfigError(path, f"{key}.{sub}" if sub else key, problem) from None
        try:
            models.append(model.parsed())
        except ConfigError as e:
            raise ConfigError(path, f"{key}.{e.key}", e.problem) from None
    return models


def _unknown_model_key(field: str, loader: str) -> str:
    owners = []
    for name in sorted(loader_names() - {loader}):
        try:
            if field in options_for(name).__struct_fields__:
                owners.append(name)
        except Exception:  # another, broken loader says nothing here
            continue
    problem = f'unknown key for loader = "{loader}"'
    if owners:
        problem += f"; it is a key of {' and '.join(f'loader = {n!r}' for n in owners)}"
    return problem.replace("'", '"')


def _is_hub_id(model: ModelConfig, base: Path) -> bool:
    """``org/name`` that is no path beside the config, for a loader that
    resolves hub ids (vLLM); anything else is a path."""
    # A relative path whose first directory exists beside the config is a
    # path, even while its checkpoint is not there yet (a mount coming up).
    return (
        model.accepts_remote_path
        and re.fullmatch(r"[\w.-]+/[\w.-]+", model.path) is not None
        and not model.path.startswith(".")
        and not (base / model.path.split("/")[0]).exists()
    )


def _split_validation_error(message: str, table: type | None = None) -> tuple[str | None, str]:
    # msgspec: "Expected `int`, got `str` - at `$.model[0].alignment`"
    #          "Object contains unknown field `foo` - at `$.daemon`"
    problem, sep, where = message.partition(" - at `")
    key = where.rstrip("`").removeprefix("$").lstrip(".") if sep else None
    unknown = re.match(r"Object contains unknown field `(.+)`", problem)
    if unknown:
        key = f"{key}.{unknown.group(1)}" if key else unknown.group(1)
        problem = "unknown key"
    elif problem.startswith("Object missing required field"):
        field = re.search(r"`(.+)`", problem)
        if field:
            key = f"{key}.{field.group(1)}" if key else field.group(1)
        problem = "required key is missing"
    elif problem.startswith("Invalid enum value") and key:
        choices = _literal_choices(key.rsplit(".", 1)[-1], table)
        if choices:
            problem = f"{problem}; expected one of {', '.join(map(repr, choices))}"
    return key or None, problem


def _instance_key(tables: dict, key: str) -> str:
    """msgspec writes dict keys as ``[...]``: find which instance table failed."""
    for name, table in tables.items():
        try:
            msgspec.convert(table, InstanceConfig)
        except msgspec.ValidationError:
            return key.replace("instance[...]", f"instance.{name}", 1)
    return key


def _literal_choices(field: str, table: type | None) -> tuple[str, ...]:
    for struct in (table or DaemonConfig, DaemonConfig):
        hint = typing.get_type_hints(struct).get(field)
        if hint is not None and typing.get_origin(hint) is Literal:
            return typing.get_args(hint)
    return ()


def _check(cfg: Config, path: str) -> None:
    d = cfg.daemon
    if d.connection_timeout_s <= 0:
        raise ConfigError(path, "daemon.connection_timeout_s", "must be > 0")
    if d.max_clients < 1:
        raise ConfigError(path, "daemon.max_clients", "must be >= 1")
    if d.metrics_dir and not os.path.isabs(d.metrics_dir):
        # Not resolved against the config's directory like socket_dir: a
        # textfile collector directory is a system path, and a relative one
        # is more likely a typo than a wish.
        raise ConfigError(path, "daemon.metrics_dir", f"must be an absolute path, not {d.metrics_dir!r}")
    if d.metrics_port != 0 and not 1 <= d.metrics_port <= MAX_PORT:
        raise ConfigError(path, "daemon.metrics_port", f"{d.metrics_port} is outside 1..{MAX_PORT} (0: off)")
    seen: set[str] = set()
    for i, m in enumerate(cfg.model):
        key = f"model[{i}]"
        for sub, problem in m.problems():
            raise ConfigError(path, f"{key}.{sub}", problem)
        if m.name in seen:
            raise ConfigError(path, f"{key}.name", f"duplicate model name {m.name!r}")
        seen.add(m.name)
    for name, inst in cfg.instance.items():
        if not is_instance_name(name):
            # A table no instance would ever read would silently not apply.
            raise ConfigError(
                path,
                f"instance.{name}",
                "not an instance name: use cpuN, a GPU index such as 0, or a GPU UUID such as GPU-8d3c...",
            )
        for j, model_name in enumerate(inst.models or []):
            if model_name not in seen:
                raise ConfigError(path, f"instance.{name}.models[{j}]", f"no [[model]] named {model_name!r}")
        if inst.connection_timeout_s is not None and inst.connection_timeout_s <= 0:
            raise ConfigError(path, f"instance.{name}.connection_timeout_s", "must be > 0")
        if inst.max_clients is not None and inst.max_clients < 1:
            raise ConfigError(path, f"instance.{name}.max_clients", "must be >= 1")
        port = inst.metrics_port
        if port is not None and port != 0 and not 1 <= port <= MAX_PORT:
            raise ConfigError(
                path, f"instance.{name}.metrics_port", f"{port} is outside 1..{MAX_PORT} (0: off)"
            )


def check_socket_path(cfg: Config, name: str = LONGEST_SOCKET_NAME) -> None:
    """sun_path holds 107 bytes and a NUL: a longer socket path cannot be
    bound, so it is a configuration error (by default for the longest name an
    instance can have, a GPU UUID's)."""
    length = len(os.fsencode(os.path.join(cfg.daemon.socket_dir, name)))
    if length > MAX_SOCKET_PATH:
        raise ConfigError(
            cfg.source,
            "daemon.socket_dir",
            f"{cfg.daemon.socket_dir!r} is too long: the socket {name} in it would take {length} bytes, "
            f"Unix sockets allow {MAX_SOCKET_PATH}",
        )


def access_lists(cfg: Config, table_name: str) -> AccessLists:
    """The lists of an instance matched by the table ``table_name`` ("": by
    none, [daemon]'s): each the table's where it sets one, else [daemon]'s, under
    the key that set it."""
    d = cfg.daemon
    table = cfg.instance[table_name] if table_name else InstanceConfig()
    users, users_key = d.allowed_users, "daemon.allowed_users"
    if table.allowed_users is not None:
        users, users_key = table.allowed_users, f"instance.{table_name}.allowed_users"
    groups, groups_key = d.allowed_groups, "daemon.allowed_groups"
    if table.allowed_groups is not None:
        groups, groups_key = table.allowed_groups, f"instance.{table_name}.allowed_groups"
    return AccessLists(tuple(users), tuple(groups), users_key, groups_key)


def instance_settings(
    cfg: Config, instance_id: str, names: tuple[str, ...] = (), index: int | None = None
) -> InstanceSettings:
    """Overlay the ``[instance."<id>"]`` table matching the canonical id or any
    other name the instance goes by (a GPU index next to its UUID).

    ``index``: the device's index (cpuN -> N, a GPU's NVML index), which
    ``daemon.metrics_port`` is offset by; without it, taken from a ``cpuN`` or
    index name (0 for a bare UUID, whose index only NVML knows)."""
    table = InstanceConfig()
    table_name = ""
    matching = list(dict.fromkeys(k for k in (instance_id, *names) if k in cfg.instance))
    if len(matching) > 1:
        raise ConfigError(
            cfg.source,
            f"instance.{matching[1]}",
            f"instance tables {matching[0]!r} and {matching[1]!r} both name {instance_id}: keep one",
        )
    if matching:
        table_name = matching[0]
        table = cfg.instance[table_name]
    if table.models is None:
        models = tuple(cfg.model)
    else:
        by_name = {m.name: m for m in cfg.model}
        models = tuple(by_name[n] for n in table.models)
    d = cfg.daemon
    check_socket_path(cfg, f"{instance_id}.sock")
    if table.metrics_port is not None:
        metrics_port, port_key = table.metrics_port, f"instance.{table_name}.metrics_port"
    else:
        metrics_port, port_key = d.metrics_port, "daemon.metrics_port"
        if metrics_port:
            if index is None:
                index = _device_index(instance_id, names)
            metrics_port += index
            if metrics_port > MAX_PORT:
                raise ConfigError(
                    cfg.source,
                    port_key,
                    f"{d.metrics_port} + device index {index} of {instance_id} = {metrics_port} "
                    f"is over {MAX_PORT}: lower it, or give this instance a metrics_port of its own",
                )
    return InstanceSettings(
        instance_id=instance_id,
        socket_dir=d.socket_dir,
        models=models,
        access=access_lists(cfg, table_name),
        connection_timeout_s=table.connection_timeout_s or d.connection_timeout_s,
        max_clients=table.max_clients or d.max_clients,
        worker_python=d.worker_python,
        log_level=d.log_level,
        metrics_dir=d.metrics_dir,
        metrics_port=metrics_port,
        metrics_port_key=port_key,
        source=cfg.source,
    )


def _device_index(instance_id: str, names: tuple[str, ...]) -> int:
    for name in (instance_id, *names):
        m = _INDEX_RE.match(name)
        if m:
            return int(m.group(1))
    return 0
