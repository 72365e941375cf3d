"""wmix128 (:data:`wcached.tensor_digest.DEVICE`) of device memory in one
CUDA kernel, compiled at run time with NVRTC through cuda-bindings.

The algorithm is defined, with a torch reference, in
:mod:`wcached.tensor_digest`; this is its fast path for GPU memory. torch's
integer kernels need some twenty passes over a copy of every word (31 GB/s
on an H200, bench/results/digest-gpu-20261201); this kernel reads each word
once and keeps the rest in registers, so digesting a model costs
milliseconds and can follow a fill's copy without slowing it. No torch: the
safetensors loader's worker calls it on segments it filled through the
driver API.

A batch of spans is cut into pieces of at most :data:`PIECE` bytes; a block
hashes one piece and adds its two sums to its span's with 64-bit atomics
(sums mod 2**64 are the same in any order).

The built kernel is kept on disk (:mod:`wcached.memory.kernel_cache`): each
fill's worker is a fresh process, and NVRTC's build was a tenth of a warm
fill's time there.
"""

from __future__ import annotations

import array
import ctypes
import logging
import threading
from collections.abc import Sequence
from typing import Any

from wcached.errors import DeviceError
from wcached.memory import kernel_cache
from wcached.memory.cuda import check, driver

log = logging.getLogger("wcached.memory")

# Bytes a block hashes (a multiple of 8, so every piece starts on a word).
PIECE = 1 << 20
THREADS = 256

_SOURCE = r"""
typedef unsigned long long u64;

__device__ __forceinline__ u64 mix(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

// piece p: addr[p] (its first byte), word0[p] (its first word's index in its
// span), nbytes[p], span[p] (which pair of sums it adds to).
extern "C" __global__ void wmix128_pieces(
    const u64* __restrict__ addr, const u64* __restrict__ word0,
    const u64* __restrict__ nbytes, const u64* __restrict__ span, u64* sums)
{
    const unsigned p = blockIdx.x;
    const unsigned char* base = (const unsigned char*)addr[p];
    const u64 n = nbytes[p];
    const u64 words = (n + 7) / 8;
    const bool aligned = (((u64)base) & 7) == 0;
    u64 a = 0, b = 0;
    for (u64 k = threadIdx.x; k < words; k += blockDim.x) {
        u64 w = 0;
        if (aligned && k * 8 + 8 <= n) {
            w = ((const u64*)base)[k];
        } else {  // an unaligned start or the zero-padded last word
            for (int j = 0; j < 8; ++j) {
                const u64 at = k * 8 + j;
                if (at < n) w |= ((u64)base[at]) << (8 * j);
            }
        }
        const u64 i = word0[p] + k;
        a += mix(w + mix(i ^ 0x9E3779B97F4A7C15ULL));
        b += mix(w ^ mix(i ^ 0xD1B54A32D192ED03ULL));
    }
    for (int off = 16; off > 0; off >>= 1) {
        a += __shfl_down_sync(0xffffffffu, a, off);
        b += __shfl_down_sync(0xffffffffu, b, off);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(&sums[2 * span[p]], a);
        atomicAdd(&sums[2 * span[p] + 1], b);
    }
}
"""

_lock = threading.Lock()
# Loaded kernels by context handle: a module belongs to the context it was
# loaded in.
_kernels: dict[int, Any] = {}
_unusable: str | None = None


