"""Loader worker: the only process that touches checkpoints and device memory.

The daemon spawns ``python -m wcached.loaders.worker FD`` with one end of a
socketpair, sends a :class:`FillJob`, and receives per model a
:class:`ModelFilled` frame followed by the segment fds. Then this process
exits, and with it any torch state or CUDA context it created: the daemon keeps
only file descriptors.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import sys
import time

from wcached.errors import EX_SOFTWARE, OutOfMemory, WcacheError
from wcached.log import setup_logging
from wcached.protocol.messages import (
    FillDone,
    FillFailed,
    FillJob,
    FillProgress,
    ModelFilled,
    WorkerMessage,
)
from wcached.protocol.wire import MAX_REPLY_BYTES, Channel, close_fds

log = logging.getLogger("wcached.worker")
PROGRESS_INTERVAL_S = 0.5


def run(chan: Channel) -> None:
    from wcached.loaders.base import get_loader, model_from_builtins
    from wcached.memory import get_backend

    job = chan.recv(MAX_REPLY_BYTES)
    if not isinstance(job, FillJob):
        raise WcacheError(f"worker expected a fill job, got {type(job).__name__}")
    backend = get_backend(job.backend, job.instance)
    backend.prepare_fill()
    for raw in job.models:
        model = model_from_builtins(raw)
        last = 0.0

        def progress(done: int, total: int = 0, name: str = model.name) -> None:
            nonlocal last
            now = time.monotonic()
            # The first report (the total) and the last always go out.
            if now - last >= PROGRESS_INTERVAL_S or done == 0 or done == total:
                last = now
                chan.send(FillProgress(model=name, done_bytes=done, total_bytes=total))

        filled = get_loader(model.loader).fill(model, backend, job.instance, progress)
        peak = filled.peak_device_bytes
        log.info(
            "%s filled in %.2f s: %s%s",
            model.name,
            filled.fill_seconds,
            ", ".join(f"{k} {v:.2f} s" for k, v in filled.phases.items()),
            ""
            if peak is None
            else f"; peak device memory {peak / 2**30:.2f} GiB "
            f"({peak / max(filled.manifest.total_bytes, 1):.2f}x the model)",
            extra={"model": model.name},
        )
        try:
            chan.send(
                ModelFilled(
                    manifest=filled.manifest,
                    fd_count=len(filled.fds),
                    fill_seconds=filled.fill_seconds,
                    phases=filled.phases,
                    read_bytes=filled.read_bytes,
                ),
                fds=filled.fds,
            )
        finally:
            # The daemon holds its own duplicates now.
            close_fds(filled.fds)
    close = getattr(backend, "close", None)
    if close is not None:
        close()
    chan.send(FillDone())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    setup_logging(
        os.environ.get("WCACHED_LOG_LEVEL", "info"),
        name="worker",
        instance=os.environ.get("WCACHED_LOG_INSTANCE", ""),
    )
    sock = socket.socket(fileno=int(argv[0]))
    chan = Channel(sock, WorkerMessage)
    try:
        run(chan)
    except WcacheError as e:
        _report(chan, e.code, str(e))
        return e.exit_status
    except MemoryError:
        e = OutOfMemory("out of host memory while filling")
        _report(chan, e.code, str(e))
        return e.exit_status
    except Exception as e:  # report anything to the daemon rather than just dying
        if _is_out_of_memory(e):
            oom = OutOfMemory(f"out of memory while filling: {e}")
            _report(chan, oom.code, str(oom))
            return oom.exit_status
        log.exception("loader worker failed")
        _report(chan, "internal", f"{type(e).__name__}: {e}")
        return EX_SOFTWARE
    finally:
        sock.close()
    return 0


def _is_out_of_memory(e: BaseException) -> bool:
    """torch's OutOfMemoryError (a vLLM fill), or a memfd that could not grow."""
    if type(e).__name__ == "OutOfMemoryError":
        return True
    return isinstance(e, OSError) and e.errno in (errno.ENOMEM, errno.ENOSPC)


def _report(chan: Channel, code: str, message: str) -> None:
    try:
        chan.send(FillFailed(code=code, message=message), timeout=5)
    except (OSError, WcacheError):
        pass


if __name__ == "__main__":
    sys.exit(main())
