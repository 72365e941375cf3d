"""Test helpers: checkpoints, config files and a real daemon process."""

from __future__ import annotations

import array
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


def one_model_config(work: Path, path: Path, socket_dir: Path | None = None, **model: object) -> Path:
    """``work/wcached.toml`` serving ``path`` as "default" from ``work/run``
    (or ``socket_dir``); ``model`` adds [[model]] keys."""
    return write_config(
        work / "wcached.toml",
        models=[{"name": "default", "path": str(path), **model}],
        daemon={"socket_dir": str(socket_dir or work / "run")},
    )


def require_other_users() -> None:
    """Skip where clients cannot run as other users (root and an interpreter
    outside /root are needed); under CI=true, where they must, fail."""
    if other_users_can_run_python():
        return
    import pytest

    if os.environ.get("CI") == "true":
        pytest.fail("CI runs as root with an interpreter others can run")
    pytest.skip("needs root and an interpreter others can run")


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
    """A stand-in for systemd's notify socket, and for the unit's fd store:
    fds sent with ``FDSTORE=1`` are kept under their ``FDNAME=`` (a second fd
    under a name is kept too, as systemd does), ``FDSTOREREMOVE=1`` closes
    them, and :func:`start_daemon` hands them to the next daemon as
    ``LISTEN_FDS``/``LISTEN_FDNAMES`` exactly as systemd does."""

    def __init__(self, directory: Path):
        self.path = str(directory / f"notify-{time.monotonic_ns()}.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.messages: list[str] = []
        self.store: list[tuple[str, int]] = []

    def _receive(self, timeout: float) -> None:
        self.sock.settimeout(timeout)
        data, anc, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(253 * 4))
        fds: list[int] = []
        for level, kind, payload in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds += array.array("i", payload[: len(payload) - len(payload) % 4])
        text = data.decode()
        fields = dict(line.split("=", 1) for line in text.split("\n") if "=" in line)
        if fields.get("FDSTORE") == "1":
            self.store += [(fields.get("FDNAME", "stored"), fd) for fd in fds]
        else:
            for fd in fds:
                os.close(fd)
        if fields.get("FDSTOREREMOVE") == "1":
            gone = [fd for name, fd in self.store if name == fields.get("FDNAME")]
            self.store = [(name, fd) for name, fd in self.store if name != fields.get("FDNAME")]
            for fd in gone:
                os.close(fd)
        self.messages.append(text)

    def drain(self) -> None:
        """Take in whatever is queued (fd-store messages sent after READY)."""
        while self.sock.fileno() != -1:
            try:
                self._receive(0.05)
            except TimeoutError:
                return

    def wait_for(self, field: str, timeout: float, proc: subprocess.Popen | None = None) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(field in m.split("\n") for m in self.messages):
                return next(m for m in self.messages if field in m.split("\n"))
            try:
                self._receive(0.2)
            except TimeoutError:
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(f"daemon exited with {proc.returncode} before {field}") from None
        raise TimeoutError(f"no {field} within {timeout}s; got {self.messages}")

    def stored_names(self) -> list[str]:
        self.drain()
        return [name for name, _ in self.store]

    def close(self, keep_store: bool = False) -> None:
        self.drain()
        self.sock.close()
        if not keep_store:
            for _, fd in self.store:
                os.close(fd)
            self.store = []


# Puts the fds named in WCACHED_TEST_FDS at 3, 4, ... and sets LISTEN_PID to
# its own pid before exec'ing the daemon: what systemd does for a unit.
_LISTEN_EXEC = """
import fcntl, os, sys
fds = [int(x) for x in os.environ.pop("WCACHED_TEST_FDS").split(",") if x]
high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 3 + len(fds) + 64) for fd in fds]
for fd in fds:
    os.close(fd)
for i, fd in enumerate(high):
    os.dup2(fd, 3 + i)
    os.close(fd)
os.environ["LISTEN_PID"] = str(os.getpid())
os.environ["LISTEN_FDS"] = str(len(fds))
os.execv(sys.executable, [sys.executable, *sys.argv[1:]])
"""


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

    def wait_exit(self, timeout: float) -> int:
        """Its exit status, reading its notify messages meanwhile as systemd
        does (a queue nobody reads would hold up its fd-store messages)."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.proc.args, timeout)
            self.notify.drain()
            time.sleep(0.05)
        self.notify.drain()
        return self.proc.returncode

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout)


def start_daemon(
    config: Path,
    instance: str = "cpu0",
    env: dict | None = None,
    work: Path | None = None,
    store_from: NotifyListener | None = None,
    rlimits: dict[int, int] | None = None,
    user: str | None = None,
) -> Daemon:
    """A daemon process; ``store_from``: the notify listener of a previous
    daemon of this instance, whose fd store this one gets (as after a restart);
    ``rlimits``: resource limits (``resource.RLIMIT_*`` -> value) for the
    daemon and its worker; ``user``: the user it runs as (with that user's
    primary group only, as the unit's User= does)."""
    work = work or config.parent
    notify = NotifyListener(work)
    as_user: dict = {}
    if user is not None:
        import pwd

        pw = pwd.getpwnam(user)
        as_user = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": [], "cwd": "/"}
        os.chmod(notify.path, 0o666)  # systemd's socket: any service may send to it
    log_path = work / f"daemon-{instance}-{time.monotonic_ns()}.log"
    from wcached.config import load_config

    sdir = load_config(config).daemon.socket_dir
    full_env = {**os.environ, "NOTIFY_SOCKET": notify.path, "PYTHONUNBUFFERED": "1", **(env or {})}
    argv = [sys.executable, "-m", "wcached", "serve", instance, "--config", str(config)]
    pass_fds: list[int] = []
    if store_from is not None:
        store_from.drain()
        notify.store = store_from.store
        store_from.store = []
        pass_fds = [fd for _, fd in notify.store]
        full_env["WCACHED_TEST_FDS"] = ",".join(map(str, pass_fds))
        full_env["LISTEN_FDNAMES"] = ":".join(name for name, _ in notify.store)
        argv = [sys.executable, "-c", _LISTEN_EXEC, *argv[1:]]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            pass_fds=pass_fds,
            preexec_fn=(lambda: _set_rlimits(rlimits)) if rlimits else None,
            **as_user,
        )
    from wcached.device import resolve_instance

    sock = os.path.join(sdir, f"{resolve_instance(instance).instance_id}.sock")
    return Daemon(proc, sock, log_path, notify, sdir)


