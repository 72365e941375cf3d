"""What pinning a fill's staging buffers costs a fresh worker, per way of
pinning them, and how fast the copy engine reads each kind.

A fill's readers stage through 96 MiB of pinned host memory (8 x 3 x 4 MiB
when this was written, 12 x 2 x 4 MiB since); a fresh worker pins it on
every fill (about 46 ms on an H100 host, bench/results/pin-overlap-20261207,
as ``hostalloc-8threads`` does; the fill does as ``register-thp`` since
2026-12-07, bench/results/pin-cost-20261207). Each variant below runs in a fresh
process (its CUDA context made before the clock starts) and pins 96 MiB:

- ``hostalloc-8threads``: what a fill does today, 8 threads each
  ``cuMemHostAlloc`` three 4 MiB buffers;
- ``hostalloc-24x4M``: the same 24 calls on one thread;
- ``hostalloc-1x96M``: one call for all of it;
- ``register-4k``: anonymous memory faulted in (``MAP_POPULATE``), then
  ``cuMemHostRegister`` (times of both);
- ``register-thp``: the same memory as transparent huge pages
  (``MADV_HUGEPAGE``, one touch per 2 MiB), then ``cuMemHostRegister``.

Each also copies the 96 MiB to the GPU 10 times in 4 MiB chunks on one
stream, to show the copy engine reads every kind as fast.

    python3 bench/pin_cost.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import copy_to_out, write_result

CHUNK = 4 << 20
THREADS = 8
PER_THREAD = 3
NBYTES = THREADS * PER_THREAD * CHUNK
HUGE = 2 << 20
VARIANTS = ("hostalloc-8threads", "hostalloc-24x4M", "hostalloc-1x96M", "register-4k", "register-thp")


def _thp_state() -> str:
    try:
        return Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()
    except OSError as e:
        return f"unreadable: {e}"


def _huge_kib(start: int, nbytes: int) -> int:
    """AnonHugePages of the mapping holding ``start`` (kB), from smaps."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    inside = False
    for line in lines:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= start < hi
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return -1


def child(variant: str) -> dict:
    from cuda.bindings import driver as cu

    def ok(r):
        err = r[0]
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"{variant}: {err}")
        return r[1] if len(r) == 2 else r[1:]

    ok((cu.cuInit(0)[0], None))
    dev = ok(cu.cuDeviceGet(0))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok((cu.cuCtxSetCurrent(ctx)[0], None))
    out: dict = {"variant": variant}
    ptrs: list[int] = []
    keep: list = []
    t = time.perf_counter()
    if variant == "hostalloc-8threads":

        def pin_three() -> None:
            ok((cu.cuCtxSetCurrent(ctx)[0], None))
            for _ in range(PER_THREAD):
                ptrs.append(int(ok(cu.cuMemHostAlloc(CHUNK, 0))))

        ths = [threading.Thread(target=pin_three) for _ in range(THREADS)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
    elif variant == "hostalloc-24x4M":
        for _ in range(THREADS * PER_THREAD):
            ptrs.append(int(ok(cu.cuMemHostAlloc(CHUNK, 0))))
    elif variant == "hostalloc-1x96M":
        base = int(ok(cu.cuMemHostAlloc(NBYTES, 0)))
        ptrs = [base + i * CHUNK for i in range(THREADS * PER_THREAD)]
    else:
        thp = variant == "register-thp"
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | (0 if thp else mmap.MAP_POPULATE)
        mm = mmap.mmap(-1, NBYTES + HUGE, flags=flags)
        keep.append(mm)
        addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        skip = (-addr) % HUGE
        base = addr + skip
        if thp:
            mm.madvise(mmap.MADV_HUGEPAGE, skip, NBYTES)
            for off in range(0, NBYTES, HUGE):  # one fault per huge page
                mm[skip + off] = 1
        out["populate_s"] = time.perf_counter() - t
        r = time.perf_counter()
        ok((cu.cuMemHostRegister(base, NBYTES, 0)[0], None))
        out["register_s"] = time.perf_counter() - r
        out["anon_huge_kib"] = _huge_kib(base, NBYTES)
        ptrs = [base + i * CHUNK for i in range(THREADS * PER_THREAD)]
    out["pin_s"] = time.perf_counter() - t
    # The copy engine reading it: 10 passes of 96 MiB in 4 MiB chunks.
    dst = int(ok(cu.cuMemAlloc(CHUNK * len(ptrs))))
    stream = ok(cu.cuStreamCreate(0))
    ok((cu.cuStreamSynchronize(stream)[0], None))
    t = time.perf_counter()
    for _ in range(10):
        for i, p in enumerate(ptrs):
            ok((cu.cuMemcpyHtoDAsync(dst + i * CHUNK, p, CHUNK, stream)[0], None))
    ok((cu.cuStreamSynchronize(stream)[0], None))
    out["h2d_gbps"] = 10 * NBYTES / (time.perf_counter() - t) / 1e9
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--child")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return
    runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
    for _ in range(args.rounds):
        for v in VARIANTS:  # alternating, so drift on a shared host hits each alike
            p = subprocess.run(
                [sys.executable, __file__, "--child", v], capture_output=True, text=True, check=False
            )
            if p.returncode:
                raise SystemExit(f"{v} failed:\n{p.stderr}")
            runs[v].append(json.loads(p.stdout.strip().splitlines()[-1]))

    def med(v: str, k: str) -> float | None:
        xs = [r[k] for r in runs[v] if k in r]
        return statistics.median(xs) if xs else None

    lines = [
        f"Pinning {NBYTES >> 20} MiB of staging in a fresh process (medians of {args.rounds}); "
        f"transparent_hugepage: {_thp_state()}",
        "",
        "| variant | pinned (ms) | of which faulting in (ms) | register (ms) | AnonHugePages (KiB) "
        "| H2D (GB/s) |",
        "|---|---|---|---|---|---|",
    ]

    def ms(x: float | None) -> str:
        return "" if x is None else f"{x * 1e3:.1f}"

    for v in VARIANTS:
        huge = med(v, "anon_huge_kib")
        lines.append(
            f"| {v} | {ms(med(v, 'pin_s'))} | {ms(med(v, 'populate_s'))} | {ms(med(v, 'register_s'))} | "
            f"{'' if huge is None else int(huge)} | {med(v, 'h2d_gbps'):.1f} |"
        )
    table = "\n".join(lines)
    print(table)
    copy_to_out(write_result("pin-cost", {"runs": runs, "thp": _thp_state()}, table))


if __name__ == "__main__":
    main()
