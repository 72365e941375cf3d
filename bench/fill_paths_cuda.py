"""Where a warm CUDA fill's time goes (H200): each way of moving checkpoint
bytes from the page cache into device memory, side by side in one run.

  pread_only:     threads pread() 16 MiB chunks into pinned buffers, no GPU
                  copy (what the kernel's page-cache memcpy can give);
  h2d_only:       cuMemcpyHtoDAsync from one pinned buffer, on 1/2/4 streams
                  (what PCIe gives);
  pread_h2d:      today's fill: pread into pinned staging, then an async copy,
                  per thread, 3 buffers each;
  register_h2d:   mmap the file read-only, cuMemHostRegister(READ_ONLY) a
                  window of it (pinning the page cache's own pages), copy it
                  to the device by DMA, unregister: no CPU copy at all; per
                  thread, windows of 64 MiB - 1 GiB;
  and, cold (page cache dropped), one sequential reader against pread_h2d and
  register_h2d.

Every path's device bytes are compared with the file (a sample of windows,
exactly). Run from the repo root: python3 bench/fill_paths_cuda.py.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import mmap
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attach_cuda import drop_caches, generate, raw_read
from common import DATA, LLAMA8B, copy_to_out, write_result

from wcached.cli.demo import llama_shapes

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]

CHUNK = 16 << 20


def cu():
    from cuda.bindings import driver

    return driver


def ok(r, what="cuda"):
    err, *vals = r
    if int(err) != 0:
        raise RuntimeError(f"{what}: {err}")
    return vals[0] if len(vals) == 1 else (vals or None)


class Ctx:
    def __init__(self):
        d = cu()
        ok(d.cuInit(0))
        self.dev = ok(d.cuDeviceGet(0))
        self.ctx = ok(d.cuDevicePrimaryCtxRetain(self.dev))

    def current(self):
        ok(cu().cuCtxSetCurrent(self.ctx))


def pieces(files: list[Path], piece: int) -> list[tuple[Path, int, int]]:
    out = []
    for f in files:
        size = f.stat().st_size
        for off in range(0, size, piece):
            out.append((f, off, min(piece, size - off)))
    return out


def split(items: list, n: int) -> list[list]:
    """Contiguous stretches, so each thread reads sequentially."""
    per = -(-len(items) // n)
    return [items[i * per : (i + 1) * per] for i in range(n) if items[i * per : (i + 1) * per]]


def dest_offsets(items):
    offs, at = [], 0
    for _, _, n in items:
        offs.append(at)
        at += n
    return offs, at


def run_threads(fn, stretches):
    with concurrent.futures.ThreadPoolExecutor(len(stretches)) as pool:
        list(pool.map(fn, stretches))


def pread_only(ctx: Ctx, files, threads: int) -> float:
    d = cu()
    items = pieces(files, CHUNK)

    def work(stretch):
        ctx.current()
        ptr = ok(d.cuMemHostAlloc(CHUNK, 0))
        view = memoryview((ctypes.c_char * CHUNK).from_address(int(ptr))).cast("B")
        fds = {}
        for f, off, n in stretch:
            fd = fds.get(f) or fds.setdefault(f, os.open(f, os.O_RDONLY))
            os.preadv(fd, [view[:n]], off)
        for fd in fds.values():
            os.close(fd)
        view.release()
        d.cuMemFreeHost(ptr)

    t0 = time.perf_counter()
    run_threads(work, split(items, threads))
    return time.perf_counter() - t0


def h2d_only(ctx: Ctx, dst: int, total: int, streams: int) -> float:
    d = cu()
    ctx.current()
    buf = 256 << 20
    ptr = ok(d.cuMemHostAlloc(buf, 0))
    ss = [ok(d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING)) for _ in range(streams)]
    ok(d.cuCtxSynchronize())
    t0 = time.perf_counter()
    i = 0
    for off in range(0, total, buf):
        ok(d.cuMemcpyHtoDAsync(dst + off, ptr, min(buf, total - off), ss[i % streams]))
        i += 1
    ok(d.cuCtxSynchronize())
    dt = time.perf_counter() - t0
    for s in ss:
        d.cuStreamDestroy(s)
    d.cuMemFreeHost(ptr)
    return dt


def pread_h2d(
    ctx: Ctx,
    files,
    dst: int,
    threads: int,
    chunk: int = CHUNK,
    nbuf: int = 3,
    digest: bool = False,
    items=None,
) -> float:
    """pread into one of ``nbuf`` pinned buffers per thread, then an async
    copy; with ``digest``, xxh3-128 of each chunk as today's fill does."""
    import xxhash

    d = cu()
    all_items = pieces(files, chunk)
    offs, _ = dest_offsets(all_items)
    where = {(str(f), o): w for (f, o, _), w in zip(all_items, offs, strict=True)}
    items = all_items if items is None else items

    def work(stretch):
        ctx.current()
        stream = ok(d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING))
        bufs = []
        for _ in range(nbuf):
            ptr = ok(d.cuMemHostAlloc(chunk, 0))
            ev = ok(d.cuEventCreate(d.CUevent_flags.CU_EVENT_DISABLE_TIMING))
            bufs.append(
                [int(ptr), memoryview((ctypes.c_char * chunk).from_address(int(ptr))).cast("B"), ev, False]
            )
        fds = {}
        for k, it in enumerate(stretch):
            f, off, n = it
            b = bufs[k % nbuf]
            if b[3]:
                ok(d.cuEventSynchronize(b[2]))
            fd = fds.get(f) or fds.setdefault(f, os.open(f, os.O_RDONLY))
            os.preadv(fd, [b[1][:n]], off)
            if digest:
                xxhash.xxh3_128(b[1][:n]).hexdigest()
            ok(d.cuMemcpyHtoDAsync(dst + where[(str(f), off)], b[0], n, stream))
            ok(d.cuEventRecord(b[2], stream))
            b[3] = True
        ok(d.cuStreamSynchronize(stream))
        for ptr, view, ev, _ in bufs:
            view.release()
            d.cuEventDestroy(ev)
            d.cuMemFreeHost(ptr)
        d.cuStreamDestroy(stream)
        for fd in fds.values():
            os.close(fd)

    t0 = time.perf_counter()
    run_threads(work, split(items, threads))
    return time.perf_counter() - t0


