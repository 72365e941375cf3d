"""Host memory a fill holds while it casts a tensor over 2 GiB.

A 2.24 GB float32 tensor (an embedding of a large model) is filled cast to
bfloat16 into host memory, by the safetensors loader as it is now (the cast
reads and converts pieces of ``READ_CHUNK`` bytes), and, side by side in the
same run, by a whole-tensor cast (read all of it, convert, copy: how fills
cast before the checkpoint owner read in pieces). Each runs in a fresh
process; the figure is its peak resident memory (``VmHWM``) above what
the process held after importing torch, next to the 1.12 GB the filled
segment itself must hold.

    .venv/bin/python bench/fill_cast_memory.py
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import REPO, write_result

N = 560_000_000  # 2.24 GB as float32

CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[3])
import torch

def rss():
    # The high-water mark of this process's own memory (VmHWM: ru_maxrss
    # would carry the parent's across fork and exec).
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

from wcached.loaders.checkpoint import Checkpoint, read_pieces
from wcached.loaders.safetensors import SafetensorsLoader, SafetensorsModel
from wcached.memory.host import HostBackend
base = rss()
how, path = sys.argv[1], sys.argv[2]
start = time.monotonic()
if how == "pieces":
    model = SafetensorsModel(name="big", path=path, dtype="bfloat16", segment_size="4GiB", digest=True)
    filled = SafetensorsLoader().fill(model, HostBackend(), "cpu0", lambda done, total: None)
    segment = filled.manifest.total_bytes
else:
    import ctypes, mmap
    t = Checkpoint(path).headers().tensors[0]
    fd = os.open(t.file, os.O_RDONLY)
    raw = bytearray(t.nbytes)
    view = memoryview(raw)
    at = 0
    for piece in read_pieces(fd, t):  # the whole tensor, held at once
        view[at : at + len(piece)] = piece
        at += len(piece)
    dst = torch.frombuffer(raw, dtype=torch.float32).to(torch.bfloat16)
    data = ctypes.string_at(dst.data_ptr(), dst.numel() * 2)
    segment = len(data)
    seg = mmap.mmap(-1, segment)
    seg[:] = data
print(json.dumps({"how": how, "peak_above_import": rss() - base, "base": base, "segment_bytes": segment,
                  "seconds": time.monotonic() - start}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=None, help="where to write the 2.24 GB checkpoint (default: a temp dir)")
    args = ap.parse_args()
    import torch
    from safetensors.torch import save_file

    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        path = Path(d) / "model.safetensors"
        big = torch.arange(N, dtype=torch.float32).remainder_(65521.0)
        save_file({"big": big}, str(path))
        del big
        runs = {}
        for how in ("whole", "pieces"):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, how, str(path), str(REPO)],
                capture_output=True,
                text=True,
                check=True,
            )
            runs[how] = json.loads(out.stdout.strip().splitlines()[-1])
    seg = runs["pieces"]["segment_bytes"]
    rows = [
        "| cast of a 2.24 GB float32 tensor to bfloat16 | peak RSS above import | x the filled segment | s |",
        "|---|---|---|---|",
    ]
    for how, label in (("whole", "whole tensor at once (before)"), ("pieces", "in READ_CHUNK pieces (now)")):
        r = runs[how]
        rows.append(
            f"| {label} | {r['peak_above_import'] / 2**30:.2f} GiB | "
            f"{r['peak_above_import'] / seg:.2f}x | {r['seconds']:.1f} |"
        )
    ratio = runs["whole"]["peak_above_import"] / max(runs["pieces"]["peak_above_import"], 1)
    rows.append(
        f"\nThe piecewise cast holds {ratio:.1f}x less host memory, measured side by side in this run."
    )
    table = "\n".join(rows)
    write_result("fill-cast-memory", {"tensor_bytes": N * 4, "runs": runs, "whole_over_pieces": ratio}, table)
    print(table)


if __name__ == "__main__":
    main()
