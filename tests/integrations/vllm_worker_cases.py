"""wcached's GPU worker class against a real vLLM's gpu_worker module (run
with vLLM's interpreter by tests/integrations/test_vllm.py; no GPU needed).

vLLM's own ``Worker.init_device`` needs a GPU; what the worker class relies
on in it is checked in its source (it asks the module-level
``request_memory`` for the budget), and the rest by a stand-in that asks as
it does. Prints ``OK <vllm version>`` when every case held."""

from __future__ import annotations

import gc
import inspect
import math
import re
import sys
import types

import vllm
from vllm.model_executor.model_loader.base_loader import BaseModelLoader
from vllm.v1.worker import gpu_worker

import wcached.integrations.vllm_worker as vw

GIB = 2**30
HOOK = hasattr(BaseModelLoader, "get_external_weight_memory")


def check_vllm_asks_the_module_global() -> None:
    source = inspect.getsource(gpu_worker.Worker.init_device)
    args = r"init_snapshot,\s*self\.cache_config" + (r",\s*external_weight_memory" if HOOK else r"\s*\)")
    assert re.search(r"self\.requested_memory = request_memory\(\s*" + args, source), source
    assert callable(gpu_worker.request_memory)
    budget = inspect.getsource(gpu_worker.Worker.determine_available_memory)
    assert "self.requested_memory" in budget and "available_kv_cache_memory_bytes" in budget
    assert vw.VLLM_COUNTS_EXTERNAL_WEIGHTS is HOOK


class FakeLoader:
    def __init__(self, external: int):
        self.external = external
        self.asked = 0

    def get_external_weight_memory(self, vllm_config) -> int:
        self.asked += 1
        return self.external


def start(loader, total: int, free: int, util: float) -> tuple[vw.Worker, int]:
    """A vw.Worker whose parent init_device asks gpu_worker.request_memory as
    vLLM's does; returns it and how many times vLLM's own request_memory ran."""
    snapshot = types.SimpleNamespace(total_memory=total, free_memory=free, device_="cuda:0")
    cache_config = types.SimpleNamespace(gpu_memory_utilization=util)
    own = []

    def vllm_request_memory(init_snapshot, cache_config, *rest):
        own.append(rest)
        return math.ceil(init_snapshot.total_memory * cache_config.gpu_memory_utilization)

    def parent_init_device(self) -> None:
        self.init_snapshot = snapshot
        self.requested_memory = gpu_worker.request_memory(snapshot, self.cache_config)

    worker = vw.Worker.__new__(vw.Worker)
    worker.load_config = types.SimpleNamespace(load_format="wcache")
    worker.vllm_config = types.SimpleNamespace()
    worker.cache_config = cache_config
    saved = (gpu_worker.Worker.init_device, gpu_worker.request_memory, vw.get_model_loader)
    gpu_worker.Worker.init_device = parent_init_device
    gpu_worker.request_memory = vllm_request_memory
    vw.get_model_loader = lambda load_config: loader
    try:
        worker.init_device()
        assert gpu_worker.request_memory is vllm_request_memory, "request_memory not put back"
    finally:
        gpu_worker.Worker.init_device, gpu_worker.request_memory, vw.get_model_loader = saved
    return worker, len(own)


def check_budget() -> None:
    total = 140 * GIB
    if HOOK:
        # vLLM counts through the loader's hook: the worker adds nothing.
        loader = FakeLoader(13 * GIB)
        worker, own = start(loader, total, 126 * GIB, 0.9)
        assert loader.asked == 0 and own == 1
        assert worker.requested_memory == math.ceil(total * 0.9)
        return
    # Weights mapped: the budget is the utilization's less the weights, and
    # an engine beside its daemon's 13 GiB starts at 0.9 (126 GiB free).
    loader = FakeLoader(13 * GIB)
    worker, own = start(loader, total, 126 * GIB, 0.9)
    assert loader.asked == 1 and own == 0
    assert worker.requested_memory == math.ceil(total * 0.9) - 13 * GIB
    # Nothing mapped (disk fallback, copy mode): vLLM's own rule and check.
    worker, own = start(FakeLoader(0), total, 126 * GIB, 0.9)
    assert own == 1 and worker.requested_memory == math.ceil(total * 0.9)
    # Not wcached's loader: vLLM's worker exactly.
    worker, own = start(object(), total, 126 * GIB, 0.9)
    assert own == 1 and worker.requested_memory == math.ceil(total * 0.9)
    # Too little free memory even for the engine's share: refused, saying so.
    try:
        start(FakeLoader(13 * GIB), total, 100 * GIB, 0.9)
    except ValueError as e:
        assert "free memory on this GPU (100.00/140.00 GiB)" in str(e), e
        assert "113.00 GiB" in str(e) and "13.00 GiB of weights mapped from wcached" in str(e), e
    else:
        raise AssertionError("an engine without the memory it needs started")
    # Weights of more than the whole budget: refused.
    try:
        start(FakeLoader(30 * GIB), total, 126 * GIB, 0.2)
    except ValueError as e:
        assert "raise gpu_memory_utilization" in str(e), e
    else:
        raise AssertionError("a budget of no bytes was accepted")


def check_heap_frozen_before_the_runner_loads() -> None:
    """vLLM's worker loads through its runner, whose memory profiler (and
    the clock of "Model loading took") starts inside the call: a heap frozen
    in the worker's load_model is frozen before the profiler collects it.
    Frozen only for wcached's loader."""
    source = inspect.getsource(gpu_worker.Worker.load_model)
    assert re.search(r"self\.model_runner\.load_model\(", source), source
    for load_format, frozen in (("wcache", True), ("auto", False)):
        seen = []
        worker = vw.Worker.__new__(vw.Worker)
        worker.load_config = types.SimpleNamespace(load_format=load_format)
        saved = gpu_worker.Worker.load_model
        gpu_worker.Worker.load_model = lambda self, seen=seen: seen.append(gc.get_freeze_count())
        gc.unfreeze()
        try:
            worker.load_model()
        finally:
            gpu_worker.Worker.load_model = saved
            gc.unfreeze()
        assert len(seen) == 1, f"vLLM's load_model ran {len(seen)} times"
        assert (seen[0] > 0) is frozen, (load_format, seen)


def main() -> None:
    check_vllm_asks_the_module_global()
    check_budget()
    check_heap_frozen_before_the_runner_loads()
    print("OK", vllm.__version__)


if __name__ == "__main__":
    sys.exit(main())
