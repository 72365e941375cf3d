"""Every message of protocol v1, as msgspec tagged structs.

Decoding is strict: an unknown ``type`` tag, an unknown field or a wrong type is
a protocol error, never a guess. Bump :data:`PROTOCOL_VERSION` for any change a
v1 peer would reject.
"""

from __future__ import annotations

from typing import Any

import msgspec

from wcached.keys import CacheKey

PROTOCOL_VERSION = 1


class _Msg(msgspec.Struct, tag_field="type", forbid_unknown_fields=True, kw_only=True):
    pass


# Manifests hold up to ~100k of these: gc=False and tuples keep them out of the
# cyclic garbage collector, which otherwise dominates decoding time.
class SegmentInfo(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, gc=False):
    index: int
    nbytes: int
    backend: str  # "host" (sealed memfd) or "cuda" (VMM POSIX fd)
    device: str  # canonical instance id: "cpu0", "GPU-<uuid>"


class TensorInfo(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, gc=False):
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


class Manifest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model: str
    key: CacheKey
    segments: list[SegmentInfo]
    tensors: list[TensorInfo]
    total_bytes: int
    filled_at: float
    # Loader-specific attributes an engine needs besides tensors.
    attrs: dict[str, str] = {}


# -- client -> daemon ---------------------------------------------------------


class Hello(_Msg, tag="hello"):
    version: int
    client: str = ""


class Attach(_Msg, tag="attach"):
    model: str
    expect: dict[str, str | int] = {}


class StatusRequest(_Msg, tag="status"):
    pass


class Release(_Msg, tag="release"):
    model: str


Request = Hello | Attach | StatusRequest | Release


# -- daemon -> client ---------------------------------------------------------


class Welcome(_Msg, tag="welcome"):
    version: int
    instance: str
    device: str
    daemon_version: str
    pid: int


class Attached(_Msg, tag="attached"):
    manifest: Manifest
    # The segment fds follow the frame, in SCM_RIGHTS batches (see wire.py).
    fd_count: int


class Mismatch(_Msg, tag="mismatch"):
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


class ClientStatus(msgspec.Struct, frozen=True, kw_only=True):
    pid: int
    uid: int
    gid: int
    client: str
    models: list[str]
    connected_s: float


class StatusReply(_Msg, tag="status_reply"):
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


class Released(_Msg, tag="released"):
    model: str
    attached_clients: int


class ErrorReply(_Msg, tag="error"):
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


class FillFailed(_Msg, tag="fill_failed"):
    code: str
    message: str


class FillDone(_Msg, tag="fill_done"):
    pass


WorkerMessage = FillJob | FillProgress | ModelFilled | FillFailed | FillDone
