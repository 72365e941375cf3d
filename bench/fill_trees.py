"""Warm fills of the same checkpoints by daemons of several source trees, in
turn (side by side on one machine, one run): what a change to the fill path
gains, phase by phase.

    python3 bench/fill_trees.py --trees OLD NEW [--rounds 5] [--data DIR] [--device 0]

Each tree's daemon (and its loader worker) imports wcached from that tree
(its PYTHONPATH first; run it from a directory holding no ``wcached``). The
checkpoints are bench/attach_cuda.py's (made there if missing); the page
cache is warmed by one untimed read of every file first.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attach_cuda import fill_seconds, generate, many_shapes
from common import DATA, LLAMA8B, copy_to_out, write_result

from tests.helpers import run_daemon, write_config
from wcached.cli.demo import llama_shapes

SETS = {"llama8b": (lambda: llama_shapes(LLAMA8B), 4), "many": (many_shapes, 2)}


def warm(ckpt: Path) -> None:
    for f in sorted(ckpt.glob("*.safetensors")):
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass


def one_fill(tree: str, ckpt: Path, device: str) -> tuple[float, dict]:
    work = Path(tempfile.mkdtemp(prefix="wcached-fill-trees-"))
    cfg = write_config(
        work / "wcached.toml",
        models=[{"name": "default", "path": str(ckpt)}],
        daemon={"socket_dir": str(work / "run")},
    )
    env = {"PYTHONPATH": os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH", "")) if p)}
    phases: dict = {}
    try:
        with run_daemon(cfg, device, env=env, timeout=900) as d:
            seconds = fill_seconds(d.socket_dir, device, phases)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return seconds, phases


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trees", nargs="+", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--device", default="0")
    p.add_argument("--only", choices=sorted(SETS))
    args = p.parse_args()
    # Each tree by its folder's name, or by its position where two share one.
    names = [Path(t).name for t in args.trees]
    labels = [n if names.count(n) == 1 else f"{i}:{n}" for i, n in enumerate(names)]
    results: dict = {}
    lines = []
    for name, (shapes, shards) in SETS.items():
        if args.only and name != args.only:
            continue
        ckpt = Path(args.data) / name
        generate(ckpt, shapes(), shards)
        nbytes = sum(f.stat().st_size for f in ckpt.glob("*.safetensors"))
        warm(ckpt)
        runs: dict[str, list] = {label: [] for label in labels}
        for _ in range(args.rounds):
            for tree, label in zip(args.trees, labels, strict=True):
                seconds, phases = one_fill(tree, ckpt, args.device)
                runs[label].append({"s": seconds, "phases": phases})
                print(name, label, round(seconds, 4), phases, flush=True)
        res = {}
        for label, got in runs.items():
            med = statistics.median(r["s"] for r in got)
            names = sorted({k for r in got for k in r["phases"]})
            res[label] = {
                "fill_s": [round(r["s"], 4) for r in got],
                "median_s": round(med, 4),
                "GBps": round(nbytes / med / 1e9, 2),
                "median_phases": {
                    k: round(statistics.median(r["phases"].get(k, 0.0) for r in got), 4) for k in names
                },
            }
        results[name] = {"bytes": nbytes, "trees": res}
        lines.append(f"\n### {name} ({nbytes / 1e9:.2f} GB)\n")
        phase_names = sorted({k for v in res.values() for k in v["median_phases"]})
        lines.append("| tree | fill (median s) | GB/s | " + " | ".join(phase_names) + " |")
        lines.append("|---|---|---|" + "---|" * len(phase_names))
        for label, v in res.items():
            cells = " | ".join(f"{v['median_phases'].get(k, 0.0):.4f}" for k in phase_names)
            lines.append(f"| {label} | {v['median_s']:.4f} | {v['GBps']} | {cells} |")
        if len(labels) == 2:
            a, b = (res[label]["median_s"] for label in labels)
            lines.append(f"\n{labels[1]} / {labels[0]} fill time: {b / a:.2f}")
    text = (
        "\n".join(lines)
        + f"\n\nTrees alternating each round: {', '.join(args.trees)}; {args.rounds} rounds.\n"
    )
    path = write_result(
        f"fill-trees-{args.device}", {"results": results, "trees": args.trees, "rounds": args.rounds}, text
    )
    print(text)
    print("written", path)
    copy_to_out(path)


if __name__ == "__main__":
    main()
