"""Test helpers: checkpoints, config files and a real daemon process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def multi_dtype_tensors() -> dict[str, object]:
    """Every dtype the issue names, plus 0-dim and empty tensors."""
    import torch

    g = torch.Generator().manual_seed(1234)
    f32 = torch.randn(64, 48, generator=g)
    return {
        "embed.weight": f32.to(torch.bfloat16),
        "layer.0.fp16": torch.randn(16, 8, generator=g).half(),
        "layer.0.fp32": torch.randn(10, generator=g),
        "layer.0.fp64": torch.randn(3, 3, generator=g).double(),
        "layer.0.int8": torch.randint(-128, 127, (7, 3), generator=g, dtype=torch.int8),
        "layer.0.uint8": torch.randint(0, 255, (5,), generator=g, dtype=torch.uint8),
        "layer.0.int16": torch.randint(-1000, 1000, (4,), generator=g, dtype=torch.int16),
        "layer.0.int32": torch.randint(-(2**30), 2**30, (6,), generator=g, dtype=torch.int32),
        "layer.0.int64": torch.randint(-(2**40), 2**40, (2, 2), generator=g, dtype=torch.int64),
        "layer.0.fp8_e4m3": torch.randn(8, 8, generator=g).to(torch.float8_e4m3fn),
        "layer.0.fp8_e5m2": torch.randn(4, generator=g).to(torch.float8_e5m2),
        "layer.0.mask": torch.rand(5, generator=g) > 0.5,
        "layer.1.scalar": torch.tensor(3.25),
        "layer.1.empty": torch.empty(0, 4, dtype=torch.bfloat16),
        "layer.1.bf16_big": torch.randn(300, 257, generator=g).to(torch.bfloat16),
        "layer.1.scale": torch.tensor(7, dtype=torch.int32),
    }


def write_sharded(out: Path, tensors: dict[str, object], shards: int = 2) -> Path:
    """A sharded checkpoint with model.safetensors.index.json."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s * per : (s + 1) * per]}
        save_file(part, str(out / fname))
        weight_map.update(dict.fromkeys(part, fname))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return out


def load_reference(path: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    out: dict[str, object] = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def as_bytes(t):
    """The raw bytes of a tensor, for bit-exact comparison of any dtype."""
    import torch

    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(v)


def write_config(
    path: Path,
    models: list[dict],
    daemon: dict | None = None,
    instances: dict[str, dict] | None = None,
) -> Path:
    lines = ["[daemon]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in (daemon or {}).items()]
    for m in models:
        lines += ["", "[[model]]"] + [f"{k} = {toml_value(v)}" for k, v in m.items()]
    for name, table in (instances or {}).items():
        lines += ["", f'[instance."{name}"]'] + [f"{k} = {toml_value(v)}" for k, v in table.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def tied_model_config(work: Path, ckpt: Path, segment_size: str, **daemon) -> Path:
    """A config serving ``ckpt`` as "default", lm_head tied to the embedding."""
    return write_config(
        work / "wcached.toml",
        models=[
            {
                "name": "default",
                "path": str(ckpt),
                "aliases": {"lm_head.weight": "embed.weight"},
                "segment_size": segment_size,
            }
        ],
        daemon={"socket_dir": str(work / "run"), **daemon},
    )


class NotifyListener:
    """A stand-in for systemd's notify socket."""

    def __init__(self, directory: Path):
        self.path = str(directory / f"notify-{time.monotonic_ns()}.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.messages: list[str] = []

    def wait_for(self, field: str, timeout: float, proc: subprocess.Popen | None = None) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(field in m.split("\n") for m in self.messages):
                return next(m for m in self.messages if field in m.split("\n"))
            self.sock.settimeout(0.2)
            try:
                self.messages.append(self.sock.recv(65536).decode())
            except TimeoutError:
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"daemon exited with {proc.returncode} before {field}") from None
        raise TimeoutError(f"no {field} within {timeout}s; got {self.messages}")

    def close(self) -> None:
        self.sock.close()


@dataclass
class Daemon:
    proc: subprocess.Popen
    socket_path: str
    log_path: Path
    notify: NotifyListener
    socket_dir: str = ""
    extra: dict = field(default_factory=dict)

    def log(self) -> str:
        return self.log_path.read_text()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def start_daemon(
    config: Path, instance: str = "cpu0", env: dict | None = None, work: Path | None = None
) -> Daemon:
    work = work or config.parent
    notify = NotifyListener(work)
    log_path = work / f"daemon-{instance}-{time.monotonic_ns()}.log"
    from wcached.config import load_config

    sdir = load_config(config).daemon.socket_dir
    full_env = dict(os.environ, NOTIFY_SOCKET=notify.path, PYTHONUNBUFFERED="1", **(env or {}))
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "wcached", "serve", instance, "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
        )
    from wcached.device import resolve_instance

    sock = os.path.join(sdir, f"{resolve_instance(instance).instance_id}.sock")
    return Daemon(proc, sock, log_path, notify, sdir)


def wait_ready(d: Daemon, timeout: float) -> None:
    """Until the daemon said READY=1; its log in the error if it never does."""
    try:
        d.notify.wait_for("READY=1", timeout, d.proc)
    except (RuntimeError, TimeoutError) as e:
        raise RuntimeError(f"{e}\n--- daemon log ---\n{d.log()[-8000:]}") from None


@contextlib.contextmanager
def run_daemon(
    config: Path, instance: str = "cpu0", env: dict | None = None, timeout: float = 60
) -> Iterator[Daemon]:
    """A real daemon process, yielded once it reported READY=1."""
    d = start_daemon(config, instance, env)
    try:
        wait_ready(d, timeout)
        yield d
    finally:
        if d.proc.poll() is None:
            d.proc.send_signal(signal.SIGTERM)
            try:
                d.proc.wait(15)
            except subprocess.TimeoutExpired:
                d.proc.kill()
                d.proc.wait()
        d.notify.close()


def open_tmpdir() -> Path:
    """A temp dir other users can traverse (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="wcached-test-"))
    path.chmod(0o755)
    return path


def run_as(user: str, argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``user`` (primary group only), from ``/``."""
    import pwd

    pw = pwd.getpwnam(user)
    env = {"HOME": "/tmp", "PATH": os.environ.get("PATH", "")}
    if "PYTHONPATH" in os.environ:  # the GPU machine carries packages this way
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run(
        argv,
        user=pw.pw_uid,
        group=pw.pw_gid,
        extra_groups=[],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
    )


def other_users_can_run_python() -> bool:
    """Root, an interpreter outside /root, and the users nobody and daemon."""
    import pwd

    try:
        pwd.getpwnam("nobody")
        pwd.getpwnam("daemon")
    except KeyError:
        return False
    return os.getuid() == 0 and not sys.executable.startswith("/root")
