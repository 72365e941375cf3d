"""Exception hierarchy with stable wire codes.

Every error the daemon can report to a client carries a ``code`` that is part of
protocol v1: clients map it back to the same class with :func:`error_for_code`,
so an engine can tell "the daemon is not there" from "the daemon holds another
model" without parsing messages.
"""

from __future__ import annotations

import os

# The statuses and what each means: wcached.exits, the one table.
from wcached.exits import EX_CONFIG, EX_DATAERR, EX_SOFTWARE, EX_TEMPFAIL, EX_UNAVAILABLE

__all__ = ["EX_CONFIG", "EX_DATAERR", "EX_SOFTWARE", "EX_TEMPFAIL", "EX_UNAVAILABLE"]


class WcacheError(Exception):
    """Base of every wcached error; ``code`` is stable on the wire.

    ``exit_status`` is what ``wcached serve`` exits with when this ends it
    (its meaning: :mod:`wcached.exits`); anything not classified is a
    software error, retried by the unit."""

    code = "internal"
    exit_status = EX_SOFTWARE


class ConfigError(WcacheError):
    """A configuration mistake: names the file and the key."""

    code = "config"
    exit_status = EX_CONFIG

    def __init__(self, path: str | os.PathLike[str] | None, key: str | None, problem: str):
        self.path = str(path) if path is not None else None
        self.key = key
        self.problem = problem
        where = self.path or "<config>"
        if key:
            where = f"{where}: key {key!r}"
        super().__init__(f"{where}: {problem}")


class DeviceError(WcacheError):
    """The instance name does not resolve to a device (none with that index
    or UUID, no NVML installed): no retry fixes it."""

    code = "device"
    exit_status = EX_CONFIG


class DeviceNotReady(DeviceError):
    """The device is there but not usable now (the driver or NVML not ready
    at boot, a GPU reset in progress, cuInit failing): retried by the unit."""

    code = "device_not_ready"
    exit_status = EX_UNAVAILABLE


class LockHeldError(WcacheError):
    """Another daemon already serves this instance."""

    code = "lock_held"
    exit_status = EX_TEMPFAIL


class LockForeign(WcacheError):
    """The lock file belongs to another user or is a symlink: no retry fixes
    it (the unit stays failed); the message names the file and the fix."""

    code = "lock_foreign"
    exit_status = EX_CONFIG


class FillError(WcacheError):
    """Filling the cache failed for a reason none of the subclasses names:
    a software error, retried by the unit."""

    code = "fill_failed"
    exit_status = EX_SOFTWARE


class CheckpointCorrupt(FillError):
    """A checkpoint's bytes are wrong (truncated, a corrupt header or index, a
    tensor that ends early or is stored twice): names file and tensor. Only
    copying the file again fixes it, so no retry."""

    code = "checkpoint_corrupt"
    exit_status = EX_DATAERR


class FillMisconfigured(FillError):
    """The model cannot be filled as configured (a directory with no
    safetensors files, an alias naming no tensor, unknown vLLM engine_args, a
    rank missing): a configuration mistake, no retry."""

    code = "fill_misconfigured"
    exit_status = EX_CONFIG


class CheckpointUnreadable(FillMisconfigured):
    """The daemon's user cannot list or read a checkpoint path or one of its
    files: no retry fixes it (exit 78); the message names the file, as
    ``check-config`` and ``doctor`` name it."""

    code = "checkpoint_unreadable"


class TooManyFiles(FillMisconfigured):
    """A checkpoint path with more than ``MAX_FILES`` files under it: not a
    checkpoint (a mount point given by mistake)."""

    code = "checkpoint_too_many_files"


class WorkerDied(FillError):
    """The loader worker died without saying why (a signal, a crash in native
    code, an exit without a report): temporary as far as anyone can tell,
    retried; the journal has the signal or status."""

    code = "worker_died"
    exit_status = EX_SOFTWARE


class WorkerNotRunnable(FillError):
    """The worker's interpreter (WCACHED_PYTHON) cannot be run: retried, as
    a package being installed makes it appear."""

    code = "worker_not_runnable"
    exit_status = EX_UNAVAILABLE


class OutOfMemory(FillError):
    """The device (or host) had no room for the fill: a temporary failure,
    retried by the unit with a growing delay (memory may free up)."""

    code = "out_of_memory"
    exit_status = EX_TEMPFAIL


class UnservableModel(FillError):
    """The model loads, but not in a form engines can take from the cache
    (a quantization whose post-processing each engine must redo): a
    configuration matter, so no retry (exit 78)."""

    code = "unservable"
    exit_status = EX_CONFIG


class FillStalled(FillError):
    """The fill made no progress for ``fill_timeout_s``: temporary (a rank
    that may still come, a filesystem that may recover), so retried."""

    code = "fill_stalled"
    exit_status = EX_TEMPFAIL


class CheckpointMissing(FillError):
    """The checkpoint path does not exist (yet): a network filesystem still
    mounting at boot. Retried by the unit, not a permanent failure."""

    code = "checkpoint_missing"
    exit_status = EX_UNAVAILABLE


class ProtocolError(WcacheError):
    """A frame or message that does not follow protocol v1."""

    code = "protocol"


class FrameTooLarge(ProtocolError):
    code = "frame_too_large"


class VersionMismatch(ProtocolError):
    code = "version_mismatch"


class BadRequest(WcacheError):
    """A well-formed message that asks for something invalid."""

    code = "bad_request"


class UnknownModel(WcacheError):
    code = "unknown_model"


class ModelReleased(WcacheError):
    code = "released"


class PermissionRefused(WcacheError):
    """The peer's credentials are not allowed by the daemon's config."""

    code = "permission_denied"


class DaemonUnavailable(WcacheError):
    """No daemon answers on the instance's socket: a command run against it
    (``wcached verify``, ``release``) exits 69, the service is unavailable,
    not 70, which would say the command itself broke."""

    code = "unavailable"
    exit_status = EX_UNAVAILABLE


class TimeoutExpired(WcacheError):
    code = "timeout"


class KeyMismatch(WcacheError):
    """The daemon holds the model under a different cache key."""

    code = "key_mismatch"

    def __init__(self, message: str, fields: list[str] | None = None):
        self.fields = list(fields or [])
        super().__init__(message)


def error_for_code(code: str, message: str) -> WcacheError:
    """Rebuild the exception a daemon reported as ``code``."""
    cls = _by_code().get(code, WcacheError)
    if cls is ConfigError:
        return ConfigError(None, None, message)
    err = cls(message)
    return err


class ReadOnlyWeights(WcacheError):
    """An engine tried to write weights it maps read-only from the daemon."""

    code = "read_only"


class Busy(WcacheError):
    """The daemon serves as many connections as it is configured for."""

    code = "busy"


def _by_code() -> dict[str, type[WcacheError]]:
    """Every error class by its wire code (each class defined here has one of
    its own: tests/test_exits.py checks that none is shared)."""
    found: dict[str, type[WcacheError]] = {}
    todo: list[type[WcacheError]] = [WcacheError]
    while todo:
        cls = todo.pop()
        found.setdefault(cls.code, cls)
        todo += cls.__subclasses__()
    return found
