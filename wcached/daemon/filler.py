"""Running the loader worker and collecting what it filled."""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import subprocess
import time
from collections.abc import Callable

import msgspec

from wcached.config import InstanceSettings, ModelConfig
from wcached.daemon.state import HeldModel
from wcached.device import Device
from wcached.errors import (
    CheckpointMissing,
    ConfigError,
    FillError,
    FillMisconfigured,
    FillStalled,
    OutOfMemory,
    TimeoutExpired,
    WorkerDied,
    WorkerNotRunnable,
    error_for_code,
)
from wcached.loaders.checkpoint import Checkpoint
from wcached.loaders.layout import describe_fill
from wcached.log import current_instance
from wcached.protocol.messages import (
    FillDone,
    FillFailed,
    FillJob,
    FillProgress,
    ModelFilled,
    WorkerMessage,
)
from wcached.protocol.wire import MAX_REPLY_BYTES, Channel, PeerClosed

log = logging.getLogger("wcached.fill")

# How often the daemon wakes while the worker is silent (to ping the watchdog,
# extend the start timeout and notice SIGTERM).
POLL_S = 1.0
# How long the worker may take to finish a message it started, to send the
# fds it announced, and to exit once it said it is done.
WORKER_IO_TIMEOUT_S = 60.0
# How long a worker that closed its connection may take to exit.
WORKER_EXIT_WAIT_S = 10.0


class FillAborted(Exception):
    """The daemon was asked to stop while filling."""


def fill_models(
    settings: InstanceSettings,
    device: Device,
    on_tick: Callable[[str, int, int], None],
    should_stop: Callable[[], bool],
    on_filled: Callable[[HeldModel], None],
) -> None:
    """Spawn a worker per group of models that can share one (see
    :meth:`ModelConfig.worker_group`), hand it its job, and hand each model it
    fills to ``on_filled`` as soon as its fds arrive (from then on the callee
    owns them), before the next model is filled.

    ``on_tick(model, done_bytes, total_bytes)`` is called on progress and at
    least every :data:`POLL_S` seconds while the worker works.
    """
    for m in settings.models:
        check_checkpoint_path(m, settings.source)
    groups: dict[tuple, list[ModelConfig]] = {}
    for m in settings.models:
        groups.setdefault(m.worker_group(), []).append(m)
    for models in groups.values():
        _fill_in_one_worker(
            msgspec.structs.replace(settings, models=tuple(models)), device, on_tick, should_stop, on_filled
        )


