"""The CUDA backend's staging bookkeeping, against a stand-in driver (no GPU):
which pinned regions a worker's fills register, reuse and let go. The real
driver's side (the copy engine reading these buffers) is the GPU test
tests/memory/test_cuda.py::test_staging_buffers_come_from_one_pinned_region_per_announced_fill."""

from __future__ import annotations

import itertools
import logging
import threading
import types

import pytest

from wcached.errors import DeviceError
from wcached.memory import cuda
from wcached.memory.cuda import STAGING_BUFFERS, STAGING_CHUNK, CudaBackend

OK, FAILED = 0, 999


class FakeDriver:
    """What the staging code asks of cuda-bindings' driver module, keeping
    count of the host memory registered with it."""

    CUresult = types.SimpleNamespace(CUDA_SUCCESS=OK, CUDA_ERROR_OUT_OF_MEMORY=2)
    CUstream_flags = types.SimpleNamespace(CU_STREAM_NON_BLOCKING=1)
    CUevent_flags = types.SimpleNamespace(CU_EVENT_DISABLE_TIMING=2)

    def __init__(self) -> None:
        self.registered: dict[int, int] = {}
        self.registrations = 0
        self.events = 0
        self.fail_sync = False

    def cuGetErrorName(self, err):
        return OK, b"CUDA_ERROR_STAND_IN"

    def cuDevicePrimaryCtxRetain(self, dev):
        return OK, "ctx"

    def cuCtxSetCurrent(self, ctx):
        return (OK,)

    def cuStreamCreate(self, flags):
        return OK, object()

    def cuStreamSynchronize(self, stream):
        return (FAILED,) if self.fail_sync else (OK,)

    def cuStreamDestroy(self, stream):
        return (OK,)

    def cuEventCreate(self, flags):
        self.events += 1
        return OK, object()

    def cuEventDestroy(self, event):
        self.events -= 1
        return (OK,)

    def cuMemHostRegister(self, ptr, nbytes, flags):
        self.registered[ptr] = nbytes
        self.registrations += 1
        return (OK,)

    def cuMemHostUnregister(self, ptr):
        self.registered.pop(ptr)
        return (OK,)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    driver = FakeDriver()
    monkeypatch.setattr(cuda, "driver", lambda: driver)
    return driver


def _backend(driver: FakeDriver) -> CudaBackend:
    # Past __init__, which asks the device itself (VMM support, granularity).
    backend = CudaBackend.__new__(CudaBackend)
    backend.cu = driver
    backend._dev = 0
    backend._ctx = None
    backend._local = threading.local()
    backend._stagings = []
    backend._lock = threading.Lock()
    backend._regions = []
    backend._region_free = 0
    backend._staging_threads = 1
    return backend