def register_h2d(ctx: Ctx, files, dst: int, threads: int, window: int, timings: dict, items=None) -> float:
    """mmap + cuMemHostRegister(READ_ONLY) each window, DMA it, unregister
    once its copy is done (one window in flight per thread besides the one
    being registered)."""
    d = cu()
    page = mmap.PAGESIZE
    all_items = pieces(files, window)
    offs, _ = dest_offsets(all_items)
    where = {(str(f), o): w for (f, o, _), w in zip(all_items, offs, strict=True)}
    items = all_items if items is None else items
    flags = getattr(d, "CU_MEMHOSTREGISTER_READ_ONLY", 0x08)
    reg_s = [0.0]

    def work(stretch):
        ctx.current()
        stream = ok(d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING))
        fds = {}
        pending = []  # (addr, length, event)

        def retire(p):
            addr, length, ev = p
            ok(d.cuEventSynchronize(ev))
            ok(d.cuMemHostUnregister(addr))
            libc.munmap(addr, length)
            d.cuEventDestroy(ev)

        for it in stretch:
            f, off, n = it
            fd = fds.get(f) or fds.setdefault(f, os.open(f, os.O_RDONLY))
            base = off // page * page
            length = (off + n - base + page - 1) // page * page
            addr = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, base)
            if addr in (None, ctypes.c_void_p(-1).value):
                raise OSError(ctypes.get_errno(), "mmap")
            t = time.perf_counter()
            ok(d.cuMemHostRegister(addr, length, flags), "cuMemHostRegister")
            reg_s[0] += time.perf_counter() - t
            ev = ok(d.cuEventCreate(d.CUevent_flags.CU_EVENT_DISABLE_TIMING))
            ok(d.cuMemcpyHtoDAsync(dst + where[(str(f), off)], addr + (off - base), n, stream))
            ok(d.cuEventRecord(ev, stream))
            pending.append((addr, length, ev))
            if len(pending) > 1:
                retire(pending.pop(0))
        for p in pending:
            retire(p)
        d.cuStreamDestroy(stream)
        for fd in fds.values():
            os.close(fd)

    t0 = time.perf_counter()
    run_threads(work, split(items, threads))
    dt = time.perf_counter() - t0
    timings["register_thread_s"] = round(reg_s[0], 3)
    return dt


def hybrid(ctx: Ctx, files, dst: int, readers: int, registrars: int, share: float, window: int) -> float:
    """``readers`` pread threads and ``registrars`` register threads at once,
    the registrars taking ``share`` of each file (its tail), in windows."""
    pr, rg = [], []
    for f in files:
        size = f.stat().st_size
        cut = int(size * (1 - share)) // window * window
        pr += [it for it in pieces([f], window) if it[1] < cut]
        rg += [it for it in pieces([f], window) if it[1] >= cut]
    # The pread side in CHUNK pieces of its windows.
    pr = [(f, o, min(CHUNK, w + n - o)) for f, w, n in pr for o in range(w, w + n, CHUNK)]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a = pool.submit(pread_h2d, ctx, files, dst, readers, CHUNK, 3, False, pr)
        b = pool.submit(register_h2d, ctx, files, dst, registrars, window, {}, rg)
        a.result()
        b.result()
    return time.perf_counter() - t0