def _fill_in_one_worker(
    settings: InstanceSettings,
    device: Device,
    on_tick: Callable[[str, int, int], None],
    should_stop: Callable[[], bool],
    on_filled: Callable[[HeldModel], None],
) -> None:
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    python = settings.worker_interpreter
    env = dict(os.environ, WCACHED_LOG_LEVEL=settings.log_level, WCACHED_LOG_INSTANCE=current_instance())
    env.pop("CUDA_VISIBLE_DEVICES", None)
    # vLLM's message queues between the ranks of a tensor-parallel fill meet
    # at ZeroMQ IPC sockets under this directory (default: /tmp). Under the
    # unit every instance has a private /tmp; the socket directory is the one
    # place all instances of this config share.
    env.setdefault("VLLM_RPC_BASE_PATH", settings.socket_dir)
    if device.kind == "cuda":
        # The worker sees its own GPU only: an engine rank it builds (vLLM
        # tensor parallel) then lands on it as device 0, and it can touch no
        # other instance's GPU.
        env["CUDA_VISIBLE_DEVICES"] = device.instance_id
    try:
        proc = subprocess.Popen(
            [python, "-m", "wcached.loaders.worker", str(child.fileno())],
            pass_fds=[child.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
        )
    except OSError as e:
        parent.close()
        child.close()
        raise WorkerNotRunnable(f"cannot start the loader worker with {python}: {e}") from None
    child.close()
    ooms_before = oom_kills()
    log.info("loader worker pid %d started (%s)", proc.pid, python)
    chan = Channel(parent, WorkerMessage)
    totals = {m.name: 0 for m in settings.models}  # from the worker's first report
    try:
        job = FillJob(
            instance=device.instance_id,
            backend=device.backend,
            device_index=device.index,
            models=[msgspec.to_builtins(m.for_device(device)) for m in settings.models],
        )
        try:
            chan.send(job)
        except OSError:  # it died before reading its job (an import that crashed?)
            raise _worker_death(proc, ooms_before) from None
        by_name = {m.name: m for m in settings.models}
        current = settings.models[0].name if settings.models else ""
        done = 0
        last_progress = time.monotonic()
        while True:
            if should_stop():
                raise FillAborted()
            if not _readable(parent, POLL_S):  # silence: the worker is busy
                on_tick(current, done, totals.get(current, 0))
                if current in by_name:
                    _check_stall(by_name[current], time.monotonic() - last_progress)
                continue
            try:
                msg = chan.recv(
                    MAX_REPLY_BYTES, idle_timeout=WORKER_IO_TIMEOUT_S, frame_timeout=WORKER_IO_TIMEOUT_S
                )
            except TimeoutExpired:
                # Not silence between messages: a message begun and not
                # finished (the worker is stuck, or writing garbage).
                raise FillStalled(
                    f"the loader worker stopped in the middle of a message for {WORKER_IO_TIMEOUT_S:.0f} s"
                ) from None
            except (PeerClosed, OSError):
                raise _worker_death(proc, ooms_before) from None
            last_progress = time.monotonic()
            if isinstance(msg, FillProgress):
                current, done = msg.model, msg.done_bytes
                if msg.total_bytes:
                    totals[current] = msg.total_bytes
                on_tick(current, done, totals.get(current, 0))
            elif isinstance(msg, ModelFilled):
                try:
                    fds = chan.recv_fds(msg.fd_count, timeout=WORKER_IO_TIMEOUT_S)
                except TimeoutExpired:
                    raise FillStalled(
                        f"the loader worker announced {msg.fd_count} fd(s) of model {msg.manifest.model!r} "
                        f"and did not send them within {WORKER_IO_TIMEOUT_S:.0f} s"
                    ) from None
                m = msg.manifest
                log.info(
                    "filled %s: %d tensors, %.2f GB in %d segment(s) in %.2f s (%s)",
                    m.model,
                    len(m.tensors),
                    m.total_bytes / 1e9,
                    len(m.segments),
                    msg.fill_seconds,
                    describe_fill(m.total_bytes, msg.fill_seconds, msg.phases, msg.read_bytes),
                    extra={"model": m.model},
                )
                on_filled(HeldModel(m, fds, msg.fill_seconds, phases=msg.phases, read_bytes=msg.read_bytes))
            elif isinstance(msg, FillFailed):
                # Keep the worker's class: its exit status tells systemd what to do.
                raise error_for_code(msg.code, msg.message) from None
            elif isinstance(msg, FillDone):
                break
        try:
            rc = proc.wait(timeout=WORKER_IO_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise WorkerDied(
                f"loader worker did not exit within {WORKER_IO_TIMEOUT_S:.0f} s after filling"
            ) from None
        if rc != 0:
            raise WorkerDied(f"loader worker exited with status {rc} after filling")
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        raise
    finally:
        parent.close()


def _readable(sock: socket.socket, timeout: float) -> bool:
    """Whether ``sock`` has something to read (or was closed) within
    ``timeout`` seconds; poll(2), which any fd number suits."""
    p = select.poll()
    p.register(sock, select.POLLIN)
    return bool(p.poll(timeout * 1000))


def _check_stall(model: ModelConfig, idle_s: float) -> None:
    if idle_s <= model.fill_timeout_s:
        return
    raise FillStalled(
        f"model {model.name!r}: the fill made no progress for {model.fill_timeout_s:.0f} s "
        f"(fill_timeout_s); {model.stall_hint()}"
    )


def check_checkpoint_path(model: ModelConfig, source: str = "") -> None:
    """Before a worker starts: a path that is not there yet (a network
    filesystem still mounting) is retried by the unit (69); one this user
    may not read is a configuration mistake that no retry fixes (78), named
    as ``check-config`` names it."""
    try:
        Checkpoint.of(model).check_readable()
    except CheckpointMissing as e:
        raise CheckpointMissing(f"model {model.name!r}: {e}") from None
    except FillMisconfigured as e:
        raise ConfigError(source or None, f"path of model {model.name!r}", str(e)) from None


def _worker_death(proc: subprocess.Popen, ooms_before: int | None) -> FillError:
    """Why the worker went without a report, as the error its cause is: the
    kernel's out-of-memory killer (this cgroup's memory.events counted one
    more oom_kill) is out of memory; anything else is a worker that died.
    Both are retried by the unit; neither says the checkpoint is bad."""
    try:
        rc = proc.wait(timeout=WORKER_EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        return WorkerDied("loader worker closed its connection without reporting")
    if rc < 0:
        name = _signal_name(-rc)
        after = oom_kills()
        if ooms_before is not None and after is not None and after > ooms_before:
            return OutOfMemory(f"loader worker was killed by the kernel's out-of-memory killer ({name})")
        hint = " (the out-of-memory killer? journalctl -k | grep -i oom)" if -rc == signal.SIGKILL else ""
        return WorkerDied(f"loader worker was killed by {name}{hint}")
    return WorkerDied(f"loader worker exited with status {rc} without reporting a result")


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def oom_kills(proc_root: str = "/proc/self", cgroup_root: str = "/sys/fs/cgroup") -> int | None:
    """How many processes of this cgroup (cgroup v2: the unit's, which the
    worker shares) the kernel's out-of-memory killer took; None if unknown."""
    try:
        with open(f"{proc_root}/cgroup") as f:
            path = next(line.split("::", 1)[1].strip() for line in f if line.startswith("0::"))
        with open(os.path.join(cgroup_root, path.lstrip("/"), "memory.events")) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except (OSError, StopIteration, ValueError):
        return None
    return None
