"""The daemon's side of a fill: the loader worker it starts, what it tells
the worker, and what each way a worker can end becomes (the exit status the
unit acts on). A real worker fills the tiny models; a scripted one (the
``worker_python`` setting pointed at a shim) plays the endings a real one
meets only under faults."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.helpers import write_config
from wcached.cli.demo import LLAMA_TINY, generate_llama
from wcached.config import InstanceSettings, instance_settings, load_config
from wcached.daemon import filler
from wcached.daemon.state import HeldModel
from wcached.device import Device, resolve_instance
from wcached.errors import (
    EX_CONFIG,
    CheckpointMissing,
    ConfigError,
    FillStalled,
    OutOfMemory,
    WorkerDied,
    WorkerNotRunnable,
)
from wcached.loaders.safetensors import SafetensorsModel
from wcached.log import current_instance
from wcached.protocol.wire import close_fds

REPO = Path(__file__).resolve().parents[2]

# Plays a loader worker: the steps in $WCACHED_FAKE_STEPS, in order.
FAKE_WORKER = r"""
import json, os, signal, socket, sys, time
from wcached.protocol.messages import (
    CacheKey, FillDone, FillFailed, FillProgress, Manifest, ModelFilled, WorkerMessage,
)
from wcached.protocol.wire import HEADER, MAX_REPLY_BYTES, Channel
assert sys.argv[1:3] == ["-m", "wcached.loaders.worker"], sys.argv
chan = Channel(socket.socket(fileno=int(sys.argv[3])), WorkerMessage)
for step, *args in json.loads(os.environ["WCACHED_FAKE_STEPS"]):
    if step == "job":  # read the job; write it and the environment to args[0]
        job = chan.recv(MAX_REPLY_BYTES)
        with open(args[0], "w") as f:
            json.dump({"job": {"instance": job.instance, "backend": job.backend,
                               "device_index": job.device_index, "models": job.models},
                       "env": dict(os.environ), "stdin": os.readlink("/proc/self/fd/0")}, f)
    elif step == "progress":
        chan.send(FillProgress(model=args[0], done_bytes=args[1], total_bytes=args[2]))
    elif step == "failed":
        chan.send(FillFailed(code=args[0], message=args[1]))
    elif step == "done":
        chan.send(FillDone())
    elif step == "sleep":
        time.sleep(args[0])
    elif step == "signal":
        os.kill(os.getpid(), getattr(signal, args[0]))
    elif step == "exit":
        sys.exit(args[0])
    elif step == "partial":  # the first half of a message, then nothing
        frame = HEADER.pack(100) + b"x" * 50
        chan.sock.sendall(frame)
    elif step == "announce":  # a filled model whose fds never follow
        key = CacheKey(model=args[0], loader="safetensors", fingerprint="f", dtype="auto")
        m = Manifest(model=args[0], key=key, segments=[], tensors=[], total_bytes=0, filled_at=0.0)
        chan.send(ModelFilled(manifest=m, fd_count=1, fill_seconds=0.1))
    elif step == "filled":  # a fill that timed no reading phase, no segments
        key = CacheKey(model=args[0], loader="safetensors", fingerprint="f", dtype="auto")
        m = Manifest(model=args[0], key=key, segments=[], tensors=[], total_bytes=args[1], filled_at=0.0)
        chan.send(ModelFilled(manifest=m, fd_count=0, fill_seconds=args[2]))
    elif step == "hangup":  # close the connection, stay alive
        chan.sock.close()
