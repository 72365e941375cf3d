"""attach(): hello, attach, import the segment fds, build zero-copy views.

The connection stays open for as long as the :class:`Attachment` lives: it is
the lease the daemon reports in ``wcached status``. The mappings themselves are
owned by the tensors, so tensors kept after :meth:`Attachment.close` stay valid.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

# Both backends' modules now, not inside an engine's first attach (~1.5 ms
# on a 2-core host); neither imports torch or a CUDA library at import.
import wcached.memory.cuda
import wcached.memory.host  # noqa: F401
from wcached.client.connection import DaemonConnection, find_socket_dir, gc_paused, socket_path
from wcached.client.lease import LeaseWatch
from wcached.errors import ProtocolError
from wcached.memory import get_backend
from wcached.protocol.messages import Manifest, TensorRun
from wcached.protocol.runs import runs_of
from wcached.protocol.wire import close_fds

if TYPE_CHECKING:
    import torch


class Attachment:
    def __init__(
        self,
        conn: DaemonConnection,
        manifest: Manifest,
        tensors: dict[str, torch.Tensor],
        mapped: Any,
    ):
        self.connection = conn
        self.manifest = manifest
        self.tensors = tensors
        self._mapped = mapped
        self._lock = threading.Lock()
        self.watch: LeaseWatch | None = None

    def replace_connection(self, conn: DaemonConnection) -> bool:
        """Hold ``conn`` as the lease from now on (after the daemon restarted);
        False if the attachment was closed meanwhile."""
        with self._lock:
            if self._mapped is None:
                return False
            old, self.connection = self.connection, conn
        old.close()
        return True

    @property
    def closed(self) -> bool:
        return self._mapped is None

    def close(self) -> None:
        """End the lease; tensors still referenced keep their memory mapped."""
        if self.watch is not None:
            self.watch.stop()
        with self._lock:
            if self._mapped is None:
                return
            self._mapped.close()
            self._mapped = None
            self.connection.close()

    def __enter__(self) -> Attachment:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def attach(
    model: str = "default",
    instance: str = "cpu0",
    *,
    socket_dir: str | None = None,
    config: str | None = None,
    expect: dict[str, str | int] | None = None,
    timeout: float = 10.0,
    client: str | None = None,
    keep_lease: bool = True,
) -> Attachment:
    """Attach read-only to ``model`` held by the daemon of ``instance``.

    ``expect`` holds the cache key fields the caller requires (``dtype``,
    ``fingerprint``, ``tp_rank``, ``extra.<name>``...); a difference raises
    :class:`KeyMismatch` naming the fields. With ``keep_lease`` a watcher
    thread attaches again when the daemon restarts, so the lease follows a
    restored daemon (:mod:`wcached.client.lease`).
    """
    path = socket_path(instance, find_socket_dir(socket_dir, config))
    conn, manifest, fds = DaemonConnection.attaching(
        path,
        model,
        expect,
        timeout=timeout,
        client=client,
        # The process's lease watcher thread (made on its first attach)
        # starts while the daemon answers, not after.
        meanwhile=LeaseWatch.prepare if keep_lease else None,
    )
    try:
        try:
            backends = {s.backend for s in manifest.segments}
            if len(backends) != 1:
                raise ProtocolError(f"segments of several backends: {sorted(backends)}")
            backend = get_backend(backends.pop(), manifest.segments[0].device)
            mapped = backend.map_segments(fds, manifest.segments)
        finally:
            # Mappings (host) or imported handles (cuda) now hold the memory.
            close_fds(fds)
        with gc_paused():
            tensors = build_views(manifest, mapped.tensors)
        attachment = Attachment(conn, manifest, tensors, mapped)
        if keep_lease:
            attachment.watch = LeaseWatch(attachment, dict(expect or {}), client)
        return attachment
    except BaseException:
        conn.close()
        raise


def build_views(manifest: Manifest, segments: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """One view per manifest entry into the segments' byte tensors (no copy).

    Per-tensor cost is what bounds attach for checkpoints of many small
    tensors (MoE experts), so views are made over a typed view of each
    segment, and a run of same-shaped tensors at evenly spaced offsets (the
    experts of a layer) becomes one strided view split by ``unbind`` in C++.
    A manifest that came as runs (protocol 3) is viewed run by run without
    making its entries; an older daemon's entries are grouped first.
    """
    import torch

    as_strided = torch.Tensor.as_strided
    # (segment, dtype) -> (typed view of the segment, itemsize, size in bytes)
    typed: dict[tuple[int, str], tuple[torch.Tensor, int, int]] = {}
    views: dict[str, torch.Tensor] = {}
    for run in runs_of(manifest):
        names = run.names
        entry = typed.get((run.segment, run.dtype))
        if entry is None:
            entry = typed[(run.segment, run.dtype)] = _typed_segment(segments, run)
        base, size, limit = entry
        offset, step, count = run.offset, run.step, len(names)
        bad = _first_outside(offset, step, count, run.nbytes, size, limit)
        if bad is not None:
            raise ProtocolError(f"tensor {names[bad]!r} lies outside segment {run.segment}")
        if count == 1:
            views[names[0]] = as_strided(base, run.shape, run.stride, offset // size)
        else:
            block = as_strided(base, (count, *run.shape), (step // size, *run.stride), offset // size)
            views.update(zip(names, block.unbind(0), strict=True))
    return views


def _first_outside(offset: int, step: int, count: int, nbytes: int, size: int, limit: int) -> int | None:
    """The index of a run's first entry that is misaligned or not inside
    ``limit`` bytes, or None (``check_run`` made ``step`` positive for runs
    of more than one)."""
    if offset % size or offset < 0 or offset + nbytes > limit:
        return 0
    if count == 1:
        return None
    if step % size:
        return 1
    if offset + (count - 1) * step + nbytes <= limit:
        return None
    return (limit - nbytes - offset) // step + 1


def _typed_segment(segments: list[torch.Tensor], run: TensorRun) -> tuple[torch.Tensor, int, int]:
    import torch

    name = run.names[0]
    if not 0 <= run.segment < len(segments):
        raise ProtocolError(f"tensor {name!r} names missing segment {run.segment}")
    dtype = getattr(torch, run.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ProtocolError(f"tensor {name!r}: unknown dtype {run.dtype!r}")
    seg = segments[run.segment]
    size = dtype.itemsize
    usable = seg.numel() // size * size
    return seg[:usable].view(dtype), size, usable
