"""The cache key of a vLLM model: the one place that says what identifies it.

The loader worker calls :func:`vllm_cache_key` with the configuration it
filled from, the engine plugin with the engine's own, before either loads a
weight (post-processing may rewrite a checkpoint's quantization config). Any
difference in what changes the weights a worker ends up with is then a named
field of a ``KeyMismatch``:

- ``fingerprint``: the checkpoint's content (safetensors headers; names,
  sizes and sampled bytes of other formats; ``hub:<id>@<revision>`` for a
  hub id that is not a local path), never how its path is spelled;
- ``dtype``, ``tp_size``/``tp_rank``, ``pp_size``/``pp_rank``;
- ``extra.vllm_version``, ``extra.architecture``, ``extra.quantization``;
- ``extra.quant_config``: vLLM's weight-cache hash of the checkpoint's and
  the runtime quantization config;
- ``extra.config``: the model's ``config.json`` as a file (not as the
  installed transformers renders it) with ``hf_overrides``;
- ``extra.model.<name>``: every field of vLLM's ``ModelConfig`` hash factors
  (revision, model_impl, trust_remote_code, ...) except those that cannot
  change weights (:data:`MODEL_NOT_WEIGHTS`), so a field a new vLLM adds is
  in the key until someone decides otherwise;
- ``extra.parallel.<name>``: the expert-parallel factors of vLLM's
  ``ParallelConfig`` hash, and the data-parallel layout where experts are
  sharded across it;
- ``extra.kv_cache_dtype``, ``extra.layout_env`` (the kernel-selecting
  ``VLLM_*`` variables set), ``extra.role`` (``target`` or ``draft``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any

from wcached.keys import CacheKey

# vLLM's mark on a layer its quant method processed while loading (online
# quantization processes each layer as soon as it is loaded); the loader
# worker lists such layers and the engine marks them done.
PROCESSED_GUARD = "_already_called_process_weights_after_loading"

# ModelConfig hash factors that cannot change the weights a worker holds:
# where the files are (the fingerprint says what they are), tokenisation,
# sampling, scheduling, memory and sleep-mode settings, and those the key
# carries as fields of their own (dtype, quantization, the hf config).
MODEL_NOT_WEIGHTS = frozenset(
    {
        "model",
        "model_weights",
        "tokenizer",
        "tokenizer_mode",
        "tokenizer_revision",
        "hf_config",
        "hf_text_config",
        "hf_overrides",
        "hf_token",
        "dtype",
        "quantization",
        "quantization_config",
        "seed",
        "served_model_name",
        "skip_tokenizer_init",
        "max_model_len",
        "spec_target_max_model_len",
        "max_logprobs",
        "logprobs_mode",
        "return_sampling_mask",
        "use_fp64_gumbel",
        "generation_config",
        "override_generation_config",
        "logits_processors",
        "logits_processor_pattern",
        "enforce_eager",
        "disable_cascade_attn",
        "disable_sliding_window",
        "enable_prompt_embeds",
        "enable_trace_replay",
        "enable_sleep_mode",
        "sleep_preserve_parameter_names",
        "sleep_mode_backend",
        "sleep_mode_offload_cudagraph",
        "enable_nccl_comm_suspend",
        "enable_cumem_allocator",
        "renderer_num_workers",
        "io_processor_plugin",
        "allowed_local_media_path",
        "allowed_media_domains",
        "limit_mm_per_prompt",
        "media_io_kwargs",
        "mm_processor_kwargs",
        "mm_processor_cache_gb",
        "mm_processor_cache_type",
        "mm_shm_cache_max_object_size_mb",
        "mm_encoder_tp_mode",
        "interleave_mm_strings",
        "skip_mm_profiling",
        "mm_ipc_gpu_memory_gb",
        "multimodal_config",
        "pooler_config",
    }
)

# Words in the names of vLLM environment variables that pick a kernel, and
# with it the layout post-processing gives the weights.
LAYOUT_ENV_WORDS = (
    "MARLIN",
    "DEEP_GEMM",
    "DEEPGEMM",
    "FLASHINFER_MOE",
    "AITER",
    "SGL_KERNEL",
    "MXFP4",
    "NVFP4",
)
LAYOUT_ENV_WORDS += ("CUTLASS", "TRITON_AWQ", "FP8", "MOE")

# Checkpoint formats other than safetensors that vLLM reads from a directory.
OTHER_WEIGHT_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.gguf", "*.npy")


def vllm_cache_key(name: str, vllm_config: Any, model_config: Any, role: str) -> CacheKey:
    """The key of ``name`` as this process's rank of ``model_config`` (the
    target's or the draft's) under ``vllm_config`` loads it. Needs the
    distributed groups initialised; call before any weight is loaded."""
    import vllm
    from vllm.distributed import (
        get_pp_group,
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
    )

    hf = model_config.hf_config
    pp = get_pp_group()
    extra = {
        "vllm_version": vllm.__version__,
        "architecture": ",".join(getattr(hf, "architectures", None) or []) or "unknown",
        "quantization": str(model_config.quantization or "none"),
        "quant_config": _quant_config_hash(model_config),
        "config": _config_hash(model_config),
        "kv_cache_dtype": str(getattr(vllm_config.cache_config, "cache_dtype", "auto")),
        "layout_env": _layout_env(),
        "role": role,
    }
    extra.update({f"model.{k}": v for k, v in _factors(model_config, MODEL_NOT_WEIGHTS).items()})
    extra.update(_parallel_fields(vllm_config.parallel_config))
    return CacheKey(
        model=name,
        loader="vllm",
        fingerprint=checkpoint_fingerprint(model_config.model, model_config.revision),
        dtype=str(model_config.dtype).removeprefix("torch."),
        tp_size=get_tensor_model_parallel_world_size(),
        tp_rank=get_tensor_model_parallel_rank(),
        pp_size=pp.world_size,
        pp_rank=pp.rank_in_group,
        extra=extra,
    )


def role_of(vllm_config: Any, model_config: Any) -> str:
    """``draft`` when vLLM is loading its speculative-decoding draft."""
    spec = getattr(vllm_config, "speculative_config", None)
    draft = getattr(spec, "draft_model_config", None) if spec is not None else None
    return "draft" if draft is not None and model_config is draft else "target"


def expected_fields(key: CacheKey) -> dict[str, str | int]:
    """``attach(expect=...)`` for a key: every field but the model's name."""
    out: dict[str, str | int] = {
        f: getattr(key, f) for f in key.__struct_fields__ if f not in ("model", "extra")
    }
    out.update({f"extra.{k}": v for k, v in key.extra.items()})
    return out