"""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("ckpts")
    small = {**LLAMA_TINY, "num_hidden_layers": 1}
    return generate_llama(root / "a", small, shards=1), generate_llama(root / "b", small, shards=2, seed=1)


def _settings(tmp_path: Path, checkpoints: tuple[Path, Path], **daemon: object) -> InstanceSettings:
    a, b = checkpoints
    cfg = write_config(
        tmp_path / "wcached.toml",
        models=[{"name": "first", "path": str(a)}, {"name": "second", "path": str(b)}],
        daemon={"socket_dir": str(tmp_path / "run"), **daemon},
    )
    return instance_settings(load_config(cfg), "cpu0")


def _fake_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, steps: list[list]) -> str:
    """A worker_python that runs FAKE_WORKER with ``steps``."""
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    shim = tmp_path / "fake-python"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} {script} "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("WCACHED_FAKE_STEPS", json.dumps(steps))
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    return str(shim)


def _remember_workers(monkeypatch: pytest.MonkeyPatch) -> list[subprocess.Popen]:
    """Every worker process the filler starts from now on, in order."""
    started: list[subprocess.Popen] = []
    popen = filler.subprocess.Popen

    def remembered(*a: Any, **k: Any) -> subprocess.Popen:
        started.append(popen(*a, **k))
        return started[-1]

    monkeypatch.setattr(filler.subprocess, "Popen", remembered)
    return started


class Recorder:
    def __init__(self, stop_after_ticks: int | None = None):
        self.ticks: list[tuple[str, int, int]] = []
        self.filled: list[HeldModel] = []
        self.stop_after_ticks = stop_after_ticks

    def tick(self, model: str, done: int, total: int) -> None:
        self.ticks.append((model, done, total))

    def stop(self) -> bool:
        return self.stop_after_ticks is not None and len(self.ticks) >= self.stop_after_ticks

    def on_filled(self, held: HeldModel) -> None:
        self.filled.append(held)

    def fill(self, settings: InstanceSettings, device: Device | None = None) -> None:
        filler.fill_models(settings, device or resolve_instance("cpu0"), self.tick, self.stop, self.on_filled)

    def close(self) -> None:
        for held in self.filled:
            close_fds(held.fds)


def test_one_worker_fills_every_model_and_hands_each_over_with_its_fds(
    tmp_path: Path, checkpoints: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    rec = Recorder()
    caplog.set_level(logging.INFO, logger="wcached.fill")
    try:
        rec.fill(_settings(tmp_path, checkpoints))
        assert [h.manifest.model for h in rec.filled] == ["first", "second"]
        for held in rec.filled:
            m = held.manifest
            assert len(held.fds) == len(m.segments) >= 1
            for fd in held.fds:
                os.fstat(fd)  # open, owned by the callee now
            assert held.fill_seconds > 0 and "read" in held.phases
            assert held.read_bytes == m.total_bytes
        # Progress: each model's ticks end at its total, which they carry.
        for held in rec.filled:
            name, total = held.manifest.model, held.manifest.total_bytes
            mine = [t for t in rec.ticks if t[0] == name]
            assert mine[-1] == (name, total, total)
            assert all(t[2] == total for t in mine)
    finally:
        rec.close()
    started = [r for r in caplog.records if "loader worker pid" in r.getMessage()]
    assert len(started) == 1
    done = [r for r in caplog.records if r.getMessage().startswith("filled ")]
    assert [r.model for r in done] == ["first", "second"]  # type: ignore[attr-defined]
    assert f"{len(rec.filled[0].manifest.tensors)} tensors" in done[0].getMessage()


def test_models_of_different_worker_groups_fill_in_workers_of_their_own(
    tmp_path: Path,
    checkpoints: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(SafetensorsModel, "worker_group", lambda self: (self.name,))
    caplog.set_level(logging.INFO, logger="wcached.fill")
    rec = Recorder()
    try:
        rec.fill(_settings(tmp_path, checkpoints))
    finally:
        rec.close()
    assert [h.manifest.model for h in rec.filled] == ["first", "second"]
    assert len([r for r in caplog.records if "loader worker pid" in r.getMessage()]) == 2


def test_a_missing_checkpoint_fails_before_any_worker_starts(
    tmp_path: Path, checkpoints: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _settings(tmp_path, checkpoints)
    gone = msgspec.structs.replace(settings.models[1], path=str(tmp_path / "not-mounted-yet"))
    settings = msgspec.structs.replace(settings, models=(settings.models[0], gone))

    def no_worker(*a: object, **k: object) -> None:
        raise AssertionError("a worker was started")

    monkeypatch.setattr(filler.subprocess, "Popen", no_worker)
    rec = Recorder()
    with pytest.raises(CheckpointMissing, match="model 'second'") as e:
        rec.fill(settings)
    assert e.value.exit_status == 69
    assert not rec.filled


def test_the_worker_gets_the_job_for_its_device_and_an_environment_of_its_own(
    tmp_path: Path, checkpoints: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    dump = tmp_path / "job.json"
    python = _fake_worker(tmp_path, monkeypatch, [["job", str(dump)], ["done"]])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    settings = _settings(tmp_path, checkpoints, worker_python=python, log_level="debug")
    asked: list[Device] = []

    def for_device(self: SafetensorsModel, device: Device) -> SafetensorsModel:
        asked.append(device)
        return self

    monkeypatch.setattr(SafetensorsModel, "for_device", for_device)
    # The daemon's own stdin a pipe (under systemd it is /dev/null already):
    # the worker must not inherit it.
    r, w = os.pipe()
    saved = os.dup(0)
    os.dup2(r, 0)
    try:
        Recorder().fill(settings)
    finally:
        os.dup2(saved, 0)
        for fd in (saved, r, w):
            os.close(fd)
    got = json.loads(dump.read_text())
    assert asked == [resolve_instance("cpu0")] * 2  # each model as this device's worker needs it
    assert got["job"]["instance"] == "cpu0" and got["job"]["backend"] == "host"
    assert got["job"]["device_index"] == 0
    assert [m["name"] for m in got["job"]["models"]] == ["first", "second"]
    env = got["env"]
    assert "CUDA_VISIBLE_DEVICES" not in env  # host memory: no GPU of anyone's
    assert env["WCACHED_LOG_LEVEL"] == "debug"
    assert env["WCACHED_LOG_INSTANCE"] == current_instance()
    assert got["stdin"] == "/dev/null"  # never the daemon's (the journal's) stdin
    assert env["VLLM_RPC_BASE_PATH"] == settings.socket_dir
    # An operator's own VLLM_RPC_BASE_PATH is kept.
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(tmp_path / "mine"))
    Recorder().fill(settings)
    assert json.loads(dump.read_text())["env"]["VLLM_RPC_BASE_PATH"] == str(tmp_path / "mine")


def test_a_gpu_worker_sees_its_own_gpu_only(
    tmp_path: Path, checkpoints: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    dump = tmp_path / "job.json"
    python = _fake_worker(tmp_path, monkeypatch, [["job", str(dump)], ["done"]])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    gpu = Device("cuda", "GPU-11111111-2222-3333-4444-555555555555", 5, "a GPU")
    Recorder().fill(_settings(tmp_path, checkpoints, worker_python=python), gpu)
    got = json.loads(dump.read_text())
    assert got["env"]["CUDA_VISIBLE_DEVICES"] == gpu.instance_id
    assert got["job"]["backend"] == "cuda" and got["job"]["device_index"] == 5
    assert got["job"]["instance"] == gpu.instance_id


def test_progress_keeps_each_models_total_and_silence_still_ticks(
    tmp_path: Path, checkpoints: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filler, "POLL_S", 0.05)
    steps = [
        ["job", str(tmp_path / "job.json")],
        ["progress", "first", 0, 100],
        ["progress", "first", 40, 0],
        ["sleep", 0.3],
        ["progress", "second", 0, 7],
        ["progress", "first", 100, 0],
        ["done"],
    ]
    python = _fake_worker(tmp_path, monkeypatch, steps)
    rec = Recorder()
    rec.fill(_settings(tmp_path, checkpoints, worker_python=python))
    # While the worker starts, the first model is named, nothing known yet.
    starting = 0
    while rec.ticks[starting] == ("first", 0, 0):
        starting += 1
    ticks = rec.ticks[starting:]
    assert ticks[:2] == [("first", 0, 100), ("first", 40, 100)]
    silent = ticks[2:-2]
    assert len(silent) >= 2 and set(silent) == {("first", 40, 100)}
    assert ticks[-2:] == [("second", 0, 7), ("first", 100, 100)]


def test_a_silent_worker_is_a_stalled_fill_naming_the_model_and_its_timeout(
    tmp_path: Path, checkpoints: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filler, "POLL_S", 0.05)
    python = _fake_worker(
        tmp_path, monkeypatch, [["job", str(tmp_path / "j")], ["progress", "second", 0, 9], ["sleep", 30]]
    )
    settings = _settings(tmp_path, checkpoints, worker_python=python)
    second = msgspec.structs.replace(settings.models[1], fill_timeout_s=0.3)
    settings = msgspec.structs.replace(settings, models=(settings.models[0], second))
    with pytest.raises(FillStalled) as e:
        Recorder().fill(settings)
    assert "model 'second'" in str(e.value) and "no progress for 0 s (fill_timeout_s)" in str(e.value)
    assert str(checkpoints[1]) in str(e.value)  # the stall hint names where it reads
    assert e.value.exit_status == 75


def test_a_worker_busy_within_its_timeout_is_not_stalled(
    tmp_path: Path, checkpoints: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filler, "POLL_S", 0.05)
    steps = [["job", str(tmp_path / "j")]]
    steps += [s for _ in range(6) for s in (["progress", "first", 1, 9], ["sleep", 0.1])]
    python = _fake_worker(tmp_path, monkeypatch, [*steps, ["done"]])
    settings = _settings(tmp_path, checkpoints, worker_python=python)
    first = msgspec.structs.replace(settings.models[0], fill_timeout_s=0.4)
    Recorder().fill(msgspec.structs.replace(settings, models=(first, settings.models[1])))


@pytest.mark.parametrize(
    ("steps", "kind", "message"),
    [
        ([["failed", OutOfMemory.code, "GPU full"]], OutOfMemory, "GPU full"),
        ([["exit", 3]], WorkerDied, "exited with status 3 without reporting a result"),
        ([["job", "/dev/null"], ["exit", 0]], WorkerDied, "exited with status 0 without reporting"),
        ([["job", "/dev/null"], ["signal", "SIGTERM"]], WorkerDied, "killed by SIGTERM"),
        ([["job", "/dev/null"], ["done"], ["exit", 5]], WorkerDied, "exited with status 5 after filling"),
    ],
)
def test_each_way_a_worker_ends_is_its_cause(
    tmp_path: Path,
    checkpoints: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    steps: list[list],
    kind: type,
    message: str,
) -> None:
    python = _fake_worker(tmp_path, monkeypatch, steps)
    with pytest.raises(kind, match=message) as e:
        Recorder().fill(_settings(tmp_path, checkpoints, worker_python=python))
    assert type(e.value) is kind


def test_a_worker_killed_by_sigkill_hints_at_the_oom_killer(
    tmp_path: Path, checkpoints: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filler, "oom_kills", lambda: None)
    python = _fake_worker(tmp_path, monkeypatch, [["job", "/dev/null"], ["signal", "SIGKILL"]])
    with pytest.raises(WorkerDied, match=r"killed by SIGKILL \(the out-of-memory killer\?"):
        Recorder().fill(_settings(tmp_path, checkpoints, worker_python=python))


def test_a_worker_python_that_cannot_run_is_named(tmp_path: Path, checkpoints: tuple[Path, Path]) -> None:
    missing = str(tmp_path / "no-such-python")
    with pytest.raises(WorkerNotRunnable, match=f"cannot start the loader worker with {missing}"):
        Recorder().fill(_settings(tmp_path, checkpoints, worker_python=missing))


def test_a_stop_request_ends_the_fill_and_the_worker(
    tmp_path: Path, checkpoints: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filler, "POLL_S", 0.05)
    pidfile = tmp_path / "job.json"
    python = _fake_worker(tmp_path, monkeypatch, [["job", str(pidfile)], ["sleep", 60]])
    rec = Recorder(stop_after_ticks=2)
    started = _remember_workers(monkeypatch)
    with pytest.raises(filler.FillAborted):
        rec.fill(_settings(tmp_path, checkpoints, worker_python=python))
    (proc,) = started
    assert proc.returncode == -signal.SIGKILL  # killed and reaped, not left running


def test_a_checkpoint_path_that_cannot_be_read_is_a_config_error_naming_file_and_key(
    tmp_path: Path, checkpoints: tuple[Path, Path]
) -> None:
    settings = _settings(tmp_path, checkpoints)
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    empty = a_file / "model"  # below a file: no retry makes it readable (root too)
    wrong = msgspec.structs.replace(settings.models[1], path=str(empty))
    with pytest.raises(ConfigError) as e:
        Recorder().fill(msgspec.structs.replace(settings, models=(settings.models[0], wrong)))
    assert e.value.exit_status == EX_CONFIG
    assert e.value.path == settings.source and e.value.key == "path of model 'second'"
    assert str(empty) in e.value.problem
    # Checked alone (check-config, doctor): no file to name.
    with pytest.raises(ConfigError) as alone:
        filler.check_checkpoint_path(wrong)
    assert alone.value.path is None and alone.value.problem == e.value.problem


def test_a_fill_idle_exactly_its_timeout_is_not_yet_stalled(
    tmp_path: Path, checkpoints: tuple[Path, Path]
) -> None:
    model = msgspec.structs.replace(_settings(tmp_path, checkpoints).models[0], fill_timeout_s=5.0)
    filler._check_stall(model, 5.0)
    with pytest.raises(FillStalled):
        filler._check_stall(model, 5.001)


def test_ticks_before_any_report_and_a_model_whose_total_is_not_known_yet(
    tmp_path: Path, checkpoints: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filler, "POLL_S", 0.05)
    steps = [["job", str(tmp_path / "j")], ["sleep", 0.3], ["progress", "second", 5, 0], ["done"]]
    rec = Recorder()
    rec.fill(_settings(tmp_path, checkpoints, worker_python=_fake_worker(tmp_path, monkeypatch, steps)))
    assert len(rec.ticks) >= 3
    assert set(rec.ticks[:-1]) == {("first", 0, 0)}  # the first model, nothing known
    assert rec.ticks[-1] == ("second", 5, 0)


def test_the_log_names_the_workers_python_and_each_fill(
    tmp_path: Path, checkpoints: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="wcached.fill")
    rec = Recorder()
    try:
        rec.fill(_settings(tmp_path, checkpoints))
    finally:
        rec.close()
    (started,) = [r.getMessage() for r in caplog.records if "loader worker pid" in r.getMessage()]
    assert started.endswith(f"started ({sys.executable})")
    first = rec.filled[0]
    m = first.manifest
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("filled first:")]
    gb = f"{m.total_bytes / 1e9:.2f} GB"
    assert line.startswith(
        f"filled first: {len(m.tensors)} tensors, {gb} in {len(m.segments)} segment(s) in "
    )
    assert f"read {m.total_bytes / 1e9:.2f} GB in " in line


def test_a_worker_the_oom_killer_took_mid_fill_is_out_of_memory(
    tmp_path: Path, checkpoints: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = iter([4, 5])  # before the worker, after it died
    monkeypatch.setattr(filler, "oom_kills", lambda: next(counts))
    python = _fake_worker(tmp_path, monkeypatch, [["job", "/dev/null"], ["signal", "SIGKILL"]])
    with pytest.raises(OutOfMemory, match=r"out-of-memory killer \(SIGKILL\)") as e:
        Recorder().fill(_settings(tmp_path, checkpoints, worker_python=python))
    assert e.value.exit_status == 75


def test_a_worker_gone_before_it_reads_its_job_is_a_dead_worker(
    tmp_path: Path, checkpoints: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    python = _fake_worker(tmp_path, monkeypatch, [["exit", 4]])
    started = _remember_workers(monkeypatch)

    def after_it_exited() -> int:
        # Counted between the start and the job: the worker is gone by the
        # time the job is sent, so the send itself fails.
        started[-1].wait(30)
        return 0

    monkeypatch.setattr(filler, "oom_kills", after_it_exited)
    with pytest.raises(WorkerDied, match="exited with status 4 without reporting a result"):
        Recorder().fill(_settings(tmp_path, checkpoints, worker_python=python))


@pytest.mark.parametrize(
    ("steps", "kind", "message"),
    [
        ([["partial"], ["sleep", 30]], FillStalled, "stopped in the middle of a message for 1 s"),
        (
            [["announce", "first"], ["sleep", 30]],
            FillStalled,
            "announced 1 fd\\(s\\) of model 'first' and did not",
        ),
        ([["done"], ["sleep", 30]], WorkerDied, "did not exit within 1 s after filling"),
    ],
)
def test_a_worker_stuck_mid_message_or_after_its_last_is_not_waited_for_forever(
    tmp_path: Path,
    checkpoints: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    steps: list[list],
    kind: type,
    message: str,
) -> None:
    monkeypatch.setattr(filler, "WORKER_IO_TIMEOUT_S", 1.0)
    python = _fake_worker(tmp_path, monkeypatch, [["job", "/dev/null"], *steps])
    t0 = time.monotonic()
    with pytest.raises(kind, match=message):
        Recorder().fill(_settings(tmp_path, checkpoints, worker_python=python))
    assert time.monotonic() - t0 < 20


def test_a_worker_that_hangs_up_and_lingers_is_a_dead_worker(
    tmp_path: Path, checkpoints: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(filler, "WORKER_EXIT_WAIT_S", 0.5)
    python = _fake_worker(tmp_path, monkeypatch, [["job", "/dev/null"], ["hangup"], ["sleep", 30]])
    t0 = time.monotonic()
    with pytest.raises(WorkerDied, match=r"loader worker closed its connection without reporting$"):
        Recorder().fill(_settings(tmp_path, checkpoints, worker_python=python))
    assert time.monotonic() - t0 < 20


def test_oom_kills_reads_the_cgroups_count(tmp_path: Path) -> None:
    from wcached.daemon.filler import oom_kills

    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text("0::/system.slice/system-wcached.slice/wcached@0.service\n")
    group = tmp_path / "cg" / "system.slice" / "system-wcached.slice" / "wcached@0.service"
    group.mkdir(parents=True)
    (group / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n")
    assert oom_kills(str(proc), str(tmp_path / "cg")) == 2
    (group / "memory.events").unlink()
    assert oom_kills(str(proc), str(tmp_path / "cg")) is None


def test_a_worker_the_oom_killer_took_is_out_of_memory_another_signal_a_dead_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cgroup's oom_kill count decides: one more than before the fill is
    out of memory (75, retried with a growing delay), none more is a worker
    that died (70). Neither is ever "corrupt"."""
    from wcached.daemon import filler
    from wcached.errors import OutOfMemory, WorkerDied

    class Killed:
        def wait(self, timeout: float) -> int:
            return -signal.SIGKILL

    monkeypatch.setattr(filler, "oom_kills", lambda: 3)
    err = filler._worker_death(Killed(), ooms_before=2)
    assert type(err) is OutOfMemory and err.exit_status == 75
    assert "out-of-memory killer (SIGKILL)" in str(err)
    err = filler._worker_death(Killed(), ooms_before=3)
    assert type(err) is WorkerDied and err.exit_status == 70
    assert "killed by SIGKILL (the out-of-memory killer?" in str(err)
    # Where the count cannot be read, the signal alone decides nothing more.
    monkeypatch.setattr(filler, "oom_kills", lambda: None)
    assert type(filler._worker_death(Killed(), ooms_before=2)) is WorkerDied
    # Another signal: a dead worker, and no word of the out-of-memory killer.
    monkeypatch.setattr(filler, "oom_kills", lambda: 3)

    class Stopped:
        def wait(self, timeout: float) -> int:
            return -signal.SIGTERM

    err = filler._worker_death(Stopped(), ooms_before=3)
    assert type(err) is WorkerDied and str(err) == "loader worker was killed by SIGTERM"