def check_bytes(files, dev, samples: int = 24) -> bool:
    """Compare ``samples`` evenly spread 16 MiB windows of the device buffer with the files."""
    import torch

    items = pieces(files, CHUNK)
    offs, _ = dest_offsets(items)
    step = max(1, len(items) // samples)
    for k in [*range(0, len(items), step), len(items) - 1]:
        f, off, n = items[k]
        with open(f, "rb") as fh:
            fh.seek(off)
            want = fh.read(n)
        got = dev[offs[k] : offs[k] + n].cpu().numpy().tobytes()
        if got != want:
            return False
    torch.cuda.synchronize()
    return True


def main() -> None:
    import torch

    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--quick", action="store_true")
    p.add_argument("--v2", action="store_true", help="the second round of variants only")
    p.add_argument("--v3", action="store_true", help="the third round: threads, chunk and depth near 4 MiB")
    args = p.parse_args()
    ckpt = Path(args.data) / "llama8b"
    generate(ckpt, llama_shapes(LLAMA8B), 4)
    files = sorted(ckpt.glob("*.safetensors"))
    total = sum(f.stat().st_size for f in files)
    gb = total / 1e9
    torch.cuda.init()
    dev = torch.empty(total, dtype=torch.uint8, device="cuda")
    ctx = Ctx()
    dst = dev.data_ptr()
    res: dict = {"bytes": total, "files": len(files)}
    raw_read(files)  # warm

    def rec(name, secs, correct=None, **extra):
        res[name] = {"s": round(secs, 3), "GBps": round(gb / secs, 2), **extra}
        if correct is not None:
            res[name]["bytes_match"] = correct
        print(name, res[name], flush=True)

    if args.v2:
        v2(ctx, files, dev, dst, rec)
        return finish(res, gb, files)
    if args.v3:
        for t in (6, 8, 12, 16):
            for chunk in (3 << 20, 4 << 20, 6 << 20):
                for nbuf in (2, 3):
                    dev.zero_()
                    secs = pread_h2d(ctx, files, dst, t, chunk, nbuf)
                    rec(f"pread_h2d_t{t}_c{chunk >> 20}M_b{nbuf}", secs, check_bytes(files, dev))
        return finish(res, gb, files)
    for t in (1, 4, 8, 16):
        rec(f"pread_only_t{t}", pread_only(ctx, files, t))
    for s in (1, 2, 4):
        rec(f"h2d_only_s{s}", h2d_only(ctx, dst, total, s))
    for t in (4, 8, 16):
        dev.zero_()
        rec(f"pread_h2d_t{t}", pread_h2d(ctx, files, dst, t), check_bytes(files, dev))
    dev.zero_()
    rec("pread_h2d_t16_chunk64M", pread_h2d(ctx, files, dst, 16, 64 << 20), check_bytes(files, dev))
    for t in (1, 2, 4, 8):
        for w in (64 << 20, 256 << 20, 1 << 30):
            if args.quick and w != 256 << 20:
                continue
            dev.zero_()
            timings: dict = {}
            secs = register_h2d(ctx, files, dst, t, w, timings)
            rec(f"register_h2d_t{t}_w{w >> 20}M", secs, check_bytes(files, dev), **timings)
    if drop_caches():
        rec("raw_read_cold", raw_read(files))
        drop_caches()
        dev.zero_()
        rec("pread_h2d_t16_cold", pread_h2d(ctx, files, dst, 16), check_bytes(files, dev))
        for t in (4, 16):
            drop_caches()
            dev.zero_()
            timings = {}
            secs = register_h2d(ctx, files, dst, t, 256 << 20, timings)
            rec(f"register_h2d_t{t}_w256M_cold", secs, check_bytes(files, dev), **timings)
    finish(res, gb, files)


def v2(ctx, files, dev, dst, rec) -> None:
    """The second round: chunk size and depth of the pread path, its digest,
    and pread + register threads side by side."""
    for t in (8, 16):
        for chunk in (2 << 20, 4 << 20, 8 << 20, 16 << 20):
            for nbuf in (3, 6):
                dev.zero_()
                rec(
                    f"pread_h2d_t{t}_c{chunk >> 20}M_b{nbuf}",
                    pread_h2d(ctx, files, dst, t, chunk, nbuf),
                    check_bytes(files, dev),
                )
    for chunk in (4 << 20, 16 << 20):
        dev.zero_()
        rec(
            f"pread_h2d_t16_c{chunk >> 20}M_xxh3",
            pread_h2d(ctx, files, dst, 16, chunk, 3, True),
            check_bytes(files, dev),
        )
    for readers, regs, share in ((12, 2, 0.4), (12, 2, 0.5), (14, 2, 0.5), (8, 4, 0.5), (12, 4, 0.6)):
        dev.zero_()
        rec(
            f"hybrid_r{readers}_g{regs}_share{share}",
            hybrid(ctx, files, dst, readers, regs, share, 1 << 30),
            check_bytes(files, dev),
        )
    import torch

    from wcached import tensor_digest

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for start in range(0, dev.numel(), 1 << 30):
        tensor_digest.device_digest(dev[start : start + (1 << 30)])
    torch.cuda.synchronize()
    rec("gpu_digest_wmix128_1GiB_pieces", time.perf_counter() - t0)


def finish(res, gb, files) -> None:
    rows = ["| path | s | GB/s | bytes match |", "|---|---|---|---|"]
    for k, v in res.items():
        if isinstance(v, dict):
            rows.append(f"| {k} | {v['s']} | {v['GBps']} | {v.get('bytes_match', '')} |")
    text = "\n".join(rows) + f"\n\n{gb:.2f} GB in {len(files)} files (bench/data/llama8b).\n"
    path = write_result("cuda-fill-paths", {"results": res}, text)
    print(text)
    copy_to_out(path)


if __name__ == "__main__":
    main()
