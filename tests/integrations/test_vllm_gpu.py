"""vLLM on GPUs, as operators run it (``-m "gpu and vllm"``, on the GPU machine).

A daemon on a GPU fills a Llama-shaped checkpoint through vLLM; an engine with
``--load-format wcache`` and ``fallback`` off generates what a disk engine
generates (bf16, and with ``quantization="fp8"``), with a KV cache sized like
the disk engine's; the daemon holds no CUDA context; and with two GPUs, a
tensor-parallel pair of daemons serves a TP=2 engine.

vLLM runs in this interpreter (the GPU host's ``PYTHONPATH=/var/tmp/site``
bundle); the tests skip where it or a GPU is missing. Each test writes what it
measured to ``$WCACHED_RESULTS`` (default ``bench/results``) as JSON lines.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, run_daemon, start_daemon, wait_ready
from tests.integrations.vllm_engine import free_port, run_engine, vllm_daemon_config, weights_differ
from wcached.cli.demo import LLAMA_TINY, generate_llama

pytestmark = [pytest.mark.gpu, pytest.mark.vllm, pytest.mark.slow]

RESULTS = Path(os.environ.get("WCACHED_RESULTS", REPO / "bench" / "results"))
UTILIZATION = 0.3

# About 1 GiB in bf16: big enough that weight memory shows in the KV-cache
# sizing and in a fill's peak, small enough to generate in seconds.
LLAMA_1G = {
    **LLAMA_TINY,
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "max_position_embeddings": 2048,
}


def _vllm_version() -> str | None:
    try:
        import vllm
    except ImportError:
        return None
    return vllm.__version__


@pytest.fixture(scope="module", autouse=True)
def _needs_vllm() -> None:
    if _vllm_version() is None:
        pytest.skip("vLLM is not importable here (GPU host: PYTHONPATH=/var/tmp/site)")


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def record(test: str, **figures) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    line = {"test": test, "vllm": _vllm_version(), "date": time.strftime("%Y-%m-%d"), **figures}
    with open(RESULTS / "vllm-gpu-tests.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def engine(model: Path, **overrides) -> dict:
    """One engine in a fresh process, in this interpreter, with a digest of
    its weights."""
    overrides.setdefault("gpu_memory_utilization", UTILIZATION)
    overrides.setdefault("_weights", True)
    return run_engine(sys.executable, str(model), overrides, {"VLLM_USE_FLASHINFER_SAMPLER": "0"}, 900)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return generate_llama(tmp_path_factory.mktemp("llama") / "model", LLAMA_1G, shards=2, seed=5)


def _config(work: Path, model_dir: Path, **model: object) -> Path:
    # Small segments: the fill's peak is then the model plus one.
    model.setdefault("segment_size", "256MiB")
    return vllm_daemon_config(sys.executable, work, model_dir, **model)


def _fill_peak(log: str) -> tuple[float, float]:
    m = re.search(r"peak device memory ([0-9.]+) GiB \(([0-9.]+)x the model\)", log)
    assert m, log[-3000:]
    return float(m.group(1)), float(m.group(2))


def weights_share(cfg: Path) -> tuple[int, float]:
    """Bytes the daemon of ``cfg`` holds and their share of its GPU, as
    `wcached status --json` reports them."""
    out = subprocess.run(
        [sys.executable, "-m", "wcached", "status", "--config", str(cfg), "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    status = json.loads(out)[0]
    held = status["models"][0]["bytes"]
    return held, held / status["device_memory_bytes"]


def _verify_every_tensor(cfg: Path, socket_dir: str) -> tuple[int, str]:
    """`wcached verify` of the GPU fill: every tensor with bytes is hashed on
    the GPU serving it and compared with the digest the fill recorded."""
    count = (
        "from wcached.client import attach\n"
        f"with attach('default', '0', socket_dir={socket_dir!r}, keep_lease=False) as a:\n"
        "    m = a.manifest\n"
        "    print(sum(1 for t in m.tensors if t.alias_of is None and t.nbytes), m.attrs['digest'])"
    )
    r = subprocess.run([sys.executable, "-c", count], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    want, algorithm = r.stdout.split()
    assert algorithm == "wmix128"
    argv = [sys.executable, "-m", "wcached", "verify", "0", "--config", str(cfg)]
    v = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert v.returncode == 0, v.stdout + v.stderr
    assert f": ok ({want} tensors checked in memory" in v.stdout, (want, v.stdout)
    return int(want), v.stdout.strip()


def _no_cuda_in(pid: int) -> None:
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "libcuda" not in maps and "libtorch" not in maps
    apps = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True, text=True
    ).stdout.split()
    assert str(pid) not in apps


@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_wcache_engine_on_gpu_matches_disk(work: Path, model_dir: Path, quantization: str | None) -> None:
    q = {"quantization": quantization} if quantization else {}
    disk = engine(model_dir, **q)
    assert disk["rc"] == 0, disk["log"][-4000:]
    cfg = _config(work, model_dir, engine_args=q)
    with run_daemon(cfg, "0", timeout=600) as d:
        _no_cuda_in(d.proc.pid)
        peak_gib, peak_ratio = _fill_peak(d.log())
        # The weights were built in the memory the daemon holds: nothing of
        # them was copied (what torch placed elsewhere would be).
        placed = re.search(r"built in place: (\d+) segments .* (\d+) storages to copy", d.log())
        assert placed and int(placed.group(1)) > 0 and placed.group(2) == "0", d.log()[-3000:]
        held, share = weights_share(cfg)
        extra = {"socket_dir": d.socket_dir, "fallback": False}
        # With a vLLM that cannot count external weights, the setting the
        # engine's log and `wcached status` advise.
        from vllm.model_executor.model_loader.base_loader import BaseModelLoader

        hook = hasattr(BaseModelLoader, "get_external_weight_memory")
        util = UTILIZATION if hook else round(UTILIZATION - share, 4)
        out = engine(
            model_dir, load_format="wcache", model_loader_extra_config=extra, gpu_memory_utilization=util, **q
        )
        assert out["rc"] == 0, out["log"][-4000:]
        assert "wcached: bound" in out["log"]
        if not hook:
            advice = re.search(r"set gpu_memory_utilization=([0-9.]+)", out["log"])
            assert advice, out["log"][-4000:]
            # The engine ran at `util` already: it advises one share lower still.
            assert abs(float(advice.group(1)) - (util - share)) < 0.002, (advice.group(0), share)
        # Or, at the disk engine's own setting, wcached's worker class.
        worker = {}
        if not hook:
            worker = engine(
                model_dir,
                load_format="wcache",
                model_loader_extra_config=extra,
                worker_cls="wcached.integrations.vllm_worker.Worker",
                **q,
            )
            assert worker["rc"] == 0, worker["log"][-4000:]
            assert "weights are mapped from wcached: of the" in worker["log"], worker["log"][-4000:]
            assert "set gpu_memory_utilization" not in worker["log"]
            assert weights_differ(worker["weights"], disk["weights"]) == []
            assert worker["tokens"] == disk["tokens"]
        _no_cuda_in(d.proc.pid)
        checked, verified = _verify_every_tensor(cfg, d.socket_dir)
    # The bytes the engine computes with are the disk engine's, each
    # parameter and buffer (fp8: quantized by the fill as the disk engine
    # quantizes at its load); then what it generates.
    assert weights_differ(out["weights"], disk["weights"]) == []
    assert out["tokens"] == disk["tokens"]
    record(
        f"gpu_matches_disk[{quantization or 'bf16'}]",
        kv_gib_worker_cls=worker.get("kv_gib"),
        kv_tokens_worker_cls=worker.get("kv_tokens"),
        model_bytes=held,
        fill_peak_gib=peak_gib,
        fill_segments_built_in_place=int(placed.group(1)),
        fill_storages_copied=int(placed.group(2)),
        fill_peak_x_model=peak_ratio,
        kv_gib_disk=disk["kv_gib"],
        kv_gib_wcache=out["kv_gib"],
        kv_tokens_disk=disk["kv_tokens"],
        kv_tokens_wcache=out["kv_tokens"],
        utilization_disk=UTILIZATION,
        utilization_wcache=util,
        load_s_disk=disk["vllm_load_s"],
        load_s_wcache=out["vllm_load_s"],
        # The worker class freezes the start-up heap before vLLM's profiler
        # collects it (the plain wcache engine above does not).
        load_s_worker_cls=worker.get("vllm_load_s"),
        form=re.search(r"\((\w+) form\)", out["log"]).group(1),
        verify_tensors_checked_in_memory=checked,
        verify_output=verified,
    )
    # Weights once during the fill: the model plus one 256 MiB segment (and
    # vLLM's transient buffers while quantizing), never twice the model.
    # The loaded checkpoint's size bounds vLLM's own transient (fp8 quantizes
    # layer by layer from bf16, as a disk engine does).
    loaded_gib = max(held, sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))) / 2**30
    assert peak_gib <= 1.25 * loaded_gib + 0.25, (peak_gib, loaded_gib)
    # Memory counted once: the KV cache the disk engine gets, within 1 %.
    assert abs(out["kv_gib"] - disk["kv_gib"]) <= 0.01 * disk["kv_gib"], (out["kv_gib"], disk["kv_gib"])
    if worker:
        kv = (worker["kv_gib"], disk["kv_gib"])
        assert abs(kv[0] - kv[1]) <= 0.01 * kv[1], kv


def test_tensor_parallel_2_daemons_on_gpu0_and_gpu1(work: Path, model_dir: Path) -> None:
    if _gpu_count() < 2:
        pytest.skip("needs two GPUs (the nvidia-h200-x2 machine)")
    disk = engine(model_dir, tensor_parallel_size=2)
    assert disk["rc"] == 0, disk["log"][-4000:]
    # ranks as the operator writes them: GPU indices.
    cfg = _config(
        work,
        model_dir,
        tensor_parallel_size=2,
        rendezvous=f"tcp://127.0.0.1:{free_port()}",
        ranks={"0": 0, "1": 1},
    )
    daemons = [start_daemon(cfg, "0"), start_daemon(cfg, "1")]
    try:
        for d in daemons:
            wait_ready(d, 600)
        extra = {"socket_dir": daemons[0].socket_dir, "fallback": False}
        out = engine(model_dir, load_format="wcache", model_loader_extra_config=extra, tensor_parallel_size=2)
        assert out["rc"] == 0, out["log"][-4000:]
        assert out["log"].count("wcached: bound") == 2
        for d in daemons:
            _no_cuda_in(d.proc.pid)
    finally:
        for d in daemons:
            d.stop()
            d.notify.close()
    assert weights_differ(out["weights"], disk["weights"]) == []
    assert out["tokens"] == disk["tokens"]
    record("tp2_gpu0_gpu1", kv_gib_disk=disk["kv_gib"], kv_gib_wcache=out["kv_gib"])


def test_copy_mode_and_read_only_weights_on_gpu(work: Path, model_dir: Path) -> None:
    """Zero-copy: reload_weights is refused with the fix named, the engine
    keeps serving. Copy mode: the engine's own copy, which reload_weights
    rewrites from disk; both generate the disk engine's tokens."""
    disk = engine(model_dir)
    assert disk["rc"] == 0, disk["log"][-4000:]
    cfg = _config(work, model_dir)
    with run_daemon(cfg, "0", timeout=600) as d:
        _, share = weights_share(cfg)
        extra = {"socket_dir": d.socket_dir, "fallback": False}
        util = round(UTILIZATION - share, 4)
        zero = engine(
            model_dir,
            load_format="wcache",
            model_loader_extra_config=extra,
            gpu_memory_utilization=util,
            _rpc="reload_weights",
        )
        copy = engine(
            model_dir,
            load_format="wcache",
            model_loader_extra_config={**extra, "copy": True},
            _rpc="reload_weights",
        )
    assert zero["rc"] == 0, zero["log"][-4000:]
    assert "read-only mappings" in zero["rpc"] and '"copy": true' in zero["rpc"], zero["rpc"]
    for state in ("weights", "weights_after_rpc"):
        assert weights_differ(zero[state], disk["weights"]) == [], state
    assert zero["tokens"] == disk["tokens"] == zero["tokens_after_rpc"]
    assert copy["rc"] == 0, copy["log"][-4000:]
    assert copy["rpc"] == "ok" and ", copied)" in copy["log"], copy.get("rpc")
    # reload_weights rewrote the engine's own copy from disk: the same bytes.
    for state in ("weights", "weights_after_rpc"):
        assert weights_differ(copy[state], disk["weights"]) == [], state
    assert copy["tokens"] == disk["tokens"] == copy["tokens_after_rpc"]
    record("copy_mode_gpu", rpc_zero_copy=zero["rpc"][:120], rpc_copy=copy["rpc"])


