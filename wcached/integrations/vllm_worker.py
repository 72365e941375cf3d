"""``--worker-cls wcached.integrations.vllm_worker.Worker``: a GPU KV cache
sized as if the engine had loaded the weights it maps from wcached, on vLLM
releases without the external-weight hook (0.26, 0.27).

vLLM sizes the KV cache from a budget taken at start-up, ``ceil(total *
gpu_memory_utilization)``, less what the engine then allocates (its weights
among it). Weights mapped from the daemon are allocated by the daemon before
that budget is taken, so they are in no term: such an engine would get the
weights' bytes again as KV cache, or be refused at start-up because free
memory is below the budget. vLLM 0.32 asks the model loader
(``BaseModelLoader.get_external_weight_memory``) and takes its answer off
the budget; this worker does the same on the releases before the hook, by
answering the budget vLLM's ``init_device`` asks ``request_memory`` for. On a
vLLM that has the hook it changes nothing (the loader's hook counts the
weights, once).

Read from vLLM's sources (0.26.0, 0.27.1, 0.32.0): ``Worker.init_device``
calls the module-level ``request_memory(init_snapshot, cache_config)`` of
``vllm/v1/worker/gpu_worker.py`` once, and ``determine_available_memory``
gives the KV cache ``requested_memory`` less what the engine allocated; the
class is resolved by name in each worker process (``worker_cls``, no type
check), after the general plugins (wcached's loader among them) are loaded.
"""

from __future__ import annotations

import gc
import math
from typing import Any

from vllm.model_executor.model_loader import get_model_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.v1.worker import gpu_worker

from wcached.integrations.vllm import LOAD_FORMAT, log

GIB = 2**30
# vLLM 0.32 and later count external weights through the loader's hook.
VLLM_COUNTS_EXTERNAL_WEIGHTS = hasattr(BaseModelLoader, "get_external_weight_memory")


def engine_budget(total: int, free: int, utilization: float, external: int) -> int:
    """The bytes an engine may allocate (its own weights, activations, KV
    cache) when ``external`` bytes of its weights live in another process's
    memory: vLLM 0.32's rule (``request_memory``), for releases before it."""
    requested = math.ceil(total * utilization)
    engine = requested - external
    if engine <= 0:
        raise ValueError(
            f"the {external / GIB:.2f} GiB of weights mapped from wcached are at least "
            f"gpu_memory_utilization={utilization} of this GPU ({requested / GIB:.2f} GiB): "
            "raise gpu_memory_utilization"
        )
    if free < engine:
        raise ValueError(
            f"free memory on this GPU ({free / GIB:.2f}/{total / GIB:.2f} GiB) at start-up is less "
            f"than the engine's share of gpu_memory_utilization={utilization} "
            f"({requested / GIB:.2f} GiB less {external / GIB:.2f} GiB of weights mapped from "
            f"wcached = {engine / GIB:.2f} GiB): lower gpu_memory_utilization or free memory "
            "used by other processes"
        )
    return engine


class Worker(gpu_worker.Worker):
    """vLLM's GPU worker, whose memory budget leaves out the weights mapped
    from wcached (with ``--load-format wcache``; otherwise unchanged)."""

    def init_device(self) -> None:
        if VLLM_COUNTS_EXTERNAL_WEIGHTS:
            super().init_device()
            return
        external_of = getattr(get_model_loader(self.load_config), "get_external_weight_memory", None)
        if external_of is None:  # not wcached's loader: nothing is mapped
            super().init_device()
            return

        def request_memory(init_snapshot: Any, cache_config: Any) -> int:
            # Attaches (the attachment waits for load_model); 0 when the
            # weights will come from disk or be copied: vLLM's own rule then.
            external = external_of(self.vllm_config)
            if not external:
                return asked(init_snapshot, cache_config)
            budget = engine_budget(
                init_snapshot.total_memory,
                init_snapshot.free_memory,
                cache_config.gpu_memory_utilization,
                external,
            )
            log.info(
                "wcached: %.2f GiB of weights are mapped from wcached: of the %.2f GiB "
                "gpu_memory_utilization=%s allows, %.2f GiB remain for the engine",
                external / GIB,
                (budget + external) / GIB,
                cache_config.gpu_memory_utilization,
                budget / GIB,
            )
            return budget

        asked, gpu_worker.request_memory = gpu_worker.request_memory, request_memory
        try:
            super().init_device()
        finally:
            gpu_worker.request_memory = asked

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        if self.load_config.load_format == LOAD_FORMAT:
            freeze_young_collected_heap()
        super().load_model(*args, **kwargs)


def freeze_young_collected_heap() -> None:
    """Mark the worker's start-up heap as static (``gc.freeze``) before vLLM
    times the model load.

    vLLM 0.26's default (V2) model runner starts the clock of "Model loading
    took" before its memory profiler's first ``gc.collect()``, which walks
    the whole start-up heap (~650k objects with vLLM imported, ~0.32 s on
    the H200 host) before any loader code runs, so no loader can spare it
    (docs/vllm-fill-and-kv-plan.md, item 5). Frozen here, that collection
    scans only what was made since. Only the young generations are
    collected first (milliseconds): cyclic garbage already in the oldest
    generation stays until vLLM unfreezes the heap at shutdown, as it
    would have under vLLM's own ``freeze_gc_heap`` had it been made after
    its collection. The amount is measured by bench/vllm_load_profile.py
    ("garbage_frozen")."""
    gc.collect(1)
    gc.freeze()
