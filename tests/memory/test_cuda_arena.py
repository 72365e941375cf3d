"""Tensors built in an arena's chunks and exported, on a real GPU (``-m gpu``).

Each test runs in a process of its own: an arena's pool lives as long as its
process, and the worker that uses it fills and exits.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

PRELUDE = """
import os, sys, torch
from wcached.device import resolve_instance
from wcached.memory.cuda import CudaBackend
from wcached.memory.cuda_arena import CudaArena, unsupported_reason
from wcached.protocol.messages import SegmentInfo
assert unsupported_reason() is None, unsupported_reason()
backend = CudaBackend(resolve_instance("0").instance_id)
backend.prepare_fill()
torch.cuda.set_device(backend.ordinal)
MiB = 1 << 20
"""


# The tree under test first on the path of these processes and of their
# children (a child runs a script file, whose own folder is all Python
# adds): the tests then need no installed wcached, as on the GPU machine.
REPO = Path(__file__).resolve().parents[2]


def run(body: str) -> str:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    r = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=path),
    )
    assert r.returncode == 0, r.stdout + r.stderr[-4000:]
    return r.stdout


def test_tensors_built_in_the_arena_are_exported_without_a_copy_and_read_back_elsewhere() -> None:
    out = run(
        """
        import subprocess
        arena = CudaArena(backend, 64 * MiB, "m")
        g = torch.Generator(device="cuda").manual_seed(3)
        with arena.allocating():
            big = torch.randn(40 * MiB // 2, device="cuda", generator=g, dtype=torch.bfloat16)  # exact chunk
            small = [torch.randn(1000 + i, device="cuda", generator=g) for i in range(50)]  # one shared chunk
            # More than the shared chunk's room: an exact chunk, no weight.
            scratch = torch.empty(63 * MiB, dtype=torch.uint8, device="cuda")
        outside = torch.ones(10, device="cuda")  # made after: not the arena's
        assert arena.arena.held_bytes >= (40 + 64 + 64) * MiB
        keep = [big] + small
        del scratch
        spans = [(t.data_ptr(), t.numel() * t.element_size()) for t in keep + [outside]]
        sealed, fds = arena.seal(spans)
        print("chunks", len(sealed.chunks), "unexported", sealed.unexported, "outside", sealed.places[-1])
        assert len(fds) == len(sealed.chunks) == 2
        # The process's own mapping is read-only now.
        try:
            big.add_(1)
            torch.cuda.synchronize()
            print("write not refused")
        except Exception:
            print("write refused")
        # The context is lost after the fault (as an engine's would be).
        sys.stdout.flush()
        os._exit(0)
        """
    )
    assert "chunks 2 unexported 1 outside None" in out, out
    assert "write refused" in out, out


def test_an_exported_chunk_maps_in_another_process_with_the_same_bytes(tmp_path) -> None:
    # The fds pass to a fresh process (inherited, as an engine receives a
    # daemon's), which maps them read-only and reads each tensor back.
    child = tmp_path / "child.py"
    child.write_text(PRELUDE.replace("backend.prepare_fill()\n", "") + CHILD)
    out = run(
        f"""
        import json, subprocess, xxhash
        arena = CudaArena(backend, 64 * MiB, "m")
        g = torch.Generator(device="cuda").manual_seed(5)
        with arena.allocating():
            ts = [torch.randn(n, device="cuda", generator=g) for n in (7, 300_000, 5 * MiB, 17)]
        sealed, fds = arena.seal([(t.data_ptr(), t.numel() * 4) for t in ts])
        plan = {{
            "fds": fds,
            "sizes": [c.nbytes for c in sealed.chunks],
            "places": sealed.places,
            "numels": [t.numel() for t in ts],
            "want": [xxhash.xxh3_64(t.cpu().numpy().tobytes()).hexdigest() for t in ts],
        }}
        r = subprocess.run([sys.executable, {str(child)!r}, json.dumps(plan)], pass_fds=fds, timeout=120)
        print("child", r.returncode)
        """
    )
    assert "child 0" in out, out


CHILD = """
import json, xxhash
plan = json.loads(sys.argv[1])
infos = [
    SegmentInfo(index=i, nbytes=n, backend="cuda", device=backend.uuid) for i, n in enumerate(plan["sizes"])
]
mapping = backend.map_segments(plan["fds"], infos)
for (seg, off), numel, want in zip(plan["places"], plan["numels"], plan["want"]):
    t = mapping.tensors[seg][off : off + numel * 4].view(torch.float32)
    assert xxhash.xxh3_64(t.cpu().numpy().tobytes()).hexdigest() == want, (seg, off, numel)
print("read back", len(plan["want"]))
"""


def test_an_allocation_the_gpu_cannot_hold_is_the_fills_out_of_memory() -> None:
    out = run(
        """
        from wcached.errors import OutOfMemory
        arena = CudaArena(backend, 64 * MiB, "huge")
        try:
            with arena.allocating():
                torch.empty(4 << 40, dtype=torch.uint8, device="cuda")
        except OutOfMemory as e:
            print("oom:", e)
        """
    )
    assert "oom: GPU " in out and "model huge's weights needs 4096.00 GiB" in out, out
