"""A full garbage collection in a process that has imported what a vLLM
engine imports, before and after ``gc.freeze()``: the cost vLLM's memory
profiler pays three times around a GPU model load, and what the plugin's
freeze at the start of the load leaves of it
(:func:`wcached.integrations.vllm_bind.freeze_collected_heap`).

    build/vllm-venv/bin/python bench/gc_after_import.py
    PYTHONPATH=/var/tmp/site python3 bench/gc_after_import.py   # GPU host
"""

from __future__ import annotations

import gc
import importlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The modules an engine worker has imported by the time it loads a model.
ENGINE_MODULES = (
    "torch",
    "vllm",
    "vllm.v1.engine.core",
    "vllm.v1.worker.gpu_model_runner",
    "vllm.model_executor.model_loader.utils",
)


def collect_ms() -> float:
    t0 = time.perf_counter()
    gc.collect()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    from common import copy_to_out, write_result

    for name in ENGINE_MODULES:
        importlib.import_module(name)
    tracked = len(gc.get_objects())
    before = [collect_ms() for _ in range(3)]
    gc.freeze()
    # What a model build makes meanwhile: young objects the collections
    # after the load still scan.
    made = [{"layer": [i]} for i in range(20000)]
    after = [collect_ms() for _ in range(3)]
    del made
    result = {
        "tracked_objects": tracked,
        "frozen_objects": gc.get_freeze_count(),
        "collect_ms_before_freeze": before,
        "collect_ms_after_freeze": after,
    }
    table = (
        f"{tracked} objects tracked after the engine's imports.\n\n"
        "| full collection | median ms |\n|---|---|\n"
        f"| before gc.freeze() | {statistics.median(before):.1f} |\n"
        f"| after gc.freeze(), 20,000 young objects made | {statistics.median(after):.1f} |\n"
    )
    base = write_result("gc-after-import", result, table)
    copy_to_out(base)
    print(table)


if __name__ == "__main__":
    main()
