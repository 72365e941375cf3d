"""Restart to READY: restored from the fd store against refilled from disk.

Each round stops the serving daemon (SIGTERM, as ``systemctl restart`` does)
and starts the next one twice, side by side: once handed the fd store the way
systemd hands it (``LISTEN_FDS``; tests.helpers.NotifyListener stands in for
the unit's store), once without it (a refill from the checkpoint, page cache
warm). Recorded per start: seconds from the new process to READY=1 and the
bytes the daemon and its loader worker read (``rchar`` of /proc/PID/io, which
takes in reaped children: every file read, Python's imports included).

    python3 bench/restart_restore.py                       # demo checkpoint on cpu0
    PYTHONPATH=/var/tmp/site python3 bench/restart_restore.py --instance 0 --llama8b   # the H200
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DATA, write_result

from tests.helpers import Daemon, start_daemon, wait_ready, write_config
from wcached.cli.demo import LLAMA_TINY, generate_llama


def rchar(pid: int) -> int:
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError(f"no rchar for {pid}")


def start(cfg: Path, instance: str, store_from: Daemon | None) -> tuple[Daemon, float, int]:
    t0 = time.perf_counter()
    d = start_daemon(cfg, instance, store_from=store_from.notify if store_from else None)
    wait_ready(d, 900)
    ready = time.perf_counter() - t0
    d.notify.drain()
    return d, ready, rchar(d.proc.pid)


def stop(d: Daemon, keep_store: bool) -> None:
    d.stop(signal.SIGTERM, timeout=60)
    d.notify.close(keep_store=keep_store)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--instance", default="cpu0")
    p.add_argument("--llama8b", action="store_true", help="an 8B-shaped Llama, 16 GB, made on the GPU")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--segment-size", default="1GiB")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="wcached-restart-bench-"))
    if args.llama8b:
        from common import LLAMA8B
        from vllm_gpu_load import generate_on_gpu

        model = generate_on_gpu(work / "model", LLAMA8B)
    else:
        model = DATA / "demo-model"
        if not (model / "config.json").exists():
            generate_llama(model, LLAMA_TINY)
    size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    cfg = write_config(
        work / "wcached.toml",
        models=[{"name": "default", "path": str(model), "segment_size": args.segment_size}],
        daemon={"socket_dir": str(work / "run")},
    )
    rows: dict[str, list[float]] = {}
    serving, _, _ = start(cfg, args.instance, None)
    for _ in range(args.rounds):
        stop(serving, keep_store=True)
        restored, ready, read = start(cfg, args.instance, serving)
        assert "restored default" in restored.log(), restored.log()
        rows.setdefault("restore.ready_s", []).append(ready)
        rows.setdefault("restore.read_bytes", []).append(read)
        stop(restored, keep_store=False)  # its store is dropped: the next start refills
        refilled, ready, read = start(cfg, args.instance, None)
        assert "filled default" in refilled.log(), refilled.log()
        rows.setdefault("refill.ready_s", []).append(ready)
        rows.setdefault("refill.read_bytes", []).append(read)
        serving = refilled
        print({k: v[-1] for k, v in rows.items()}, flush=True)
    stop(serving, keep_store=False)
    med = {k: statistics.median(v) for k, v in rows.items()}
    result = {
        "instance": args.instance,
        "checkpoint_bytes": size,
        "segment_size": args.segment_size,
        "rounds": args.rounds,
        "runs": rows,
        "median": med,
    }
    table = "\n".join(
        [
            f"restart to READY, {args.instance}, checkpoint {size / 2**30:.2f} GiB (page cache warm), "
            f"median of {args.rounds}",
            "",
            "| start | READY after | bytes read (all files, imports included) |",
            "|---|---|---|",
            *(
                f"| {label} | {med[k + '.ready_s']:.2f} s | {med[k + '.read_bytes'] / 2**20:.1f} MiB |"
                for label, k in (("restored from the fd store", "restore"), ("refilled from disk", "refill"))
            ),
            "",
            f"refill / restore: {med['refill.ready_s'] / med['restore.ready_s']:.1f}x the time",
        ]
    )
    name = "restart-restore-" + (
        "gpu" if args.instance != "cpu0" and not args.instance.startswith("cpu") else "cpu"
    )
    write_result(name, result, table)
    print(table)


if __name__ == "__main__":
    main()
