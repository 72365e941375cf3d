"""Where a fresh process's first attach() spends its time, phase by phase.

cProfile's own overhead is of the order of what it measures here (a few ms
over a few thousand calls), so this wraps only the phases attach() goes
through, with perf_counter, in a fresh client process per round:

  socket: finding the socket directory and the instance's socket path (a GPU
          index resolves through NVML);
  connect: connect, peer check, hello -> welcome (a client that pipelines
           its attach request sends it in the hello's write);
  request: waiting for the attached reply and decoding its manifest (the
           daemon's work);
  fds: receiving the segments' fds;
  map: the backend's import and mapping of the segments;
  close: closing the received fds (the memory is held by then);
  views: one tensor view per manifest entry;
  backend: the memory backend's set-up for the segments' device;
  lease: the lease's watch (with the watcher thread's start where that is
         not done inside connect);
  other: the rest of attach() (total less the phases above);
  touch: reading the last tensor's first element (first use of the mapping).

Runs on the host device (``--instance cpu0``, any machine) and on a GPU
(``--instance 0``, with bench/attach_cuda.py's checkpoints under --data).
python3 bench/attach_phases.py --instance 0 --data /var/tmp/data --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, REPO, copy_to_out, write_result

from tests.helpers import run_daemon, write_config

CLIENT = """
import json, sys, time
import torch
instance, socket_dir, warm_d2h, collect = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4] == "1"
by_uuid = sys.argv[5] == "1"
if not instance.startswith("cpu"):
    torch.cuda.init(); torch.empty(1, device="cuda")
    if warm_d2h:  # the process's first device-to-host copy, before timing
        torch.zeros(1, device="cuda").item()
    from wcached.memory.cuda import driver
    driver()
if by_uuid:  # as the vLLM plugin names its GPU
    instance = "GPU-" + str(torch.cuda.get_device_properties(int(instance)).uuid)
import wcached.client.attach
A = sys.modules["wcached.client.attach"]  # the package's attach() shadows the module
from wcached.memory import get_backend

phases = {}

def timed(name, fn):
    def wrapper(*a, **k):
        t0 = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - t0
    return wrapper

A.find_socket_dir = timed("socket", A.find_socket_dir)
A.socket_path = timed("socket", A.socket_path)
from wcached.client.connection import DaemonConnection
from wcached.protocol.wire import Channel
# connect: hello -> welcome (with a pipelined attach request sent in it where
# the tree does that); request: waiting for and decoding the attached reply.
connecting = [False]
_connect, _receive = DaemonConnection._connect, DaemonConnection.receive
def connect_timed(self, *a, **k):
    connecting[0] = True
    try:
        return timed("connect", _connect)(self, *a, **k)
    finally:
        connecting[0] = False
def receive_timed(self):
    return _receive(self) if connecting[0] else timed("request", _receive)(self)
DaemonConnection._connect = connect_timed
DaemonConnection.receive = receive_timed
Channel.recv_fds = timed("fds", Channel.recv_fds)
def backend_timed(kind, device):
    t0 = time.perf_counter()
    b = get_backend(kind, device)
    phases["backend"] = time.perf_counter() - t0
    b.map_segments = timed("map", b.map_segments)
    return b
A.get_backend = backend_timed
A.build_views = timed("views", A.build_views)
# lease: the lease's watch (and the watcher thread's start, in a tree that
# does not start it inside connect while the daemon answers).
A.LeaseWatch.__init__ = timed("lease", A.LeaseWatch.__init__)
A.close_fds = timed("close", A.close_fds)

if collect:  # an engine's heap has settled long before it attaches
    import gc
    gc.collect()