def _fill(backend: CudaBackend, readers: int) -> list[int]:
    """A fill's start and its readers' first copies: each reader thread's
    buffers, in thread order."""
    backend.prepare_staging(readers)
    got: list[list[int]] = [[] for _ in range(readers)]

    def reader(i: int) -> None:
        got[i] = [ptr for ptr, _, _ in backend.staging().buffers]

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(readers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [p for ptrs in got for p in ptrs]


def _whole_and_apart(ptrs: list[int], registered: dict[int, int]) -> bool:
    """Each buffer a whole STAGING_CHUNK inside a registered region, and no
    two overlapping (readers fill theirs at once)."""
    ordered = sorted(ptrs)
    inside = all(any(b <= p and p + STAGING_CHUNK <= b + n for b, n in registered.items()) for p in ordered)
    return inside and all(q - p >= STAGING_CHUNK for p, q in itertools.pairwise(ordered))


def test_each_fill_of_a_worker_stages_through_one_region_reused_while_it_fits(fake: FakeDriver) -> None:
    backend = _backend(fake)
    first = _fill(backend, 3)
    assert fake.registrations == 1 and list(fake.registered.values()) == [3 * STAGING_BUFFERS * STAGING_CHUNK]
    assert len(first) == 3 * STAGING_BUFFERS and _whole_and_apart(first, fake.registered)
    # The next model of the worker: new reader threads, the same region
    # (pinned once per worker, not per fill), each of its buffers handed
    # out once again; the last fill's streams and events are gone.
    second = _fill(backend, 3)
    assert fake.registrations == 1 and sorted(second) == sorted(first)
    assert fake.events == 3 * STAGING_BUFFERS
    # A fill of more readers than the region holds: a region of its size.
    third = _fill(backend, 5)
    assert fake.registrations == 2 and list(fake.registered.values()) == [5 * STAGING_BUFFERS * STAGING_CHUNK]
    assert len(third) == 5 * STAGING_BUFFERS and _whole_and_apart(third, fake.registered)
    backend.close()
    assert fake.registered == {} and fake.events == 0 and backend._stagings == []


def test_a_reader_past_those_announced_gets_a_region_of_its_own(fake: FakeDriver) -> None:
    backend = _backend(fake)
    backend.prepare_staging(1)
    _fill_threads = [threading.Thread(target=backend.staging) for _ in range(2)]
    for t in _fill_threads:
        t.start()
        t.join()
    assert sorted(fake.registered.values()) == [STAGING_BUFFERS * STAGING_CHUNK] * 2
    backend.close()
    assert fake.registered == {}


def test_the_announced_region_is_kept_past_a_reader_that_pinned_its_own(fake: FakeDriver) -> None:
    backend = _backend(fake)
    backend.prepare_staging(2)
    for _ in range(3):  # one reader past the two announced
        t = threading.Thread(target=backend.staging)
        t.start()
        t.join()
    assert fake.registrations == 2
    # The next fill announces two again: the first region holds them.
    again = _fill(backend, 2)
    assert fake.registrations == 2 and list(fake.registered.values()) == [2 * STAGING_BUFFERS * STAGING_CHUNK]
    assert _whole_and_apart(again, fake.registered)
    backend.close()
    assert fake.registered == {}


def test_regions_are_unpinned_even_when_a_stream_cannot_be_waited_for(fake: FakeDriver) -> None:
    backend = _backend(fake)
    _fill(backend, 2)
    fake.fail_sync = True
    with pytest.raises(DeviceError, match="cuStreamSynchronize"):
        backend.close()
    # Every reader's staging freed all the same (none left viewing a region
    # that is gone), and every region unpinned.
    assert fake.events == 0 and backend._stagings == []
    assert fake.registered == {}


def test_a_region_the_driver_cannot_unpin_is_said_and_unmapped(fake: FakeDriver, caplog) -> None:
    region = cuda._PinnedRegion(fake, cuda._PinnedRegion.HUGE)
    fake.cuMemHostUnregister = lambda ptr: (FAILED,)
    with caplog.at_level(logging.WARNING, "wcached.cuda"):
        region.close()
    assert "cuMemHostUnregister of the staging region failed: CUDA_ERROR_STAND_IN" in caplog.text
    assert region._map.closed


def test_the_region_is_huge_pages_kept_from_forked_children(fake: FakeDriver) -> None:
    """Asked for as transparent huge pages (one fault per 2 MiB, ~2x faster
    to pin) and marked not to be inherited by a fork, as CUDA's own pinned
    allocations are; the kernel's flags for the mapping say both."""
    region = cuda._PinnedRegion(fake, 2 * cuda._PinnedRegion.HUGE)
    try:
        assert region.base % cuda._PinnedRegion.HUGE == 0
        assert fake.registered == {region.base: region.nbytes}
        flags = _vm_flags(region.base)
        assert "dc" in flags, flags  # VM_DONTCOPY: MADV_DONTFORK
        try:
            thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
        except OSError:  # a kernel without THP: base pages, still correct
            thp = "[never]"
        if "[never]" not in thp:
            assert "hg" in flags, flags  # VM_HUGEPAGE: MADV_HUGEPAGE
    finally:
        region.close()
    assert fake.registered == {}


def _vm_flags(address: int) -> list[str]:
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and line.startswith("VmFlags:"):
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")
