"""CUDA backend: VMM allocations exported as POSIX fds, mapped read-only.

Loader-worker side: ``cuMemCreate`` with a POSIX-fd handle type, a temporary
read-write mapping to fill it from pinned staging buffers (reads overlapped
with host-to-device copies), then ``cuMemExportToShareableHandle``. The worker
releases its own handle and mapping (a vLLM fill built in place keeps them,
read-only, until it exits: :mod:`wcached.memory.cuda_arena`); the exported fd
then alone keeps the allocation alive, in the daemon, in systemd's fd store,
or in an engine.

Client side: import each fd, map all segments into one address reservation,
``cuMemSetAccess`` with ``PROT_READ`` (a write faults in the writer, never
reaching the cache), and expose each segment to torch through
``__cuda_array_interface__``. The mapping is undone when the last tensor that
views it is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from wcached.errors import DeviceError, DeviceNotReady, OutOfMemory, ProtocolError
from wcached.memory.base import Hasher, MemoryBackend, SegmentWriter, contiguous_copies, preadv_full

if TYPE_CHECKING:
    import torch

    from wcached.protocol.messages import SegmentInfo

log = logging.getLogger("wcached.cuda")

# Staging: each filling thread owns STAGING_BUFFERS pinned buffers of
# STAGING_CHUNK bytes, so host memory in use is threads x 2 x 4 MiB, never a
# second copy of the model. Small on purpose: a chunk a thread has just read
# is still in the CPU's last-level cache when the copy engine reads it. On the
# H200 host, 16 threads page cache -> GPU moved 36 GB/s with 4 MiB chunks
# against 19.5 GB/s with 16 MiB ones and 28 GB/s with 2 MiB (deeper rings of
# 6 buffers were slower too), with PCIe itself at 55 GB/s
# (bench/fill_paths_cuda.py, bench/results/cuda-fill-paths-v2-20261202).
# What counts is the whole ring, readers x buffers x chunk: 96 MiB (12 x 2,
# or 8 x 3) filled fastest; 144 MiB (12 x 3) and 128 MiB (16 x 2) fell back
# (bench/results/fill-trees-0-20261207-readers).
STAGING_CHUNK = 4 << 20
STAGING_BUFFERS = 2

_init_lock = threading.Lock()
_initialized = False


def driver() -> Any:
    """``cuda.bindings.driver``, initialised; DeviceError if unusable."""
    global _initialized
    if _initialized:  # every driver call asks: no lock once initialised
        from cuda.bindings import driver as cu

        return cu
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        raise DeviceError("the CUDA backend needs cuda-bindings: pip install 'wcached[cuda]'") from None
    with _init_lock:
        if not _initialized:
            try:
                (err,) = cu.cuInit(0)
            except Exception as e:  # the driver library itself is missing
                raise DeviceNotReady(f"CUDA driver not available: {e}") from None
            if err != cu.CUresult.CUDA_SUCCESS:
                raise DeviceNotReady(f"cuInit failed: {_error_name(cu, err)}")
            _initialized = True
    return cu


def _error_name(cu: Any, err: Any) -> str:
    try:
        _, name = cu.cuGetErrorName(err)
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # pragma: no cover - error while reporting an error
        return str(err)


def check(result: tuple, what: str) -> Any:
    """Unpack a cuda-bindings ``(CUresult, value...)`` tuple or raise."""
    cu = driver()
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        name = _error_name(cu, err)
        if err == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            raise OutOfMemory(f"{what}: GPU out of memory ({name})")
        raise DeviceError(f"{what} failed: {name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def format_uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def device_ordinal(uuid: str) -> int:
    """This process's CUDA ordinal of the GPU with ``uuid`` (whatever
    ``CUDA_VISIBLE_DEVICES`` renumbered)."""
    cu = driver()
    count = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
    seen = []
    for i in range(count):
        dev = check(cu.cuDeviceGet(i), "cuDeviceGet")
        raw = check(cu.cuDeviceGetUuid(dev), "cuDeviceGetUuid")
        found = format_uuid(bytes(raw.bytes))
        if found.lower() == uuid.lower():
            return i
        seen.append(found)
    raise DeviceError(
        f"GPU {uuid} is not visible to this process (visible: {', '.join(seen) or 'none'}; "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')})"
    )


def vmm_fd_export(ordinal: int) -> str:
    """The UUID of the GPU at CUDA ``ordinal`` if its driver supports VMM with
    POSIX fd export (what a daemon needs to share memory); DeviceError naming
    what is missing otherwise."""
    cu = driver()
    dev = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
    uuid = format_uuid(bytes(check(cu.cuDeviceGetUuid(dev), "cuDeviceGetUuid").bytes))
    _vmm_support(cu, dev, uuid)
    return uuid


def _allocation_prop(cu: Any, ordinal: int) -> Any:
    prop = cu.CUmemAllocationProp()
    prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = ordinal
    prop.requestedHandleTypes = cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    return prop


def _access(cu: Any, ordinal: int, read_only: bool) -> list:
    desc = cu.CUmemAccessDesc()
    desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = ordinal
    desc.flags = (
        cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READ
        if read_only
        else cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    )
    return [desc]


def _vmm_support(cu: Any, dev: Any, uuid: str) -> None:
    attrs = cu.CUdevice_attribute
    vmm = check(
        cu.cuDeviceGetAttribute(attrs.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
        "cuDeviceGetAttribute",
    )
    posix = check(
        cu.cuDeviceGetAttribute(attrs.CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev),
        "cuDeviceGetAttribute",
    )
    if not vmm or not posix:
        raise DeviceError(
            f"GPU {uuid}: the driver does not support CUDA virtual memory management with "
            f"POSIX fd export (vmm={vmm}, posix_fd={posix}); wcached needs a Linux driver >= 450"
        )


class _PinnedRegion:
    """Page-locked host memory for staging buffers: anonymous memory asked
    for as transparent huge pages, registered with CUDA in one call. A fresh
    worker spent ~46 ms pinning its readers' 24 buffers one
    ``cuMemHostAlloc`` at a time (bench/results/pin-overlap-20261207); huge
    pages are pinned 512 base pages at a time (bench/pin_cost.py)."""

    HUGE = 2 << 20

    def __init__(self, cu: Any, nbytes: int):
        import mmap

        self.cu = cu
        self.nbytes = nbytes
        # Private: a shared anonymous mapping is shmem, which THP leaves alone.
        self._map = mmap.mmap(-1, nbytes + self.HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._anchor = ctypes.c_char.from_buffer(self._map)
        start = ctypes.addressof(self._anchor)
        skip = (-start) % self.HUGE
        self.base = start + skip
        with contextlib.suppress(OSError, AttributeError):  # no THP: base pages, still correct
            self._map.madvise(mmap.MADV_HUGEPAGE, skip, nbytes)
        with contextlib.suppress(OSError, AttributeError):
            # A child forked later gets none of it (as of cuMemHostAlloc's):
            # pages it shared copy-on-write could leave the copy engine
            # reading a page the parent no longer maps.
            self._map.madvise(mmap.MADV_DONTFORK, skip, nbytes)
        for off in range(0, nbytes, self.HUGE):  # one fault per huge page
            self._map[skip + off] = 0
        try:
            check(cu.cuMemHostRegister(self.base, nbytes, 0), "cuMemHostRegister")
        except BaseException:
            self._release_map()
            raise

    def buffer(self, index: int, nbytes: int) -> tuple[int, memoryview]:
        ptr = self.base + index * nbytes
        return ptr, memoryview((ctypes.c_char * nbytes).from_address(ptr)).cast("B")

    def close(self) -> None:
        (err,) = self.cu.cuMemHostUnregister(self.base)
        if err != self.cu.CUresult.CUDA_SUCCESS:  # said, and the memory unmapped all the same
            log.warning("cuMemHostUnregister of the staging region failed: %s", _error_name(self.cu, err))
        self._release_map()

    def _release_map(self) -> None:
        del self._anchor  # the buffer export that keeps the map from closing
        self._map.close()


class _Staging:
    """One filling thread's pinned buffers, stream and events."""

    def __init__(self, cu: Any, ctx: Any, buffers: list[tuple[int, memoryview]]):
        self.cu = cu
        check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self.stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self.buffers = []
        for ptr, view in buffers:
            event = check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
            self.buffers.append((ptr, view, event))
        self.turn = 0
        self.used = [False] * STAGING_BUFFERS

    def next(self) -> tuple[int, memoryview, Any]:
        """A buffer whose previous copy has finished."""
        i = self.turn
        self.turn = (i + 1) % STAGING_BUFFERS
        ptr, view, event = self.buffers[i]
        if self.used[i]:
            check(self.cu.cuEventSynchronize(event), "cuEventSynchronize")
        self.used[i] = True
        return ptr, view, event

    def copy(self, dst: int, ptr: int, n: int, event: Any) -> None:
        check(self.cu.cuMemcpyHtoDAsync(dst, ptr, n, self.stream), "cuMemcpyHtoDAsync")
        check(self.cu.cuEventRecord(event, self.stream), "cuEventRecord")

    def close(self) -> None:
        """Wait for its copies and free its stream and events (the buffers
        belong to the backend's pinned regions): freed even when the wait
        fails, which is then raised."""
        cu = self.cu
        try:
            check(cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")
        finally:
            for _, view, event in self.buffers:
                view.release()
                cu.cuEventDestroy(event)
            cu.cuStreamDestroy(self.stream)
            self.buffers = []


def map_new_allocation(backend: CudaBackend, nbytes: int, label: str) -> tuple[Any, int]:
    """An exportable allocation of ``nbytes`` on the backend's GPU, mapped
    read-write in this process: ``(handle, address)``. OutOfMemory names
    ``label`` and what is free."""
    cu = backend.cu
    try:
        handle = check(cu.cuMemCreate(nbytes, backend.prop, 0), f"cuMemCreate({nbytes})")
    except OutOfMemory:
        free, total = check(cu.cuMemGetInfo(), "cuMemGetInfo")
        raise OutOfMemory(
            f"GPU {backend.uuid} out of memory: {label} needs {nbytes / 2**30:.2f} GiB, "
            f"{free / 2**30:.2f} of {total / 2**30:.2f} GiB free"
        ) from None
    va = 0
    try:
        va = int(check(cu.cuMemAddressReserve(nbytes, backend.granularity, 0, 0), "cuMemAddressReserve"))
        check(cu.cuMemMap(va, nbytes, 0, handle, 0), "cuMemMap")
        check(cu.cuMemSetAccess(va, nbytes, _access(cu, backend.ordinal, False), 1), "cuMemSetAccess")
    except BaseException:
        unmap_allocation(cu, va, nbytes, handle)
        raise
    return handle, va


def unmap_allocation(cu: Any, va: int, nbytes: int, handle: Any) -> None:
    """Undo :func:`map_new_allocation` (any part of it that was done)."""
    if va:
        cu.cuMemUnmap(va, nbytes)
        cu.cuMemAddressFree(va, nbytes)
    if handle is not None:
        cu.cuMemRelease(handle)


def export_allocation(cu: Any, handle: Any) -> int:
    """A POSIX fd that keeps the allocation alive on its own."""
    return int(
        check(
            cu.cuMemExportToShareableHandle(
                handle, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0
            ),
            "cuMemExportToShareableHandle",
        )
    )


def protect_read_only(backend: CudaBackend, va: int, nbytes: int) -> None:
    """This process's mapping read-only: a stray write faults here rather
    than change what has been exported."""
    cu = backend.cu
    check(cu.cuMemSetAccess(va, nbytes, _access(cu, backend.ordinal, True), 1), "cuMemSetAccess")


class CudaSegmentWriter(SegmentWriter):
    def __init__(self, backend: CudaBackend, nbytes: int, label: str):
        self.backend = backend
        self.nbytes = nbytes
        self.label = label
        self.handle, self.va = map_new_allocation(backend, nbytes, f"segment {label}")

    def write_from_file(
        self, src_fd: int, file_offset: int, offset: int, nbytes: int, hasher: Hasher | None
    ) -> int:
        st = self.backend.staging()
        done = 0
        while done < nbytes:
            ptr, view, event = st.next()
            want = min(STAGING_CHUNK, nbytes - done)
            got = os.preadv(src_fd, [view[:want]], file_offset + done)
            if got == 0:
                break
            if hasher is not None:
                hasher.update(view[:got])
            st.copy(self.va + offset + done, ptr, got, event)
            done += got
        return done

    def write_run(
        self,
        src_fd: int,
        file_offset: int,
        pieces: Sequence[tuple[int, int]],
        hashers: Sequence[Hasher | None],
    ) -> int:
        # One read into a staging buffer, then one async copy per stretch of
        # tensors that lie back to back in the segment as in the file.
        total = sum(n for _, n in pieces)
        st = self.backend.staging()
        ptr, view, event = st.next()
        got = preadv_full(src_fd, [view[:total]], file_offset)
        pos = 0
        for (_, nbytes), hasher in zip(pieces, hashers, strict=True):
            if hasher is not None:
                hasher.update(view[pos : pos + nbytes])
            pos += nbytes
        cu = self.backend.cu
        for dst, src, nbytes in contiguous_copies(pieces):
            check(cu.cuMemcpyHtoDAsync(self.va + dst, ptr + src, nbytes, st.stream), "cuMemcpyHtoDAsync")
        check(cu.cuEventRecord(event, st.stream), "cuEventRecord")
        return got

    def write_bytes(self, offset: int, data: memoryview, hasher: Hasher | None) -> None:
        st = self.backend.staging()
        data = data.cast("B")
        if hasher is not None:
            hasher.update(data)
        for start in range(0, len(data), STAGING_CHUNK):
            chunk = data[start : start + STAGING_CHUNK]
            ptr, view, event = st.next()
            view[: len(chunk)] = chunk
            st.copy(self.va + offset + start, ptr, len(chunk), event)

    def copy_from_pointer(self, offset: int, src: int, nbytes: int, hasher: Hasher | None) -> None:
        # Unified addressing: src may be host or device memory.
        if hasher is not None:
            raise ValueError("digests of device-resident sources are not computed")
        check(self.backend.cu.cuMemcpy(self.va + offset, src, nbytes), "cuMemcpy")

    def digest_spans(self, spans: Sequence[tuple[int, int]]) -> list[str]:
        from wcached.memory import cuda_digest

        self.backend.synchronize()  # the staging streams' copies have landed
        return cuda_digest.digest_spans([(self.va + offset, n) for offset, n in spans])

    def finish(self) -> int:
        self.backend.synchronize()
        fd = export_allocation(self.backend.cu, self.handle)
        # Only the exported fd keeps the memory from here on.
        self.abort()
        return fd

    def abort(self) -> None:
        unmap_allocation(self.backend.cu, self.va, self.nbytes, self.handle)
        self.va, self.handle = 0, None


class CudaBackend(MemoryBackend):
    name = "cuda"
    run_bytes = STAGING_CHUNK
    # Readers feeding one GPU. The copy alone moved 35-41 GB/s with 8 to 12
    # readers and as little as 15 GB/s with 16 on the 16-core H200 host (its
    # cores also serve the copy engine and the worker's other threads:
    # bench/results/cuda-fill-paths-v3-20261202). Whole warm fills of the
    # 16 GB 8B Llama on an H100, side by side (fill-trees-0-20261207-readers):
    # 12 readers of 2 buffers 37.8 GB/s, 8 of 3 (before) 30.1, 10 of 2 32.7,
    # 16 of 2 31.8, 12 of 3 28.6 (as cuda-attach-12readers-20261202's 11.5
    # GB/s had shown: that ring was 144 MiB); the 5,000-tensor fill the same
    # (17.0 against 17.1 GB/s).
    auto_readers = 12

    def __init__(self, device: str):
        self.cu = cu = driver()
        self.uuid = device
        self.ordinal = device_ordinal(device) if device.startswith(("GPU-", "MIG-")) else int(device)
        dev = check(cu.cuDeviceGet(self.ordinal), "cuDeviceGet")
        _vmm_support(cu, dev, device)
        self.prop = _allocation_prop(cu, self.ordinal)
        self.granularity = int(
            check(
                cu.cuMemGetAllocationGranularity(
                    self.prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
                ),
                "cuMemGetAllocationGranularity",
            )
        )
        self._dev = dev
        self._ctx = None
        self._local = threading.local()
        self._stagings: list[_Staging] = []
        self._lock = threading.Lock()
        # Pinned staging memory: regions and, of the last, the next free buffer.
        self._regions: list[_PinnedRegion] = []
        self._region_free = 0
        self._staging_threads = 1  # until a fill announces its readers

    def prepare_fill(self) -> None:
        """Create the CUDA context (worker side) before any fill is timed."""
        self._context()

    def prepare_staging(self, threads: int) -> None:
        """Before a fill's readers start. The last fill's staging is let go
        (its reader threads have ended, and its copies landed: a fill
        synchronizes before it exports), its region kept if it holds
        ``threads`` readers' buffers; else the first reader pins one region
        for all of them. So each fill of a worker's models stages through one
        region, not one per reader (a worker fills its models one by one,
        each with new reader threads)."""
        threads = max(1, threads)
        self._let_go_of_staging(keep_bytes=threads * STAGING_BUFFERS * STAGING_CHUNK)
        self._staging_threads = threads

    def after_fill_digest(self) -> str | None:
        """wmix128 by one kernel over the filled segments (milliseconds for
        a model), where NVRTC can build it; else the host's xxh3 as the
        bytes are staged (a third of a warm fill's time on the H200)."""
        from wcached import tensor_digest
        from wcached.memory import cuda_digest

        self._context()
        why = cuda_digest.available()
        if why is not None:
            log.warning("digests hashed on the host while copying (slower): %s", why)
            return None
        return tensor_digest.DEVICE

    # -- loader-worker side -----------------------------------------------

    def _context(self) -> Any:
        if self._ctx is None:
            self._ctx = check(self.cu.cuDevicePrimaryCtxRetain(self._dev), "cuDevicePrimaryCtxRetain")
        check(self.cu.cuCtxSetCurrent(self._ctx), "cuCtxSetCurrent")
        return self._ctx

    def staging(self) -> _Staging:
        st = getattr(self._local, "staging", None)
        if st is None:
            ctx = self._context()
            with self._lock:
                buffers = self._take_buffers()
            st = _Staging(self.cu, ctx, buffers)
            self._local.staging = st
            with self._lock:
                self._stagings.append(st)
        return st

    def _take_buffers(self) -> list[tuple[int, memoryview]]:
        """A thread's STAGING_BUFFERS pinned buffers, from the last region
        while it has them, else from a new one sized for the threads the fill
        announced (one thread's worth past them, or unannounced)."""
        if (
            not self._regions
            or self._region_free + STAGING_BUFFERS > self._regions[-1].nbytes // STAGING_CHUNK
        ):
            threads = 1 if self._regions else self._staging_threads
            self._regions.append(_PinnedRegion(self.cu, threads * STAGING_BUFFERS * STAGING_CHUNK))
            self._region_free = 0
        region = self._regions[-1]
        first, self._region_free = self._region_free, self._region_free + STAGING_BUFFERS
        return [region.buffer(i, STAGING_CHUNK) for i in range(first, first + STAGING_BUFFERS)]

    def synchronize(self) -> None:
        self._context()
        for st in list(self._stagings):
            check(self.cu.cuStreamSynchronize(st.stream), "cuStreamSynchronize")

    def device_used_bytes(self) -> int:
        """Bytes in use on this GPU (every process's), for a fill's peak."""
        self._context()
        free, total = check(self.cu.cuMemGetInfo(), "cuMemGetInfo")
        return int(total) - int(free)

    def allocate(self, nbytes: int, label: str) -> CudaSegmentWriter:
        self._context()
        return CudaSegmentWriter(self, self.round_up(nbytes), label)

    def close(self) -> None:
        """Free the staging buffers (the worker calls this once filled)."""
        self._let_go_of_staging()

    def _let_go_of_staging(self, keep_bytes: int = 0) -> None:
        """Close every thread's staging (each thread takes new buffers on its
        next copy) and unpin the regions, but for the smallest one of at least
        ``keep_bytes``, which is handed out again from its start (a region a
        reader past those announced pinned for itself is not the one kept)."""
        if self._ctx is not None:
            self._context()
        with self._lock:
            stagings, self._stagings = self._stagings, []
            fits = [r for r in self._regions if keep_bytes and r.nbytes >= keep_bytes]
            keep = min(fits, key=lambda r: r.nbytes) if fits else None
            regions = [r for r in self._regions if r is not keep]
            self._regions = [keep] if keep is not None else []
            self._region_free = 0
            self._local = threading.local()
        failed: BaseException | None = None
        for st in stagings:  # each one closed, whichever fails
            try:
                st.close()
            except BaseException as e:
                failed = failed or e
        # Unpinned even if a stream could not be waited for (a context that
        # fails there is gone, and its copies with it).
        for region in regions:
            region.close()
        if failed is not None:
            raise failed

    # -- client side ------------------------------------------------------

    def map_segments(self, fds: Sequence[int], infos: Sequence[SegmentInfo]) -> CudaMapping:
        return CudaMapping(self, fds, infos)


class _SegmentArray:
    """A segment as a ``__cuda_array_interface__`` exporter.

    torch keeps this object alive for as long as any tensor views the segment;
    it holds the mapping, so the mapping lives exactly that long.
    """

    def __init__(self, mapping: CudaMapping, ptr: int, nbytes: int):
        self.mapping = mapping
        self.__cuda_array_interface__ = {
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }


class CudaMapping:
    def __init__(self, backend: CudaBackend, fds: Sequence[int], infos: Sequence[SegmentInfo]):
        import torch

        cu = backend.cu
        self.cu = cu
        self.handles: list[Any] = []
        self.va = 0
        self.total = sum(i.nbytes for i in infos)
        self.mapped = 0
        uuid = infos[0].device
        if any(i.device != uuid for i in infos):
            raise ProtocolError("segments of one attach live on several GPUs")
        self.ordinal = backend.ordinal
        torch_device = torch.device("cuda", self.ordinal)
        # torch's primary context must exist and be current on this thread for
        # the driver calls; the caller's current device is left as it was.
        with torch.cuda.device(torch_device):
            torch.empty(0, device=torch_device)
            ptrs = self._map(backend, fds, infos)
        self.tensors: list[torch.Tensor] = [
            torch.as_tensor(_SegmentArray(self, p, i.nbytes), device=torch_device)
            for p, i in zip(ptrs, infos, strict=True)
        ]

    def _map(self, backend: CudaBackend, fds: Sequence[int], infos: Sequence[SegmentInfo]) -> list[int]:
        cu = self.cu
        try:
            for fd in fds:
                self.handles.append(
                    check(
                        cu.cuMemImportFromShareableHandle(
                            fd, cu.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
                        ),
                        "cuMemImportFromShareableHandle",
                    )
                )
            self.va = int(
                check(cu.cuMemAddressReserve(self.total, backend.granularity, 0, 0), "cuMemAddressReserve")
            )
            offset = 0
            ptrs = []
            for handle, info in zip(self.handles, infos, strict=True):
                check(cu.cuMemMap(self.va + offset, info.nbytes, 0, handle, 0), "cuMemMap")
                self.mapped = offset + info.nbytes
                ptrs.append(self.va + offset)
                offset += info.nbytes
            check(
                cu.cuMemSetAccess(self.va, self.total, _access(cu, self.ordinal, True), 1), "cuMemSetAccess"
            )
        except BaseException:
            self._undo()
            raise
        return ptrs

    def close(self) -> None:
        # The tensors own the mapping (through _SegmentArray); dropping our
        # references lets the last view unmap it.
        self.tensors = []

    def _undo(self) -> None:
        cu = self.cu
        if self.va:
            if self.mapped:
                cu.cuMemUnmap(self.va, self.mapped)
            cu.cuMemAddressFree(self.va, self.total)
            self.va = 0
        for h in self.handles:
            cu.cuMemRelease(h)
        self.handles = []

    def __del__(self) -> None:
        try:
            self._undo()
        except Exception:  # interpreter shutdown: the driver may be gone already
            pass