def test_draft_model_attached_on_gpu(work: Path, model_dir: Path) -> None:
    # A one-layer model of the target's shape: the same vocabulary.
    draft_dir = generate_llama(work / "draft", {**LLAMA_1G, "num_hidden_layers": 1}, shards=1, seed=9)
    spec = {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 2}
    disk = engine(model_dir, speculative_config=spec)
    if disk["rc"] != 0:
        pytest.skip(f"this vLLM runs no draft model here: {disk['log'][-600:]}")
    cfg = _config(work, model_dir, draft=draft_dir)
    with run_daemon(cfg, "0", timeout=600) as d:
        _, share = weights_share(cfg)
        extra = {"socket_dir": d.socket_dir, "fallback": False, "draft_model": "draft"}
        out = engine(
            model_dir,
            load_format="wcache",
            model_loader_extra_config=extra,
            speculative_config=spec,
            gpu_memory_utilization=round(UTILIZATION - share, 4),
        )
    assert out["rc"] == 0, out["log"][-4000:]
    assert re.search(r"wcached: bound \d+ tensors of draft ", out["log"]), out["log"][-3000:]
    assert weights_differ(out["weights"], disk["weights"]) == []
    assert out["tokens"] == disk["tokens"]
    record("draft_gpu", tokens_equal=True)