def test_oom_kills_finds_its_cgroup_by_the_unified_line_only(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    cg = tmp_path / "cg"
    # A hybrid host: v1 lines first; a cgroup name may hold "::".
    (proc / "cgroup").write_text("4:memory:/elsewhere\n0::/Xodd::name\n")
    (cg / "Xodd::name").mkdir(parents=True)
    (cg / "Xodd::name" / "memory.events").write_text("oom 1\noom_kill 7\n")
    (cg / "elsewhere").mkdir()
    (cg / "elsewhere" / "memory.events").write_text("oom_kill 99\n")
    assert filler.oom_kills(str(proc), str(cg)) == 7
    (cg / "Xodd::name" / "memory.events").write_text("oom 1\n")
    assert filler.oom_kills(str(proc), str(cg)) is None  # no count kept
    (cg / "Xodd::name" / "memory.events").write_text("oom_kill many\n")
    assert filler.oom_kills(str(proc), str(cg)) is None
    (proc / "cgroup").write_text("4:memory:/elsewhere\n")  # cgroup v1 only
    assert filler.oom_kills(str(proc), str(cg)) is None


def test_a_fill_without_a_timed_reading_is_logged_at_its_whole_rate(
    tmp_path: Path,
    checkpoints: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="wcached.fill")
    steps = [["job", "/dev/null"], ["filled", "first", 3_000_000_000, 2.0], ["done"]]
    rec = Recorder()
    rec.fill(_settings(tmp_path, checkpoints, worker_python=_fake_worker(tmp_path, monkeypatch, steps)))
    assert [(h.manifest.model, h.fds, h.fill_seconds, h.read_bytes) for h in rec.filled] == [
        ("first", [], 2.0, 0)
    ]
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("filled first:")]
    assert line == "filled first: 0 tensors, 3.00 GB in 0 segment(s) in 2.00 s (1.50 GB/s)"
