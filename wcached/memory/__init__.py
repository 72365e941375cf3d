"""Memory backends: where segments live (host memfds or CUDA VMM allocations)."""

from __future__ import annotations

from wcached.memory.base import MemoryBackend


def get_backend(name: str, device_index: int = 0) -> MemoryBackend:
    """Backend by name; the CUDA one is imported only when asked for."""
    if name == "host":
        from wcached.memory.host import HostBackend

        return HostBackend()
    if name == "cuda":
        from wcached.memory.cuda import CudaBackend

        return CudaBackend(device_index)
    raise ValueError(f"unknown memory backend {name!r}")
