"""The loader contract, and how loaders are found.

A loader is a plugin named in the ``wcached.loaders`` entry-point group (the
daemon and the loader worker look it up the same way). The object an entry
point names provides:

- ``name`` and ``options``: its ``[[model]]`` table as a msgspec struct, a
  subclass of :class:`ModelConfig` tagged by ``loader``; the config file's
  validation, ``check-config`` and the configuration reference all come from
  it;
- ``key(...)``: the one function that says what identifies this loader's
  cached weights. The fill calls it for the key it stores, and an engine-side
  integration calls the same function with its own configuration for the key
  it expects, so the two cannot drift apart;
- ``fill(model, backend, instance, progress)``: runs in the loader worker,
  returns the :class:`~wcached.loaders.layout.FilledModel`, and calls
  ``progress(done_bytes, total_bytes)`` as it reads (the daemon's status
  line, progress bar and stall detection come from it);
- ``environment(model, python)``: what a fill depended on besides its table
  and checkpoint (the vLLM release), so that a restore after a restart can
  tell a stale fill; :class:`EnvironmentUnknown` when it cannot be told (the
  fill is then neither stored nor restored).

The module an entry point names must import without torch or vLLM: the daemon
imports it to validate its config. Heavy imports belong inside ``fill``.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

import msgspec

from wcached.dtypes import BY_TORCH_NAME, Dtype
from wcached.errors import ConfigError

if TYPE_CHECKING:
    from wcached.device import Device
    from wcached.keys import CacheKey
    from wcached.loaders.layout import FilledModel
    from wcached.memory.base import MemoryBackend, ProgressFn

ENTRY_POINT_GROUP = "wcached.loaders"
DEFAULT_LOADER = "safetensors"
# The loaders this package ships, also declared as entry points in
# pyproject.toml: found even where the package runs without its metadata
# (the .deb's /usr/lib/wcached).
BUILTIN_LOADERS = {
    "safetensors": "wcached.loaders.safetensors:LOADER",
    "vllm": "wcached.loaders.vllm:LOADER",
}

CastDtype = Literal["auto", "float16", "bfloat16", "float32"]

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


def parse_size(value: int | str, key: str) -> int:
    """``4294967296`` or ``"4GiB"`` -> bytes; ConfigError naming ``key`` (the
    config file adds itself: see ModelConfig.problems)."""
    if isinstance(value, int):
        if value <= 0:
            raise ConfigError(None, key, f"must be a positive size, got {value}")
        return value
    m = _SIZE_RE.match(value)
    if not m:
        raise ConfigError(None, key, f"not a size: {value!r} (write e.g. 4GiB or 512MiB)")
    size = int(m.group(1)) * _SIZE_UNITS[m.group(2)]
    if size <= 0:
        raise ConfigError(None, key, f"must be a positive size, got {value!r}")
    return size


class EnvironmentUnknown(Exception):
    """A loader could not tell what its fill depends on."""


class ModelConfig(
    msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True, tag_field="loader", tag=True
):
    """What every ``[[model]]`` table has, whichever loader fills it.

    Each loader's options subclass this with ``tag="<loader name>"``; the
    ``loader`` key of a table picks the subclass.
    """

    # What engines attach by (letters, digits and . _ : / -, at most 128).
    name: str
    # A checkpoint directory or file (relative paths are relative to the
    # config file).
    path: str
    # "auto" keeps the checkpoint's dtypes; a float dtype casts floating tensors.
    dtype: CastDtype = "auto"
    # Every tensor starts at a multiple of this many bytes (a power of two).
    alignment: int = 256
    # Device memory is allocated in segments of this size ("4GiB", "512MiB");
    # a tensor larger than it gets a segment of its own. Each segment is one
    # fd in systemd's fd store (FileDescriptorStoreMax=, 4096 in the unit),
    # so a model needs size / segment_size + 1 of them to survive a restart
    # (a vLLM fill built in place: 1 GiB chunks, and one of its own for each
    # tensor of half a chunk or more: 15 for an 8B Llama, ~141 for a 70B).
    # (Parsed to bytes when the config is read: see parsed().)
    segment_size: int | str = "4GiB"
    # How the cache key identifies the checkpoint: "header" hashes file
    # names, sizes and headers; "content" hashes every byte.
    fingerprint: Literal["header", "content"] = "header"
    # Record a digest of every tensor (for `wcached verify`): xxh3-128 of host
    # memory, wmix128 computed on the GPU for GPU memory (wcached.tensor_digest).
    digest: bool = True
    # Threads reading the checkpoint; "auto" = one per core, at most 16
    # (at most 12 filling a GPU: MemoryBackend.auto_readers).
    read_threads: int | Literal["auto"] = "auto"
    # A fill that makes no progress for this long fails (exit 75, retried by
    # the unit), naming why.
    fill_timeout_s: float = 900.0

    # A hub id (not a local path) is allowed: the loader resolves it.
    accepts_remote_path: ClassVar[bool] = False

    @property
    def loader(self) -> str:
        return type(self).__struct_config__.tag  # type: ignore[return-value]

    @property
    def segment_bytes(self) -> int:
        return parse_size(self.segment_size, "segment_size")

    def served_dtype(self, stored: Dtype) -> Dtype:
        """A stored tensor's dtype as served: ``dtype`` casts floating
        tensors; "auto", fp8 and integers keep the checkpoint's."""
        if self.dtype == "auto" or not stored.castable:
            return stored
        return BY_TORCH_NAME[self.dtype]

    def parsed(self) -> ModelConfig:
        """This table with its sizes as integers: the one form that is
        validated, sent to the worker, stored and compared, so that "4GiB"
        and "4096MiB" are the same setting. Raises ConfigError (key only)."""
        size = parse_size(self.segment_size, "segment_size")
        return self if size == self.segment_size else msgspec.structs.replace(self, segment_size=size)

    def reader_count(self, most: int = 16) -> int:
        """Reader threads for a fill: ``read_threads``, or for "auto" one per
        core and at most ``most`` (the backend's ``auto_readers``)."""
        if self.read_threads == "auto":
            return max(1, min(most, os.cpu_count() or 1))
        return self.read_threads

    def problems(self) -> list[tuple[str, str]]:
        """(key, problem) for every invalid setting; subclasses add theirs."""
        out: list[tuple[str, str]] = []
        if not re.fullmatch(r"[A-Za-z0-9._:/-]{1,128}", self.name):
            out.append(("name", f"invalid model name {self.name!r}"))
        a = self.alignment
        if a < 1 or a & (a - 1) or a > (2 << 20):
            out.append(("alignment", f"must be a power of two <= 2MiB, got {a}"))
        try:
            parse_size(self.segment_size, "segment_size")
        except ConfigError as e:
            out.append(("segment_size", e.problem))
        if self.read_threads != "auto" and self.read_threads < 1:
            out.append(("read_threads", "must be >= 1"))
        if self.fill_timeout_s <= 0:
            out.append(("fill_timeout_s", "must be > 0"))
        return out

    def worker_group(self) -> tuple:
        """Models of one instance whose groups are equal fill in one loader
        worker; others each in a worker of their own (a process can hold
        only one torch.distributed world, for instance)."""
        return ()

    def for_device(self, device: Device) -> ModelConfig:
        """This table as the worker of ``device``'s instance needs it
        (instance names written the operator's way made canonical)."""
        return self

    def stall_hint(self) -> str:
        """The likely reason when this model's fill stops progressing."""
        return f"a checkpoint read that hangs (a network filesystem?) at {self.path}?"


