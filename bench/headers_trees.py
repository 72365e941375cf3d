"""``Checkpoint.headers()`` of the same checkpoint by several source trees,
each in fresh processes, trees alternating: what a change to the header
path gains, apart from the rest of a fill (whose reading phase drowns a
few milliseconds on a small machine).

    python3 bench/headers_trees.py --trees OLD NEW [--rounds 5] [--calls 15] [--data DIR]

Each process imports wcached from its tree, reads the page-cached headers
``--calls`` times and reports the first call (what a fresh loader worker
pays) and the median of the others.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, copy_to_out, write_result

CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from wcached.loaders.checkpoint import Checkpoint
times = []
for _ in range(int(sys.argv[3])):
    t = time.perf_counter()
    h = Checkpoint(sys.argv[2]).headers()
    times.append(time.perf_counter() - t)
print(json.dumps({"tensors": len(h.tensors), "times": times}))
"""


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trees", nargs="+", required=True)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--calls", type=int, default=15)
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--set", default="many", help="a checkpoint under --data (bench/attach_cuda.py's)")
    args = p.parse_args()
    ckpt = Path(args.data) / args.set
    if not ckpt.exists():
        from attach_cuda import generate, many_shapes

        generate(ckpt, many_shapes(), 2)
    runs: dict[str, list[dict]] = {t: [] for t in args.trees}
    for _ in range(args.rounds):
        for tree in args.trees:
            out = subprocess.run(
                [sys.executable, "-c", CHILD, tree, str(ckpt), str(args.calls)],
                capture_output=True,
                text=True,
                check=True,
                cwd="/",
            ).stdout
            runs[tree].append(json.loads(out))
    tensors = runs[args.trees[0]][0]["tensors"]
    rows = []
    for tree, rs in runs.items():
        first = statistics.median(r["times"][0] for r in rs)
        rest = statistics.median(t for r in rs for t in r["times"][1:])
        rows.append((tree, first, rest))
    lines = [
        f"Checkpoint.headers() of {args.set} ({tensors} tensors), page cache warm; "
        f"{args.rounds} fresh processes per tree, trees alternating, {args.calls} calls each",
        "",
        "| tree | first call in a process (median ms) | later calls (median ms) |",
        "|---|---|---|",
    ]
    lines += [f"| {tree} | {first * 1e3:.2f} | {rest * 1e3:.2f} |" for tree, first, rest in rows]
    base = rows[0]
    lines += [""] + [
        f"{tree} / {base[0]}: first call {first / base[1]:.2f}, later calls {rest / base[2]:.2f}"
        for tree, first, rest in rows[1:]
    ]
    table = "\n".join(lines)
    print(table)
    copy_to_out(write_result(f"headers-trees-{args.set}", {"runs": runs}, table))


if __name__ == "__main__":
    main()
