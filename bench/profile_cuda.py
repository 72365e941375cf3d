"""Where a CUDA fill's and an attach's time goes (H200), to choose what to
speed up next: the safetensors fill run in-process with its reads, digests,
staging waits, copies and pinned allocations timed per call, and attach()
in a fresh process under cProfile.

Run from the repo root after bench/attach_cuda.py made its checkpoints:
python3 bench/profile_cuda.py [--data DIR].
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from attach_cuda import generate, many_shapes
from common import DATA, LLAMA8B, REPO, copy_to_out, write_result

from tests.helpers import run_daemon, write_config
from wcached.cli.demo import llama_shapes

TIMES: dict[str, float] = collections.defaultdict(float)
CALLS: dict[str, int] = collections.defaultdict(int)
LOCK = threading.Lock()


def timed(name, fn):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            dt = time.perf_counter() - t0
            with LOCK:
                TIMES[name] += dt
                CALLS[name] += 1

    return wrapper


class TimedHasher:
    def __init__(self, inner):
        self.inner = inner

    def update(self, data):
        t0 = time.perf_counter()
        self.inner.update(data)
        dt = time.perf_counter() - t0
        with LOCK:
            TIMES["xxh3 update"] += dt
            CALLS["xxh3 update"] += 1

    def hexdigest(self):
        return self.inner.hexdigest()


def profile_fill(ckpt: Path, digest: bool, readers: int | str) -> dict:
    import xxhash

    from wcached.loaders import safetensors as st
    from wcached.loaders.safetensors import SafetensorsLoader, SafetensorsModel
    from wcached.memory import cuda
    from wcached.protocol.wire import close_fds

    TIMES.clear()
    CALLS.clear()
    backend = cuda.CudaBackend("0")
    backend.prepare_fill()
    real_xxh3 = xxhash.xxh3_128
    patches = [
        (os, "preadv", timed("preadv", os.preadv)),
        (cuda._Staging, "next", timed("staging wait (next)", cuda._Staging.next)),
        (cuda._Staging, "copy", timed("cuMemcpyHtoDAsync+record", cuda._Staging.copy)),
        (cuda._Staging, "__init__", timed("staging allocate", cuda._Staging.__init__)),
        (cuda.CudaSegmentWriter, "write_run", timed("write_run", cuda.CudaSegmentWriter.write_run)),
        (
            cuda.CudaSegmentWriter,
            "write_from_file",
            timed("write_from_file", cuda.CudaSegmentWriter.write_from_file),
        ),
        (cuda.CudaBackend, "synchronize", timed("synchronize", cuda.CudaBackend.synchronize)),
    ]
    patches.append((st.xxhash, "xxh3_128", lambda *a: TimedHasher(real_xxh3(*a))))
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, fn in patches:
        setattr(obj, name, fn)
    try:
        model = SafetensorsModel(name="p", path=str(ckpt), digest=digest, read_threads=readers).parsed()
        t0 = time.perf_counter()
        filled = SafetensorsLoader().fill(model, backend, "0", lambda *a: None)
        wall = time.perf_counter() - t0
    finally:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
    close_fds(filled.fds)
    backend.close()
    nbytes = filled.manifest.total_bytes
    return {
        "digest": digest,
        "readers": readers,
        "wall_s": round(wall, 3),
        "GBps": round(nbytes / wall / 1e9, 2),
        "phases": filled.phases,
        "thread_seconds": {k: round(v, 3) for k, v in sorted(TIMES.items(), key=lambda kv: -kv[1])},
        "calls": dict(CALLS),
    }


ATTACH_PROFILE = """
import cProfile, io, pstats, sys, time, torch
torch.cuda.init(); torch.empty(1, device="cuda")
from wcached.client import attach
from wcached.memory.cuda import driver
driver()
t0 = time.perf_counter()
a = attach("default", "0", socket_dir=sys.argv[1])
a.tensors[a.manifest.tensors[-1].name].view(-1)[0].item()
first = time.perf_counter() - t0
a.close()
pr = cProfile.Profile()
pr.enable()
t0 = time.perf_counter()
a = attach("default", "0", socket_dir=sys.argv[1])
a.tensors[a.manifest.tensors[-1].name].view(-1)[0].item()
second = time.perf_counter() - t0
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
print(f"FIRST {first * 1e3:.3f} ms SECOND(profiled) {second * 1e3:.3f} ms")
print(s.getvalue())
"""

ATTACH_FIRST_PROFILE = """
import cProfile, io, pstats, sys, time, torch
torch.cuda.init(); torch.empty(1, device="cuda")
from wcached.client import attach
from wcached.memory.cuda import driver
driver()
pr = cProfile.Profile()
pr.enable()
a = attach("default", "0", socket_dir=sys.argv[1])
a.tensors[a.manifest.tensors[-1].name].view(-1)[0].item()
pr.disable()
s = io.StringIO()
pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(40)
print(s.getvalue())
"""


def profile_attach(ckpt: Path) -> str:
    work = Path(tempfile.mkdtemp(prefix="wcached-profile-"))
    cfg = write_config(
        work / "wcached.toml",
        models=[{"name": "default", "path": str(ckpt)}],
        daemon={"socket_dir": str(work / "run")},
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    out = []
    with run_daemon(cfg, "0", timeout=900) as d:
        for script in (ATTACH_PROFILE, ATTACH_FIRST_PROFILE):
            r = subprocess.run(
                [sys.executable, "-c", script, d.socket_dir], capture_output=True, text=True, env=env
            )
            out.append(r.stdout + r.stderr[-2000:])
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(DATA))
    args = p.parse_args()
    res: dict = {}
    texts = []
    for name, shapes, shards in (("llama8b", llama_shapes(LLAMA8B), 4), ("many", many_shapes(), 2)):
        ckpt = Path(args.data) / name
        generate(ckpt, shapes, shards)
        for digest in (True, False):
            for readers in ("auto", 12):
                r = profile_fill(ckpt, digest, readers)
                res[f"fill {name} digest={digest} readers={readers}"] = r
                print(name, json.dumps(r), flush=True)
        text = profile_attach(ckpt)
        res[f"attach {name}"] = text
        texts.append(f"## attach {name}\n\n```\n{text}\n```\n")
        print(text, flush=True)
    path = write_result("cuda-profile", {"results": res}, "\n".join(texts))
    copy_to_out(path)


if __name__ == "__main__":
    main()
