"""The CUDA backend against a real GPU (``-m gpu``; skipped without one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import (
    as_bytes,
    other_users_can_run_python,
    run_as,
    run_daemon,
    tied_model_config,
    write_config,
    write_sharded,
)

pytestmark = pytest.mark.gpu


@pytest.fixture
def gpu_config(work: Path, sharded_ckpt: Path) -> Path:
    return tied_model_config(work, sharded_ckpt, "4MiB", allowed_users=["nobody"])


def test_bit_exact_against_load_file_on_cuda(gpu_config: Path, sharded_ckpt: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from wcached.client import attach

    ref = {}
    for f in sorted(sharded_ckpt.glob("*.safetensors")):
        ref.update(load_file(str(f), device="cuda"))
    with run_daemon(gpu_config, "0") as d:
        with attach("default", "0", socket_dir=d.socket_dir) as a:
            assert a.manifest.segments[0].backend == "cuda"
            assert a.manifest.segments[0].device.startswith("GPU-")
            for name, t in ref.items():
                got = a.tensors[name]
                assert got.is_cuda and got.dtype == t.dtype and got.shape == t.shape, name
                assert torch.equal(as_bytes(got), as_bytes(t)), name
            assert a.tensors["lm_head.weight"].data_ptr() == a.tensors["embed.weight"].data_ptr()


def test_socket_named_by_gpu_uuid(gpu_config: Path) -> None:
    import torch

    from wcached.client import attach
    from wcached.device import instance_id_for, resolve_instance
    from wcached.memory.cuda import device_ordinal

    dev = resolve_instance("0")
    # The vLLM plugin names its GPU by torch's UUID; the client takes it as
    # the socket's name without NVML, so it must be spelled as NVML does.
    # (torch numbers GPUs as CUDA does, which need not be NVML's order.)
    by_torch = "GPU-" + str(torch.cuda.get_device_properties(device_ordinal(dev.instance_id)).uuid)
    assert instance_id_for(by_torch) == by_torch == dev.instance_id
    with run_daemon(gpu_config, "0") as d:
        sock = os.path.join(d.socket_dir, f"{dev.instance_id}.sock")
        assert os.path.exists(sock)
        with attach("default", by_torch, socket_dir=d.socket_dir, keep_lease=False) as a:
            assert a.manifest.segments[0].device == dev.instance_id


WRITER = textwrap.dedent(
    """
    import sys, torch
    from wcached.client import attach
    a = attach("default", "0", socket_dir=sys.argv[1])
    t = a.tensors["layer.0.fp32"]
    print("before", float(t[0]), flush=True)
    try:
        t.fill_(42.0)
        torch.cuda.synchronize()
        print("write went through", flush=True)
    except Exception as e:
        print("faulted:", type(e).__name__, str(e).splitlines()[0], flush=True)
    """
)


def test_write_faults_in_writer_only_and_cache_stays_intact(gpu_config: Path) -> None:
    import torch

    from wcached.client import attach

    with run_daemon(gpu_config, "0") as d:
        r = subprocess.run(
            [sys.executable, "-c", WRITER, d.socket_dir], capture_output=True, text=True, timeout=120
        )
        assert "before" in r.stdout, r.stderr
        assert "write went through" not in r.stdout, r.stdout
        # The fault the read-only mapping causes, not just any error.
        said = (r.stdout + r.stderr).lower()
        assert "illegal" in said or "invalid address" in said, (r.stdout, r.stderr)
        with attach("default", "0", socket_dir=d.socket_dir) as a:
            assert not torch.any(a.tensors["layer.0.fp32"] == 42.0)
        assert d.proc.poll() is None


def test_attached_engine_keeps_reading_after_daemon_sigkill(gpu_config: Path, sharded_ckpt: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from wcached.client import attach

    reference = {}
    for f in sorted(sharded_ckpt.glob("*.safetensors")):
        reference.update(load_file(str(f), device="cuda"))
    with run_daemon(gpu_config, "0") as d:
        a = attach("default", "0", socket_dir=d.socket_dir, keep_lease=False)
        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        torch.cuda.synchronize()
        # Every tensor still holds the checkpoint's bytes with no daemon left.
        for name, ref in reference.items():
            assert torch.equal(as_bytes(a.tensors[name]), as_bytes(ref)), name
        a.close()


@pytest.mark.skipif(not other_users_can_run_python(), reason="needs root and an interpreter others can run")
def test_another_allowed_uid_attaches(gpu_config: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        from wcached.client import attach
        with attach("default", "0", socket_dir=sys.argv[1]) as a:
            print("attached", len(a.tensors), float(a.tensors["layer.0.fp32"].sum()))
        """
    )
    with run_daemon(gpu_config, "0") as d:
        os.chmod(d.socket_dir, 0o755)
        os.chmod(d.socket_path, 0o666)
        r = run_as("nobody", [sys.executable, "-c", script, d.socket_dir])
        assert r.returncode == 0 and r.stdout.startswith("attached"), (r.stdout, r.stderr)