def _options(cu: Any) -> list[bytes]:
    """NVRTC's options for the current context's device."""
    dev = check(cu.cuCtxGetDevice(), "cuCtxGetDevice")
    attrs = cu.CUdevice_attribute
    major = check(cu.cuDeviceGetAttribute(attrs.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cc")
    minor = check(cu.cuDeviceGetAttribute(attrs.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cc")
    return [f"--gpu-architecture=sm_{major}{minor}".encode(), b"-std=c++17"]


def _compile(opts: list[bytes]) -> bytes:
    """The kernel built with ``opts``, as CUBIN."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:  # pragma: no cover - cuda-bindings without nvrtc
        raise DeviceError(f"NVRTC unavailable: {e}") from None

    def ok(result: tuple, what: str) -> Any:
        err, *values = result
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise DeviceError(f"NVRTC {what} failed: {err}")
        return values[0] if values else None

    try:
        prog = ok(nvrtc.nvrtcCreateProgram(_SOURCE.encode(), b"wmix128.cu", 0, [], []), "create")
    except RuntimeError as e:  # cuda-bindings could not load libnvrtc
        raise DeviceError(f"NVRTC unavailable: {e}") from None
    try:
        err, *_ = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            size = ok(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
            buf = b" " * size
            ok(nvrtc.nvrtcGetProgramLog(prog, buf), "log")
            raise DeviceError(f"NVRTC could not compile the digest kernel: {buf.decode(errors='replace')}")
        size = ok(nvrtc.nvrtcGetCUBINSize(prog), "CUBIN size")
        cubin = b" " * size
        ok(nvrtc.nvrtcGetCUBIN(prog, cubin), "CUBIN")
        return cubin
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _kernel(cu: Any) -> Any:
    """The kernel in the current context, compiled and loaded once."""
    global _unusable
    ctx = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
    key = int(ctx)
    if key == 0:
        raise DeviceError("no current CUDA context to digest device memory in")
    with _lock:
        if _unusable is not None:
            raise DeviceError(_unusable)
        fn = _kernels.get(key)
        if fn is None:
            try:
                fn = _built(cu)
            except Exception as e:  # a binding's TypeError too: never the fill's end
                why = str(e) if isinstance(e, DeviceError) else f"the digest kernel cannot run here: {e!r}"
                _unusable = why
                raise DeviceError(_unusable) from None
            _kernels[key] = fn
        return fn


def _built(cu: Any) -> Any:
    """The kernel loaded in the current context and checked: a build kept
    on disk where one passes the check (NVRTC is then not even loaded),
    else built now and kept for the next process."""
    opts = _options(cu)
    kept = kernel_cache.entry("wmix128", _SOURCE, *(o.decode() for o in opts))
    cubin = kernel_cache.load(kept)
    if cubin is not None:
        try:
            return _loaded(cu, cubin)
        except Exception as e:  # damaged, or built for another driver: build afresh
            log.info("the kept digest kernel %s failed its check (%s); building it again", kept, e)
            kernel_cache.forget(kept)
    cubin = _compile(opts)
    fn = _loaded(cu, cubin)
    kernel_cache.store(kept, cubin)
    return fn


def _loaded(cu: Any, cubin: bytes) -> Any:
    """``cubin``'s kernel, loaded and self-checked (unloaded if the check fails)."""
    module = check(cu.cuModuleLoadData(cubin), "cuModuleLoadData")
    try:
        fn = check(cu.cuModuleGetFunction(module, b"wmix128_pieces"), "cuModuleGetFunction")
        _self_check(cu, fn)
    except BaseException:
        cu.cuModuleUnload(module)
        raise
    return fn


# What the kernel is checked on when loaded: a piece boundary, an unaligned
# start and a zero-padded last word (a wrong build then falls back, never
# records wrong digests).
_CHECK = bytes(range(256)) * 17 + b"wcached"


def _self_check(cu: Any, fn: Any) -> None:
    from wcached.tensor_digest import formula_digest

    data = ctypes.create_string_buffer(_CHECK + b"\x5a", len(_CHECK) + 1)
    dev = int(check(cu.cuMemAlloc(len(data)), "cuMemAlloc"))
    try:
        check(cu.cuMemcpyHtoD(dev, ctypes.addressof(data), len(data)), "cuMemcpyHtoD")
        spans = [(dev, len(_CHECK)), (dev + 1, len(_CHECK)), (dev, 0)]
        got = _launch(cu, fn, spans, 0, piece=1024)
    finally:
        cu.cuMemFree(dev)
    want = [formula_digest(_CHECK), formula_digest(_CHECK[1:] + b"\x5a"), formula_digest(b"")]
    if got != want:
        raise DeviceError(f"the digest kernel built here gives wrong digests ({got[0]} for {want[0]})")


def available() -> str | None:
    """None if the kernel runs in the current context, else why not."""
    try:
        _kernel(driver())
    except DeviceError as e:
        return str(e)
    return None


def pieces_of(spans: Sequence[tuple[int, int]], piece: int = PIECE) -> tuple[array.array, ...]:
    """The kernel's piece table for ``spans`` of ``(address, nbytes)``:
    addresses, first word indices, byte counts and span numbers (``piece``
    a multiple of 8)."""
    addr, word0, nbytes, span = (array.array("Q") for _ in range(4))
    for i, (ptr, n) in enumerate(spans):
        for start in range(0, n, piece):
            addr.append(ptr + start)
            word0.append(start // 8)
            nbytes.append(min(piece, n - start))
            span.append(i)
    return addr, word0, nbytes, span


def digest_spans(spans: Sequence[tuple[int, int]], stream: Any = 0) -> list[str]:
    """wmix128 of each ``(device address, nbytes)`` span, in the current
    context, after the work queued on ``stream`` (default: the legacy
    stream, which waits for every blocking stream, torch's included).
    DeviceError if the kernel cannot be built here."""
    if not spans:
        return []
    cu = driver()
    return _launch(cu, _kernel(cu), spans, stream)


def _launch(cu: Any, fn: Any, spans: Sequence[tuple[int, int]], stream: Any, piece: int = PIECE) -> list[str]:
    tables = pieces_of(spans, piece)
    sums = array.array("Q", (n & (2**64 - 1) for _, n in spans for _ in range(2)))
    host = [(t.buffer_info()[0], t.itemsize * len(t)) for t in (*tables, sums)]
    dev = int(check(cu.cuMemAlloc(sum(n for _, n in host)), "cuMemAlloc"))
    try:
        ptrs, at = [], dev
        for src, n in host:
            check(cu.cuMemcpyHtoDAsync(at, src, n, stream), "cuMemcpyHtoDAsync")
            ptrs.append(at)
            at += n
        values = [ctypes.c_uint64(p) for p in ptrs]
        params = (ctypes.c_void_p * len(values))(*(ctypes.addressof(v) for v in values))
        blocks = len(tables[0])
        if not blocks:  # only empty spans: each one's sums are its size, 0
            return [f"{0:032x}"] * len(spans)
        launch = cu.cuLaunchKernel(fn, blocks, 1, 1, THREADS, 1, 1, 0, stream, ctypes.addressof(params), 0)
        check(launch, "cuLaunchKernel")
        check(cu.cuMemcpyDtoHAsync(host[-1][0], ptrs[-1], host[-1][1], stream), "cuMemcpyDtoHAsync")
        check(cu.cuStreamSynchronize(stream), "cuStreamSynchronize")
    finally:
        cu.cuMemFree(dev)
    return [f"{sums[2 * i]:016x}{sums[2 * i + 1]:016x}" for i in range(len(spans))]
