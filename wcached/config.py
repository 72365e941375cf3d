"""TOML configuration -> frozen, typed config.

Every mistake is a :class:`~wcached.errors.ConfigError` naming the file, the key
and the problem; ``wcached serve`` turns it into exit status 78 (EX_CONFIG) so
that systemd's ``RestartPreventExitStatus=78`` stops a restart loop.
"""

from __future__ import annotations

import os
import re
import tomllib
import typing
from pathlib import Path
from typing import Literal

import msgspec

from wcached.errors import ConfigError

DEFAULT_CONFIG_PATH = "/etc/wcache/wcached.toml"
MAX_SOCKET_PATH = 107
LONGEST_SOCKET_NAME = "GPU-00000000-0000-0000-0000-000000000000.sock"
CONFIG_ENV = "WCACHED_CONFIG"

_SIZE_RE = re.compile(r"^\s*(\d+)\s*(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)?\s*$")
_SIZE_UNITS = {
    None: 1,
    "B": 1,
    "KiB": 1 << 10,
    "MiB": 1 << 20,
    "GiB": 1 << 30,
    "TiB": 1 << 40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
}

CastDtype = Literal["auto", "float16", "bfloat16", "float32"]


class _Table(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    pass


class DaemonConfig(_Table):
    socket_dir: str = "/run/wcache"
    allowed_users: list[str] = []
    allowed_groups: list[str] = []
    # Deadline for a hello after connect, and for the rest of any frame once its
    # first byte arrived. Idle attached clients are leases and never time out.
    connection_timeout_s: float = 10.0
    max_clients: int = 256
    # Interpreter that runs the loader worker (a virtualenv holding torch/vLLM);
    # empty means the daemon's own interpreter.
    worker_python: str = ""
    log_level: Literal["debug", "info", "warning", "error"] = "info"


class ModelConfig(_Table):
    name: str
    path: str
    loader: str = "safetensors"
    # "auto" keeps the checkpoint's dtypes; a float dtype casts floating tensors.
    dtype: CastDtype = "auto"
    alignment: int = 256
    segment_size: int | str = "4GiB"
    # "header": names, sizes and safetensors headers; "content": hash every byte.
    fingerprint: Literal["header", "content"] = "header"
    digest: bool = True
    # Threads reading the checkpoint; "auto" = one per core, at most 16.
    read_threads: int | Literal["auto"] = "auto"
    # Tied weights the checkpoint stores once: alias name -> stored tensor name.
    aliases: dict[str, str] = {}
    # loader = "vllm": the parallel layout the engines run with; each instance
    # serving the model is one rank (cpuN -> N unless `ranks` says otherwise),
    # and all of them meet at `rendezvous` (tcp://host:port) while filling.
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    rendezvous: str = ""
    ranks: dict[str, int] = {}
    # A fill that makes no progress for this long fails (exit 75, retried by
    # the unit), naming why: a tensor-parallel rank that never joined, a
    # checkpoint on a hung network filesystem.
    fill_timeout_s: float = 900.0
    # Further vLLM EngineArgs that change weights (quantization, revision,
    # max_model_len, trust_remote_code, ...).
    engine_args: dict[str, str | int | float | bool] = {}

    @property
    def segment_bytes(self) -> int:
        return parse_size(self.segment_size, "segment_size")

    @property
    def reader_count(self) -> int:
        if self.read_threads == "auto":
            return max(1, min(16, os.cpu_count() or 1))
        return self.read_threads


class InstanceConfig(_Table):
    models: list[str] | None = None
    allowed_users: list[str] | None = None
    allowed_groups: list[str] | None = None
    connection_timeout_s: float | None = None
    max_clients: int | None = None


class Config(_Table):
    daemon: DaemonConfig = DaemonConfig()
    model: list[ModelConfig] = []
    instance: dict[str, InstanceConfig] = {}
    # Where it was read from; not a TOML key.
    source: str = ""


class InstanceSettings(msgspec.Struct, frozen=True, kw_only=True):
    """What one instance runs with, daemon defaults overlaid by its table."""

    instance_id: str
    socket_dir: str
    models: tuple[ModelConfig, ...]
    allowed_users: tuple[str, ...]
    allowed_groups: tuple[str, ...]
    connection_timeout_s: float
    max_clients: int
    worker_python: str
    log_level: str
    # The config file this came from (for errors that name it).
    source: str = ""

    @property
    def socket_path(self) -> str:
        return os.path.join(self.socket_dir, f"{self.instance_id}.sock")

    @property
    def lock_path(self) -> str:
        return os.path.join(self.socket_dir, f"{self.instance_id}.lock")


def parse_size(value: int | str, key: str, path: str | None = None) -> int:
    """``4294967296`` or ``"4GiB"`` -> bytes."""
    if isinstance(value, int):
        if value <= 0:
            raise ConfigError(path, key, f"must be a positive size, got {value}")
        return value
    m = _SIZE_RE.match(value)
    if not m:
        raise ConfigError(path, key, f"not a size: {value!r} (write e.g. 4GiB or 512MiB)")
    size = int(m.group(1)) * _SIZE_UNITS[m.group(2)]
    if size <= 0:
        raise ConfigError(path, key, f"must be a positive size, got {value!r}")
    return size


def default_config_path() -> str:
    return os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG_PATH


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Read and validate a config file."""
    path = str(path or default_config_path())
    try:
        with open(path, "rb") as f:
            raw = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(path, None, "file not found") from None
    except PermissionError:
        raise ConfigError(path, None, "permission denied reading the file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(path, None, f"invalid TOML: {e}") from None
    return parse_config(raw, path)


def parse_config(raw: dict, path: str) -> Config:
    """Validate an already-parsed TOML document."""
    if "source" in raw:
        raise ConfigError(path, "source", "unknown key")
    try:
        cfg = msgspec.convert(raw, Config)
    except msgspec.ValidationError as e:
        key, problem = _split_validation_error(str(e))
        if key and key.startswith("instance[...]"):
            key = _instance_key(raw.get("instance", {}), key)
        raise ConfigError(path, key, problem) from None
    base = Path(path).resolve().parent
    models = [msgspec.structs.replace(m, path=str((base / m.path).resolve())) for m in cfg.model]
    daemon = cfg.daemon
    if daemon.socket_dir and not os.path.isabs(daemon.socket_dir):
        daemon = msgspec.structs.replace(daemon, socket_dir=str((base / daemon.socket_dir).resolve()))
    cfg = msgspec.structs.replace(cfg, daemon=daemon, model=models, source=path)
    _check(cfg, path)
    return cfg


def _split_validation_error(message: str) -> tuple[str | None, str]:
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
        choices = _literal_choices(key.rsplit(".", 1)[-1])
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


def _literal_choices(field: str) -> tuple[str, ...]:
    for table in (DaemonConfig, ModelConfig):
        hint = typing.get_type_hints(table).get(field)
        if hint is not None and typing.get_origin(hint) is Literal:
            return typing.get_args(hint)
    return ()


def _check(cfg: Config, path: str) -> None:
    from wcached.loaders import loader_names

    d = cfg.daemon
    if not d.socket_dir:
        raise ConfigError(path, "daemon.socket_dir", "must not be empty")
    if d.connection_timeout_s <= 0:
        raise ConfigError(path, "daemon.connection_timeout_s", "must be > 0")
    if d.max_clients < 1:
        raise ConfigError(path, "daemon.max_clients", "must be >= 1")
    seen: set[str] = set()
    for i, m in enumerate(cfg.model):
        key = f"model[{i}]"
        if not re.fullmatch(r"[A-Za-z0-9._:/-]{1,128}", m.name):
            raise ConfigError(path, f"{key}.name", f"invalid model name {m.name!r}")
        if m.name in seen:
            raise ConfigError(path, f"{key}.name", f"duplicate model name {m.name!r}")
        seen.add(m.name)
        if m.loader not in loader_names():
            raise ConfigError(
                path,
                f"{key}.loader",
                f"unknown loader {m.loader!r} (known: {', '.join(sorted(loader_names()))})",
            )
        a = m.alignment
        if a < 1 or a & (a - 1) or a > (2 << 20):
            raise ConfigError(path, f"{key}.alignment", f"must be a power of two <= 2MiB, got {a}")
        parse_size(m.segment_size, f"{key}.segment_size", path)
        if m.tensor_parallel_size < 1 or m.pipeline_parallel_size < 1:
            raise ConfigError(path, f"{key}.tensor_parallel_size", "parallel sizes must be >= 1")
        if m.tensor_parallel_size * m.pipeline_parallel_size > 1 and m.loader != "vllm":
            raise ConfigError(path, f"{key}.tensor_parallel_size", 'parallel layouts need loader = "vllm"')
        if m.rendezvous and not re.fullmatch(r"tcp://[^:/]+:\d+", m.rendezvous):
            raise ConfigError(path, f"{key}.rendezvous", f"expected tcp://host:port, got {m.rendezvous!r}")
        if m.rendezvous and not re.fullmatch(r"tcp://(127\.[0-9.]+|localhost):\d+", m.rendezvous):
            # The ranks are instances on this host, and the unit allows
            # loopback only: another address would hang the fill.
            raise ConfigError(
                path,
                f"{key}.rendezvous",
                f"must be a loopback address (tcp://127.0.0.1:PORT), got {m.rendezvous!r}",
            )
        world = m.tensor_parallel_size * m.pipeline_parallel_size
        for inst, rank in m.ranks.items():
            if not 0 <= rank < world:
                raise ConfigError(
                    path, f"{key}.ranks.{inst}", f"rank {rank} is outside 0..{world - 1} (tp x pp = {world})"
                )
        if len(set(m.ranks.values())) != len(m.ranks):
            raise ConfigError(path, f"{key}.ranks", "two instances have the same rank")
        if m.read_threads != "auto" and m.read_threads < 1:
            raise ConfigError(path, f"{key}.read_threads", "must be >= 1")
        if m.fill_timeout_s <= 0:
            raise ConfigError(path, f"{key}.fill_timeout_s", "must be > 0")
    for name, inst in cfg.instance.items():
        for j, model_name in enumerate(inst.models or []):
            if model_name not in seen:
                raise ConfigError(path, f"instance.{name}.models[{j}]", f"no [[model]] named {model_name!r}")
        if inst.connection_timeout_s is not None and inst.connection_timeout_s <= 0:
            raise ConfigError(path, f"instance.{name}.connection_timeout_s", "must be > 0")
        if inst.max_clients is not None and inst.max_clients < 1:
            raise ConfigError(path, f"instance.{name}.max_clients", "must be >= 1")


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


def instance_settings(cfg: Config, instance_id: str, names: tuple[str, ...] = ()) -> InstanceSettings:
    """Overlay the ``[instance."<id>"]`` table matching the canonical id or any
    other name the instance goes by (a GPU index next to its UUID)."""
    table = InstanceConfig()
    for key in (instance_id, *names):
        if key in cfg.instance:
            table = cfg.instance[key]
            break
    if table.models is None:
        models = tuple(cfg.model)
    else:
        by_name = {m.name: m for m in cfg.model}
        models = tuple(by_name[n] for n in table.models)
    d = cfg.daemon
    check_socket_path(cfg, f"{instance_id}.sock")
    return InstanceSettings(
        instance_id=instance_id,
        socket_dir=d.socket_dir,
        models=models,
        allowed_users=tuple(table.allowed_users if table.allowed_users is not None else d.allowed_users),
        allowed_groups=tuple(table.allowed_groups if table.allowed_groups is not None else d.allowed_groups),
        connection_timeout_s=table.connection_timeout_s or d.connection_timeout_s,
        max_clients=table.max_clients or d.max_clients,
        worker_python=d.worker_python,
        log_level=d.log_level,
        source=cfg.source,
    )