def _compact(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 64 else "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _factors(config: Any, ignored: frozenset[str]) -> dict[str, str]:
    """vLLM's own hash factors of a config (every dataclass field, values
    normalised its way), less ``ignored``, each as a short string."""
    import dataclasses

    try:
        from vllm.config.utils import normalize_value
    except ImportError:  # older vLLM: its values as they are
        normalize_value = _plain
    out = {}
    for f in dataclasses.fields(config):
        if f.name in ignored or f.name.startswith("_"):
            continue
        try:
            value = normalize_value(getattr(config, f.name, None))
        except TypeError:  # a callable, an object vLLM cannot normalise
            # Without its address, which differs between processes.
            value = re.sub(r" at 0x[0-9a-f]+", "", repr(getattr(config, f.name, None)))
        out[f.name] = _compact(value)
    return out


def _plain(value: Any) -> Any:
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def _parallel_fields(parallel: Any) -> dict[str, str]:
    factors = _factors(parallel, frozenset())
    out = {f"parallel.{k}": v for k, v in factors.items() if "expert" in k or "eplb" in k}
    if getattr(parallel, "enable_expert_parallel", False):
        # Experts are sharded over tp x dp: the data-parallel rank picks them.
        out["parallel.data_parallel_size"] = str(parallel.data_parallel_size)
        out["parallel.data_parallel_rank"] = str(parallel.data_parallel_rank)
    return out


def _quant_config_hash(model_config: Any) -> str:
    checkpoint = getattr(model_config.hf_config, "quantization_config", None)
    runtime = getattr(model_config, "quantization_config", None)
    try:  # vLLM's weight-cache key piece, where this release has it
        from vllm.model_executor.model_loader.weight_cache.protocol import _hash_quant_config

        return _hash_quant_config(checkpoint, runtime)
    except ImportError:
        pass
    if hasattr(checkpoint, "to_dict"):
        checkpoint = checkpoint.to_dict()
    payload = json.dumps({"checkpoint": checkpoint, "runtime": _plain(runtime)}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


def _config_hash(model_config: Any) -> str:
    """config.json as written (a local checkpoint), so that two transformers
    releases rendering it differently agree; hf_overrides on top."""
    doc: Any = None
    path = os.path.join(model_config.model, "config.json")
    if os.path.isfile(path):
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    else:  # a hub id or a single file: vLLM's rendering, less its stamps
        hf = model_config.hf_config
        doc = hf.to_dict() if hasattr(hf, "to_dict") else dict(vars(hf))
        for stamp in ("transformers_version", "_name_or_path"):
            doc.pop(stamp, None)
    overrides = getattr(model_config, "hf_overrides", None) or None
    if callable(overrides):
        # vLLM's own transforms (a speculative draft's) follow from the
        # config and the vLLM release, both in the key; another callable is
        # named (its effect cannot be hashed).
        parts = [getattr(overrides, "func", overrides), *getattr(overrides, "args", ())]  # a partial
        named = [
            f"{f.__module__}.{getattr(f, '__qualname__', f)}"
            for f in parts
            if callable(f) and not str(getattr(f, "__module__", "")).startswith("vllm.")
        ]
        overrides = named or None
    payload = json.dumps({"config": doc, "hf_overrides": overrides}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]


def _layout_env() -> str:
    try:
        from vllm import envs

        known = set(envs.environment_variables)
    except (ImportError, AttributeError):
        known = {k for k in os.environ if k.startswith("VLLM_")}
    chosen = {
        k: os.environ[k] for k in sorted(known) if k in os.environ and any(w in k for w in LAYOUT_ENV_WORDS)
    }
    if not chosen:
        return "none"
    return hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()[:16]


def checkpoint_fingerprint(model: str, revision: str | None = None) -> str:
    """What the checkpoint ``model`` (a directory, a file or a hub id) holds,
    the same however its path is spelled (:meth:`Checkpoint.fingerprint`)."""
    from wcached.loaders.checkpoint import Checkpoint

    if os.path.exists(model):
        return Checkpoint(model).fingerprint(OTHER_WEIGHT_PATTERNS)
    return "hub:" + _hub_revision(model, revision)


def _hub_revision(repo: str, revision: str | None) -> str:
    """``<id>@<commit>`` where the hub cache holds a snapshot of it (the same
    commit on both sides matches, another one does not), else the revision
    as asked for."""
    try:
        from huggingface_hub import snapshot_download

        snapshot = snapshot_download(repo, revision=revision, local_files_only=True)
        return f"{repo}@{os.path.basename(snapshot)}"
    except Exception:  # not cached here, or no huggingface_hub
        return f"{repo}@{revision or 'main'}"