t0 = time.perf_counter()
a = A.attach("default", instance, socket_dir=socket_dir)
t1 = time.perf_counter()
# The last view, found without reading manifest.tensors (which a protocol-3
# client makes from the runs only when asked).
a.tensors[next(reversed(a.tensors))].view(-1)[0].item()
t2 = time.perf_counter()
phases["touch"] = t2 - t1
phases["total"] = t2 - t0
phases["other"] = t1 - t0 - sum(v for k, v in phases.items() if k not in ("touch", "total"))
print(json.dumps({**{k: v * 1e3 for k, v in phases.items()}, "wcached": A.__file__}))
"""

ORDER = (
    "socket",
    "connect",
    "request",
    "fds",
    "backend",
    "map",
    "close",
    "views",
    "lease",
    "other",
    "touch",
    "total",
)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--instance", default="cpu0")
    p.add_argument("--data", default=str(DATA))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument(
        "--trees",
        nargs="+",
        default=[str(REPO)],
        help="source trees whose client is timed, in turn against the same daemon (side by side)",
    )
    p.add_argument("--checkpoints", nargs="+", default=["llama8b", "many"])
    p.add_argument(
        "--warm-d2h",
        action="store_true",
        help="copy from the GPU once before timing (an engine has used CUDA before it binds weights)",
    )
    p.add_argument(
        "--by-uuid",
        action="store_true",
        help="name the GPU by torch's UUID, as the vLLM plugin does, instead of --instance's index",
    )
    p.add_argument(
        "--collect",
        action="store_true",
        help="collect the client's garbage before timing (the imports' young objects, which an engine's "
        "first collection after them would otherwise scan inside attach)",
    )
    args = p.parse_args()
    # Each tree's client alternates with the others' against one daemon.
    labels = [Path(t).name if len(args.trees) > 1 else "" for t in args.trees]
    results: dict[str, dict] = {}
    for name in args.checkpoints:
        ckpt = Path(args.data) / name
        if not (ckpt / "model.safetensors.index.json").exists():
            sys.exit(f"{ckpt}: no checkpoint (bench/attach_cuda.py makes llama8b and many)")
        work = Path(tempfile.mkdtemp(prefix="wcached-phases-"))
        cfg = write_config(
            work / "wcached.toml",
            models=[{"name": "default", "path": str(ckpt)}],
            daemon={"socket_dir": str(work / "run")},
        )
        rounds: dict[str, list[dict]] = {label: [] for label in labels}
        with run_daemon(cfg, args.instance, timeout=900) as d:
            for _ in range(args.rounds):
                for tree, label in zip(args.trees, labels, strict=True):
                    env = dict(
                        os.environ, PYTHONPATH=os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")])
                    )
                    r = subprocess.run(
                        [
                            # -P: no working directory at the head of sys.path,
                            # which would put the repository's wcached before
                            # the tree's (PYTHONPATH) and time it for both.
                            sys.executable,
                            "-P",
                            "-c",
                            CLIENT,
                            args.instance,
                            d.socket_dir,
                            str(int(args.warm_d2h)),
                            str(int(args.collect)),
                            str(int(args.by_uuid)),
                        ],
                        capture_output=True,
                        text=True,
                        env=env,
                    )
                    if r.returncode:
                        sys.exit(r.stderr)
                    got = json.loads(r.stdout.splitlines()[-1])
                    imported = Path(got.pop("wcached")).resolve()
                    if not imported.is_relative_to(Path(tree).resolve()):
                        sys.exit(f"the client meant to be {tree}'s imported {imported}")
                    rounds[label].append(got)
        for label, got in rounds.items():
            key = f"{name} {label}".strip()
            results[key] = {k: round(statistics.median(r.get(k, 0.0) for r in got), 3) for k in ORDER}
            results[key]["rounds"] = got
            print(key, json.dumps({k: results[key][k] for k in ORDER}), flush=True)
    lines = ["| phase (median ms) | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    for k in ORDER:
        lines.append(f"| {k} | " + " | ".join(str(results[n][k]) for n in results) + " |")
    text = "\n".join(lines) + (
        f"\n\nInstance {args.instance}, {args.rounds} fresh processes per checkpoint"
        f"{', a device-to-host copy before timing' if args.warm_d2h else ''}"
        f"{', garbage collected before timing' if args.collect else ''}"
        f"{', the GPU named by its UUID' if args.by_uuid else ''}"
        + (f"; trees {', '.join(args.trees)} alternating" if len(args.trees) > 1 else "")
        + ".\n"
    )
    print(text)
    kind = "host" if args.instance.startswith("cpu") else "cuda"
    variant = (
        ("-warm-d2h" if args.warm_d2h else "")
        + ("-collected" if args.collect else "")
        + ("-by-uuid" if args.by_uuid else "")
    )
    path = write_result(f"attach-phases-{kind}{variant}", results, text)
    copy_to_out(path)


if __name__ == "__main__":
    main()