def test_daemon_has_no_cuda_context(gpu_config: Path) -> None:
    from wcached.client import attach

    with run_daemon(gpu_config, "0") as d, attach("default", "0", socket_dir=d.socket_dir) as a:
        assert a.tensors
        maps = Path(f"/proc/{d.proc.pid}/maps").read_text()
        assert "libcuda" not in maps
        assert "libnvidia-ml" not in maps
        assert "libcudart" not in maps and "libtorch" not in maps
        apps = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert str(d.proc.pid) not in apps


def test_device_oom_is_a_clear_fill_error() -> None:
    from wcached.device import resolve_instance
    from wcached.errors import FillError
    from wcached.memory.cuda import CudaBackend

    backend = CudaBackend(resolve_instance("0").instance_id)
    with pytest.raises(FillError, match=r"out of memory: segment big needs 4096\.00 GiB"):
        backend.allocate(4 << 40, "big")
    backend.close()


def test_wrong_gpu_index_fails_with_clear_error(gpu_config: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "wcached", "serve", "97", "--config", str(gpu_config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 78
    assert "no GPU with index 97" in r.stderr


def test_fill_and_attach_many_tensors_across_segments(work: Path) -> None:
    import torch

    from wcached.client import attach

    # 1.1 MiB tensors in 2 MiB segments: one segment each, 300 fds in all.
    tensors = {f"t{i}": torch.full((600, 1000), i / 7, dtype=torch.bfloat16) for i in range(300)}
    ckpt = write_sharded(work / "many", tensors, shards=3)
    cfg = write_config(
        work / "many.toml",
        models=[{"name": "default", "path": str(ckpt), "segment_size": "2MiB"}],
        daemon={"socket_dir": str(work / "run")},
    )
    with run_daemon(cfg, "0") as d, attach("default", "0", socket_dir=d.socket_dir) as a:
        assert len(a.manifest.segments) > 253  # more fds than one SCM_RIGHTS batch
        for name, t in tensors.items():
            assert torch.equal(a.tensors[name].cpu(), t), name


def test_runs_of_small_and_chunk_sized_tensors_fill_bit_exact(work: Path) -> None:
    """Tensors back to back in the segment (copied together), with alignment
    gaps between them (copied apart), and ones at and past the staging
    chunk (several copies each): every byte and every digest as on disk."""
    import torch
    from safetensors.torch import load_file

    from wcached import tensor_digest
    from wcached.client import attach
    from wcached.memory.cuda import STAGING_CHUNK

    g = torch.Generator().manual_seed(7)
    tensors = {}
    for i in range(400):
        n = (64, 100, 333, 1024)[i % 4]  # 128 bytes and 2 KiB share alignment; 200 and 666 do not
        tensors[f"small.{i:03d}"] = torch.randn(n, generator=g).to(torch.bfloat16)
    tensors["chunk.exact"] = torch.randn(STAGING_CHUNK // 2, generator=g).to(torch.bfloat16)
    tensors["chunk.over"] = torch.randn(STAGING_CHUNK // 2 + 3, generator=g).to(torch.bfloat16)
    tensors["chunk.many"] = torch.randn(5 * STAGING_CHUNK // 4 + 1, generator=g)
    ckpt = write_sharded(work / "mixed", tensors, shards=2)
    cfg = write_config(
        work / "mixed.toml",
        models=[{"name": "default", "path": str(ckpt), "alignment": 128}],
        daemon={"socket_dir": str(work / "run")},
    )
    ref = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        ref.update(load_file(str(f)))
    with run_daemon(cfg, "0") as d, attach("default", "0", socket_dir=d.socket_dir) as a:
        # A CUDA fill digests its own memory on the GPU (wmix128); each digest
        # is checked against torch's reference over the bytes on disk.
        assert a.manifest.attrs["digest"] == tensor_digest.DEVICE
        digests = {t.name: t.digest for t in a.manifest.tensors}
        for name, t in ref.items():
            got = as_bytes(a.tensors[name]).cpu()
            assert torch.equal(got, as_bytes(t)), name
            assert digests[name] == tensor_digest.torch_digest(as_bytes(t).reshape(-1)), name


def test_staging_buffers_come_from_one_pinned_region_per_announced_fill() -> None:
    import ctypes
    import itertools
    import threading

    from wcached.device import resolve_instance
    from wcached.memory.cuda import STAGING_BUFFERS, STAGING_CHUNK, CudaBackend, check

    backend = CudaBackend(resolve_instance("0").instance_id)
    backend.prepare_fill()
    backend.prepare_staging(2)
    stagings = []

    def take() -> None:
        stagings.append(backend.staging())

    for _ in range(3):  # one past the two announced
        th = threading.Thread(target=take)
        th.start()
        th.join()
    regions = list(backend._regions)
    assert [r.nbytes for r in regions] == [
        2 * STAGING_BUFFERS * STAGING_CHUNK,
        STAGING_BUFFERS * STAGING_CHUNK,
    ]
    ptrs = [ptr for st in stagings for ptr, _, _ in st.buffers]
    assert len(set(ptrs)) == 3 * STAGING_BUFFERS
    # None overlapping: each reader fills its own at once.
    ordered = sorted(ptrs)
    assert all(q - p >= STAGING_CHUNK for p, q in itertools.pairwise(ordered))
    first = ptrs[: 2 * STAGING_BUFFERS]  # the two announced threads
    assert all(regions[0].base <= p < regions[0].base + regions[0].nbytes for p in first)
    # Each buffer is registered with the driver (pinned). The driver knows no
    # memory type for pageable memory, which a copy would read just as well.
    cu = backend.cu

    def memory_type(ptr: int) -> int | None:
        err, kind = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ptr)
        return int(kind) if err == cu.CUresult.CUDA_SUCCESS else None

    pageable = ctypes.create_string_buffer(1 << 16)
    assert memory_type(ctypes.addressof(pageable)) is None
    host = int(cu.CUmemorytype.CU_MEMORYTYPE_HOST)
    assert [memory_type(p) for p in ptrs] == [host] * len(ptrs)
    # And the copy engine reads each into the GPU.
    seg = backend.allocate(STAGING_CHUNK, "probe")
    for st in stagings:
        ptr, view, event = st.next()
        view[:4] = b"wcac"
        st.copy(seg.va, ptr, STAGING_CHUNK, event)
    backend.synchronize()
    got = (ctypes.c_char * 4)()
    check(backend.cu.cuMemcpyDtoH(ctypes.addressof(got), seg.va, 4), "cuMemcpyDtoH")
    assert got.raw == b"wcac"
    seg.abort()
    backend.close()
    assert backend._regions == []
