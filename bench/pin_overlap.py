"""Does pinning staging buffers on a thread of its own overlap the work of
the fill's other threads? Times ``Checkpoint.headers()`` of the 5,000-tensor
checkpoint alone and while another thread pins the 8 readers' buffers
(96 MiB) through cuda-bindings and through ``ctypes`` (which lets go of the
GIL during the call), and the pinning itself.

    python3 bench/pin_overlap.py [--rounds 5] [--data DIR]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attach_cuda import generate, many_shapes
from common import DATA, copy_to_out, write_result

from wcached.device import resolve_instance
from wcached.loaders.checkpoint import Checkpoint
from wcached.memory.cuda import STAGING_BUFFERS, STAGING_CHUNK, CudaBackend, check

NBYTES = 8 * STAGING_BUFFERS * STAGING_CHUNK


def pin_bindings(cu, ctx) -> tuple[float, int]:
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    t = time.perf_counter()
    ptr = int(check(cu.cuMemHostAlloc(NBYTES, 0), "cuMemHostAlloc"))
    return time.perf_counter() - t, ptr


def pin_ctypes(cu, ctx) -> tuple[float, int]:
    check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    fn = ctypes.CDLL("libcuda.so.1").cuMemHostAlloc
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    fn.restype = ctypes.c_int
    p = ctypes.c_void_p()
    t = time.perf_counter()
    rc = fn(ctypes.byref(p), NBYTES, 0)
    took = time.perf_counter() - t
    assert rc == 0, rc
    return took, int(p.value)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--data", default=str(DATA))
    args = ap.parse_args()
    ckpt = Path(args.data) / "many"
    if not ckpt.exists():
        generate(ckpt, many_shapes(), 2)
    backend = CudaBackend(resolve_instance("0").instance_id)
    backend.prepare_fill()
    cu, ctx = backend.cu, backend._context()
    Checkpoint(ckpt).headers()  # files in the page cache
    rows: dict[str, dict[str, list[float]]] = {}
    for _ in range(args.rounds):
        for how, pin in (("alone", None), ("cuda-bindings", pin_bindings), ("ctypes", pin_ctypes)):
            got: list[tuple[float, int]] = []
            th = None
            if pin is not None:
                th = threading.Thread(target=lambda p=pin, out=got: out.append(p(cu, ctx)))
                th.start()
            t = time.perf_counter()
            Checkpoint(ckpt).headers()
            headers = time.perf_counter() - t
            if th is not None:
                th.join()
                if not got:
                    raise SystemExit(f"{how}: the pinning failed (its thread's traceback is above)")
                check(cu.cuMemFreeHost(got[0][1]), "cuMemFreeHost")
            r = rows.setdefault(how, {"headers_s": [], "pin_s": []})
            r["headers_s"].append(headers)
            if got:
                r["pin_s"].append(got[0][0])
    med = {h: {k: statistics.median(v) if v else None for k, v in r.items()} for h, r in rows.items()}
    lines = [
        f"Checkpoint.headers() of 5,000 tensors while another thread pins {NBYTES >> 20} MiB "
        f"(medians of {args.rounds})",
        "",
        "| pinning beside it | headers (ms) | the pinning (ms) |",
        "|---|---|---|",
    ]
    for how, m in med.items():
        pin = "" if m["pin_s"] is None else f"{m['pin_s'] * 1e3:.1f}"
        lines.append(f"| {how} | {m['headers_s'] * 1e3:.1f} | {pin} |")
    table = "\n".join(lines)
    print(table)
    copy_to_out(write_result("pin-overlap", {"rows": rows, "medians": med}, table))


if __name__ == "__main__":
    main()
