"""The vLLM cache key, field by field, with real vLLM configurations.

Each variant changes one thing on the engine's side; the daemon compares the
key the engine expects with the one it holds (``mismatched_fields``, what
answers an attach) and must name exactly the field that says so. What does
not change weights (how the path is spelled, max_model_len) must not miss.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import msgspec
import pytest

from tests.integrations.test_vllm import VLLM_PYTHONS
from wcached.cli.demo import LLAMA_TINY, generate_llama
from wcached.keys import CacheKey, mismatched_fields
from wcached.loaders.vllm.key import expected_fields

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("vllm_key_variants.py")

# name -> (what changes, the fields a daemon holding the base key names)
VARIANTS: dict[str, tuple[dict, list[str]]] = {
    "dtype": ({"engine": {"dtype": "float16"}}, ["dtype"]),
    "revision": ({"engine": {"revision": "v2"}}, ["extra.model.revision"]),
    "model_impl": ({"engine": {"model_impl": "transformers"}}, ["extra.model.model_impl"]),
    "hf_overrides": ({"engine": {"hf_overrides": {"rms_norm_eps": 1e-6}}}, ["extra.config"]),
    "quantization": ({"engine": {"quantization": "fp8"}}, ["extra.quantization"]),
    "kv_cache_dtype": ({"engine": {"kv_cache_dtype": "fp8"}}, ["extra.kv_cache_dtype"]),
    "trust_remote_code": ({"engine": {"trust_remote_code": True}}, ["extra.model.trust_remote_code"]),
    "draft": ({"role": "draft"}, ["extra.role"]),
    "kernel_env": ({"env": {"VLLM_MARLIN_USE_ATOMIC_ADD": "1"}}, ["extra.layout_env"]),
    "checkpoint": ({"model": "copy"}, ["fingerprint"]),
    "architecture": ({"model": "mistral"}, ["extra.architecture", "extra.config"]),
    "path_spelling": ({"model": "current/"}, []),
    "max_model_len": ({"engine": {"max_model_len": 128}}, []),
    # Against a mixture of experts without expert parallelism: experts are
    # then sharded over tp x dp, so the data-parallel layout joins the key.
    "expert_parallel": (
        {"model": "moe", "engine": {"enable_expert_parallel": True}},
        [
            "extra.parallel.data_parallel_rank",
            "extra.parallel.data_parallel_size",
            "extra.parallel.enable_expert_parallel",
        ],
    ),
}


def _keys(python: str, variants: list[dict]) -> dict[str, CacheKey]:
    r = subprocess.run(
        [python, str(SCRIPT), json.dumps(variants)], capture_output=True, text=True, timeout=600
    )
    out = {}
    for line in r.stdout.splitlines():
        if line.startswith("KEY "):
            row = json.loads(line[4:])
            assert "error" not in row, row
            out[row["name"]] = msgspec.convert(row["key"], CacheKey)
    assert len(out) == len(variants), r.stdout[-2000:] + r.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, dict[str, CacheKey]]:
    pythons = {v: p for v, p in VLLM_PYTHONS.items() if os.path.exists(p)}
    if set(pythons) != set(VLLM_PYTHONS):
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must have every vLLM virtualenv: {VLLM_PYTHONS}")
        pytest.skip("no vLLM virtualenvs (make vllm-venv)")
    w = tmp_path_factory.mktemp("keys")
    model = generate_llama(w / "model")
    os.symlink(model, w / "current")
    shutil.copytree(model, w / "copy")  # the same bytes, another file: another checkpoint
    # The same shards (hard links), another architecture in config.json.
    (w / "mistral").mkdir()
    for f in model.iterdir():
        if f.name != "config.json":
            os.link(f, w / "mistral" / f.name)
    (w / "mistral" / "config.json").write_text(
        json.dumps({**LLAMA_TINY, "architectures": ["MistralForCausalLM"], "model_type": "mistral"})
    )
    # A mixture of experts (config only: the key reads no weights).
    (w / "moe").mkdir()
    moe = {**LLAMA_TINY, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral"}
    (w / "moe" / "config.json").write_text(
        json.dumps({**moe, "num_local_experts": 4, "num_experts_per_tok": 2})
    )
    variants = [{"name": "base", "model": str(model)}, {"name": "moe_base", "model": str(w / "moe")}]
    for name, (change, _) in VARIANTS.items():
        v = {"name": name, "model": str(model), **change}
        if "model" in change:
            v["model"] = str(w / change["model"])
        variants.append(v)
    return {
        "0.32": _keys(VLLM_PYTHONS["0.32"], variants),
        "0.27": _keys(VLLM_PYTHONS["0.27"], variants[:1]),
    }


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_a_changed_setting_is_named_by_its_field(keys: dict, name: str) -> None:
    k = keys["0.32"]
    base = k["moe_base" if name == "expert_parallel" else "base"]
    assert mismatched_fields(base, expected_fields(k[name])) == VARIANTS[name][1]


def test_the_vllm_release_is_named(keys: dict) -> None:
    old, new = keys["0.27"]["base"], keys["0.32"]["base"]
    differ = mismatched_fields(new, expected_fields(old))
    assert "extra.vllm_version" in differ
    assert old.fingerprint == new.fingerprint and old.dtype == new.dtype


def test_the_key_has_no_path_and_no_transformers_rendering(keys: dict) -> None:
    key = keys["0.32"]["base"]
    assert "model.model" not in key.extra and "model.hf_config" not in key.extra
    assert not any(str(v).startswith("/") for v in key.extra.values()), key.extra
