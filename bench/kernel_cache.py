"""What keeping the digest kernel's build on disk saves a fill's worker.

Each round starts two fresh processes (as each fill's worker is one): the
first with an empty cache (NVRTC builds the kernel, then it is kept), the
second with that build kept (loaded, self-checked). Both time
``cuda_digest.available()`` in a current context, which is what a GPU fill
calls before it copies.

python3 bench/kernel_cache.py --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from common import REPO, copy_to_out, write_result

CHILD = """
import time
from wcached.memory.cuda import driver, check
cu = driver()
check(cu.cuInit(0), "cuInit")
dev = check(cu.cuDeviceGet(0), "cuDeviceGet")
ctx = check(cu.cuDevicePrimaryCtxRetain(dev), "retain")
check(cu.cuCtxSetCurrent(ctx), "set")
from wcached.memory import cuda_digest
t0 = time.perf_counter()
why = cuda_digest.available()
print(time.perf_counter() - t0, why)
"""


def once(cache: str) -> float:
    env = dict(
        os.environ,
        XDG_CACHE_HOME=cache,
        PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, check=True)
    seconds, why = r.stdout.split(maxsplit=1)
    if why.strip() != "None":
        raise SystemExit(f"the kernel is not available: {why}")
    return float(seconds)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    built, kept = [], []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as cache:
            built.append(once(cache))
            kept.append(once(cache))
    res = {
        "built_ms": round(statistics.median(built) * 1e3, 2),
        "kept_ms": round(statistics.median(kept) * 1e3, 2),
        "rounds": {"built": built, "kept": kept},
    }
    text = (
        "| digest kernel ready in a fresh worker (median ms) | built by NVRTC | kept build loaded |\n"
        "|---|---|---|\n"
        f"| `cuda_digest.available()` | {res['built_ms']} | {res['kept_ms']} |\n\n"
        f"{args.rounds} rounds of two fresh processes each, side by side.\n"
    )
    print(text)
    copy_to_out(write_result("kernel-cache", res, text))


if __name__ == "__main__":
    main()
