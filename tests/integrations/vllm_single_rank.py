"""One process as a whole vLLM world of one rank, for the scripts that call
vLLM's loader code outside an engine (vllm_key_variants.py,
vllm_loader_cases.py; imported as a sibling module, with vLLM's interpreter)."""

from __future__ import annotations

import socket


def join_single_rank_world() -> None:
    """The tensor/pipeline-parallel groups of one rank over gloo; call once,
    inside ``set_current_vllm_config``."""
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init_distributed_environment(1, 0, f"tcp://127.0.0.1:{port}", 0, backend="gloo")
    ensure_model_parallel_initialized(1, 1)


def become_cpu_worker() -> None:
    """What vLLM's CPU model runner does before loading: torch.accelerator
    calls (vLLM's loaders empty its cache) become no-ops, and the workspace
    manager exists."""
    import torch

    try:
        from vllm.v1.worker.cpu_model_runner import _set_torch_accelerator_to_noop

        _set_torch_accelerator_to_noop()
    except ImportError:  # older vLLM: nothing to do
        pass
    try:
        from vllm.v1.worker.workspace import init_workspace_manager

        init_workspace_manager(torch.device("cpu"))
    except ImportError:
        pass
