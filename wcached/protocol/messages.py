"""Every message of the protocol, as msgspec tagged structs.

Versions: a client's hello says the range it speaks (``min_version`` ..
``version``), the daemon answers with the highest version both speak (its
welcome's ``version``) or a ``version_mismatch`` error naming both ranges.
Version 1 had no range: its daemons want ``version == 1`` exactly, so a client
told ``version_mismatch`` by one greets again with ``version = 1``.

Compatibility rules, so that one release's daemon and the next release's
plugin attach (or fall back) in both directions:

- requests other than the hello are decoded strictly: an unknown tag, an
  unknown field or a wrong type is a bad request, never a guess;
- the hello and every reply tolerate fields they do not know: a later release
  may add fields an earlier one can ignore;
- a change an earlier peer must not ignore (a field that changes what a
  tensor entry means) takes a new protocol version, and the daemon leaves it
  out when it speaks an earlier one.
"""

from __future__ import annotations

from typing import Any

import msgspec

from wcached.keys import CacheKey

# What this release speaks: 2 is 1 plus the hello's range; 3 is 2 with an
# attached manifest's tensors sent as runs (Manifest.runs).
PROTOCOL_VERSION = 3
MIN_PROTOCOL_VERSION = 1


class _Msg(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, kw_only=True):
    """A request after the hello, or a daemon <-> worker message: strict."""


class _Tolerant(msgspec.Struct, tag_field="type", kw_only=True):
    """The hello and the replies: unknown fields are ignored."""


# Manifests hold up to ~100k of these: gc=False and tuples keep them out of the
# cyclic garbage collector, which otherwise dominates decoding time.
class SegmentInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    index: int
    nbytes: int
    backend: str  # "host" (sealed memfd) or "cuda" (VMM POSIX fd)
    device: str  # canonical instance id: "cpu0", "GPU-<uuid>"


class TensorInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    name: str
    dtype: str  # torch name: "bfloat16", "float8_e4m3fn", "bool", ...
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    segment: int
    offset: int
    nbytes: int
    kind: str = "param"  # "param" or "buffer"
    alias_of: str | None = None  # tied weight: shares the named tensor's storage
    digest: str = ""  # xxh3-128 hex of the bytes (see Manifest.attrs["digest"]), "" if none


class TensorRun(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """Consecutive manifest entries of one layout at a constant step in one
    segment (the experts of a layer; any single tensor is a run of one), as
    version 3 sends an attached manifest's tensors: a client decodes a list
    of names per run instead of a struct per tensor, and views a run with
    one call. :mod:`wcached.protocol.runs` makes and expands them."""

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    segment: int
    offset: int  # the first entry's; entry k's is offset + k * step
    step: int  # 0 in a run of one
    nbytes: int  # each entry's
    kind: str
    names: list[str]
    digests: list[str] = []  # one per name, or none when no entry has one
    alias_of: str | None = None  # only in a run of one


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    key: CacheKey
    segments: list[SegmentInfo]
    # Clients get a Sequence that expands the runs it arrived as on first use
    # (wcached.protocol.runs.RunEntries); daemons and workers hold lists.
    tensors: list[TensorInfo]
    total_bytes: int
    filled_at: float
    # Loader-specific attributes an engine needs besides tensors.
    attrs: dict[str, str] = {}
    # On the wire to a version-3 client only, in place of ``tensors``.
    runs: list[TensorRun] = []


# -- client -> daemon ---------------------------------------------------------


class Hello(_Tolerant, tag="hello", omit_defaults=True):
    version: int  # the highest version the client speaks
    client: str = ""
    # The lowest; omitted when 1, so that a version-1 daemon, which knows no
    # such field, accepts the hello of a client that falls back to 1.
    min_version: int = 1


class Attach(_Msg, tag="attach"):
    model: str
    expect: dict[str, str | int] = {}


class StatusRequest(_Msg, tag="status"):
    pass


class Release(_Msg, tag="release"):
    model: str


Request = Hello | Attach | StatusRequest | Release


# -- daemon -> client ---------------------------------------------------------


class Welcome(_Tolerant, tag="welcome"):
    version: int  # the version this connection speaks
    instance: str
    device: str
    daemon_version: str
    pid: int


class Attached(_Tolerant, tag="attached"):
    manifest: Manifest
    # The segment fds follow the frame, in SCM_RIGHTS batches (see wire.py).
    fd_count: int


class Mismatch(_Tolerant, tag="mismatch"):
    model: str
    fields: list[str]
    message: str


class ModelStatus(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    state: str  # "ready" or "released"
    loader: str
    bytes: int
    tensors: int
    segments: int
    key: CacheKey
    filled_at: float
    fill_seconds: float
    # "filled" (read from the checkpoint by this daemon process) or
    # "restored" (from systemd's fd store; fill_seconds is the earlier fill's).
    origin: str = "filled"
    # The fill's seconds per phase and the checkpoint bytes it read (what
    # its reading rate is computed over: wcached.loaders.layout.reading_rate).
    phases: dict[str, float] = {}
    read_bytes: int = 0


class ClientStatus(msgspec.Struct, frozen=True, kw_only=True):
    pid: int
    uid: int
    gid: int
    client: str
    models: list[str]
    connected_s: float


class StatusReply(_Tolerant, tag="status_reply"):
    instance: str
    device: str
    backend: str
    state: str
    pid: int
    daemon_version: str
    uptime_s: float
    models: list[ModelStatus]
    clients: list[ClientStatus]
    # The GPU's memory (0 for host memory): what the weights take of it.
    device_memory_bytes: int = 0
    # The GPU's NVML index, or N of cpuN; -1 from a daemon that did not say.
    device_index: int = -1


class Released(_Tolerant, tag="released"):
    model: str
    attached_clients: int


class ErrorReply(_Tolerant, tag="error"):
    code: str
    message: str


Reply = Welcome | Attached | Mismatch | StatusReply | Released | ErrorReply


# -- daemon <-> loader worker (over a socketpair) -------------------------------


class FillJob(_Msg, tag="fill_job"):
    instance: str
    backend: str
    device_index: int
    models: list[dict[str, Any]]  # ModelConfig as builtins


class FillProgress(_Msg, tag="fill_progress"):
    model: str
    done_bytes: int
    total_bytes: int


class ModelFilled(_Msg, tag="model_filled"):
    manifest: Manifest
    fd_count: int
    fill_seconds: float
    # Seconds per phase of the fill, and the checkpoint bytes read in its
    # reading phase (wcached.loaders.layout.READ).
    phases: dict[str, float] = {}
    read_bytes: int = 0


class FillFailed(_Msg, tag="fill_failed"):
    code: str
    message: str


class FillDone(_Msg, tag="fill_done"):
    pass


WorkerMessage = FillJob | FillProgress | ModelFilled | FillFailed | FillDone