def test_a_vllm_model_filled_before_a_failing_one_is_kept_and_restored(work: Path, model_dir: Path) -> None:
    """The H200 run of issue 17: two vLLM models in one instance, the second
    fails in the worker (here: an architecture vLLM does not know). The first,
    already filled, is in the fd store; the start after the fix restores it
    without a vLLM fill and fills only the second."""
    from wcached.daemon.fdstore import fd_name

    second = generate_llama(work / "second", {**LLAMA_1G, "num_hidden_layers": 1}, shards=1, seed=9)
    good = (second / "config.json").read_text()
    broken = json.loads(good)
    broken["architectures"] = ["NoSuchModelForCausalLM"]
    (second / "config.json").write_text(json.dumps(broken))
    cfg = _config(work, model_dir, draft=second)
    started = time.monotonic()
    first = start_daemon(cfg, "0")
    rc = first.wait_exit(600)
    first_s = time.monotonic() - started
    log = first.log()
    ours = "\n".join(x[:300] for x in log.splitlines() if " wcached daemon" in x or " wcached worker" in x)
    print(ours)  # the first start's own account, kept in the run's output
    assert rc != 0, ours
    names = first.notify.stored_names()
    assert names and all(n.startswith(fd_name("default", "")) for n in names), (names, ours)
    first.notify.close(keep_store=True)
    (second / "config.json").write_text(good)
    started = time.monotonic()
    again = start_daemon(cfg, "0", store_from=first.notify)
    try:
        wait_ready(again, 600)
        ready_s = time.monotonic() - started
        log = again.log()
        assert "restored default from the fd store" in log, log[-3000:]
        assert "filled draft" in log and "filled default" not in log, log[-3000:]
    finally:
        again.stop()
        again.notify.close()
    print(
        f"first start: exit {rc} after {first_s:.1f} s with default kept ({len(names)} fds); "
        f"after the fix: READY in {ready_s:.1f} s, default restored, draft filled"
    )
    record("kept_as_filled_gpu", exit_status=rc, first_start_s=round(first_s, 2), ready_s=round(ready_s, 2))