def _set_rlimits(limits: dict[int, int]) -> None:
    import resource

    for which, value in limits.items():
        resource.setrlimit(which, (value, value))


def wait_ready(d: Daemon, timeout: float) -> None:
    """Until the daemon said READY=1; its log in the error if it never does."""
    try:
        d.notify.wait_for("READY=1", timeout, d.proc)
    except (RuntimeError, TimeoutError) as e:
        raise RuntimeError(f"{e}\n--- daemon log ---\n{d.log()[-8000:]}") from None


@contextlib.contextmanager
def run_daemon(
    config: Path,
    instance: str = "cpu0",
    env: dict | None = None,
    timeout: float = 60,
    user: str | None = None,
) -> Iterator[Daemon]:
    """A real daemon process, yielded once it reported READY=1."""
    d = start_daemon(config, instance, env, user=user)
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


_PASSED_TO_OTHER_USERS = ("MUTANT_UNDER_TEST", "COVERAGE_PROCESS_START", "PYTEST_CURRENT_TEST")


def run_as(
    user: str, argv: list[str], timeout: float = 120, extra_groups: list[int] | None = None
) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``user`` from ``/``: its primary group, plus
    ``extra_groups`` as supplementary groups (none by default)."""
    import pwd

    pw = pwd.getpwnam(user)
    env = {"HOME": "/tmp", "PATH": os.environ.get("PATH", "")}
    # wcached from this tree (where it is not installed into the interpreter),
    # then what the GPU machine carries this way.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    # The mutation score's switches (tests/mutations/score.py): the mutant
    # under test and coverage's start follow the code into the other user.
    env.update({k: os.environ[k] for k in _PASSED_TO_OTHER_USERS if k in os.environ})
    return subprocess.run(
        argv,
        user=pw.pw_uid,
        group=pw.pw_gid,
        extra_groups=list(extra_groups or []),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
    )


# A user of the suite's own: the daemon runs as it where a test needs a
# daemon that is not root (its own-user rules are invisible to root). .ci/run
# creates it; `make test-user` does the same on a development machine.
TEST_USER = "wcached-test"


def require_test_user() -> None:
    """Skip without the suite's own user (and root to switch to it); under
    CI=true, where .ci/run creates it, fail."""
    import pwd

    try:
        pwd.getpwnam(TEST_USER)
        if other_users_can_run_python():
            return
    except KeyError:
        pass
    import pytest

    if os.environ.get("CI") == "true":
        pytest.fail(f"CI runs as root with the user {TEST_USER} (.ci/run creates it)")
    pytest.skip(f"needs root and the user {TEST_USER} (make test-user)")


def other_users_can_run_python() -> bool:
    """Root, an interpreter outside /root, and the users nobody and daemon."""
    import pwd

    try:
        pwd.getpwnam("nobody")
        pwd.getpwnam("daemon")
    except KeyError:
        return False
    return os.getuid() == 0 and not sys.executable.startswith("/root")


def fill_backlog(path: str) -> list[socket.socket]:
    """Connect to the Unix socket at ``path`` without blocking until its
    listen backlog is full (the kernel queues each connect): the sockets
    queued, for the caller to close."""
    queued = []
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.setblocking(False)
        try:
            s.connect(path)
        except BlockingIOError:
            s.close()
            return queued
        queued.append(s)


def open_fds() -> dict[int, str]:
    """This process's open fds and what each is open to (its /proc link)."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except FileNotFoundError:
            continue  # the listing's own fd, closed by now
    return out


def fds_opened_since(before: dict[int, str]) -> dict[int, str]:
    """The fds open now that were not open at ``before`` (or are open to
    another file by now): what the code under test left open. An fd that
    something else in the process closed meanwhile (a socket of an earlier
    test collected as garbage, a thread winding down) is not a leak, so a
    test asks this, never whether the whole set is unchanged."""
    return {fd: what for fd, what in open_fds().items() if before.get(fd) != what}


@contextlib.contextmanager
def peer_as(uid: int, gid: int) -> Iterator[tuple[socket.socket, int]]:
    """A connection accepted from a child process running as ``uid``/``gid``
    (ids no user database need list), and the child's pid. Needs root; fails
    rather than skips under CI=true, which runs as root."""
    if os.getuid() != 0:
        import pytest

        if os.environ.get("CI") == "true":
            pytest.fail("CI runs as root")
        pytest.skip("needs root to run a process as another uid")
    # The abstract namespace: no file whose permissions the child must pass.
    name = f"\0wcached-test-peer-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(name)
        server.listen(1)
        pid = os.fork()
        if pid == 0:  # the child: connect as the other ids, hold until the parent closes
            try:
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
                    c.connect(name)
                    c.recv(1)
            finally:
                os._exit(0)
        try:
            server.settimeout(10)
            conn, _ = server.accept()
            with conn:
                yield conn, pid
        finally:
            os.waitpid(pid, 0)
