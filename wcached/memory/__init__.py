"""Memory backends: where segments live (host memfds or CUDA VMM allocations)."""

from __future__ import annotations

from wcached.memory.base import MemoryBackend


def get_backend(name: str, device: str = "") -> MemoryBackend:
    """Backend by name, for ``device`` (canonical instance id such as
    ``GPU-<uuid>``); the CUDA one is imported only when asked for."""
    if name == "host":
        from wcached.memory.host import HostBackend

        return HostBackend()
    if name == "cuda":
        from wcached.memory.cuda import CudaBackend

        return CudaBackend(device)
    raise ValueError(f"unknown memory backend {name!r}")