class Loader(Protocol):
    name: str
    options: type[ModelConfig]

    def key(self, *args: Any, **kwargs: Any) -> CacheKey: ...

    def fill(
        self, model: ModelConfig, backend: MemoryBackend, instance: str, progress: ProgressFn
    ) -> FilledModel: ...

    def environment(self, model: ModelConfig, python: str) -> str: ...


@functools.cache
def _targets() -> dict[str, str]:
    targets = dict(BUILTIN_LOADERS)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        targets[ep.name] = ep.value
    return targets


def loader_names() -> frozenset[str]:
    return frozenset(_targets())


@functools.cache
def get_loader(name: str) -> Loader:
    """The plugin object of loader ``name`` (imported on first use)."""
    target = _targets().get(name)
    if target is None:
        raise KeyError(name)
    module_name, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if obj.name != name or not (isinstance(obj.options, type) and issubclass(obj.options, ModelConfig)):
        raise TypeError(f"entry point {name} = {target!r} is not a wcached loader")
    return obj


def options_for(name: str) -> type[ModelConfig]:
    return get_loader(name).options


def model_from_builtins(raw: dict[str, Any]) -> ModelConfig:
    """A ``[[model]]`` table sent or stored as builtins (``loader`` tag
    included) back as its loader's options struct, sizes parsed."""
    return msgspec.convert(raw, options_for(raw.get("loader", DEFAULT_LOADER))).parsed()
