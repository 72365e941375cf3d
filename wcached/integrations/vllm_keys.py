"""The cache key fields both sides derive from a vLLM configuration.

The loader worker (daemon side) and the engine plugin compute these from their
own configs with the same code, so any difference in what changes weights
(vLLM version, architecture, dtype, quantization, the model's config, the
parallel layout, the checkpoint) shows up as named mismatched fields.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from wcached.errors import WcacheError

# vLLM's mark on a layer its quant method processed while loading (online
# quantization processes each layer as soon as it is loaded); the loader
# worker lists such layers and the engine marks them done.
PROCESSED_GUARD = "_already_called_process_weights_after_loading"


def checkpoint_fingerprint_or_empty(path: str) -> str:
    from wcached.loaders.safetensors import checkpoint_fingerprint

    if not os.path.exists(path):
        return ""  # a hub id: vLLM resolves it; the config hash still guards
    try:
        return checkpoint_fingerprint(path)
    except WcacheError:
        return ""


def config_hash(hf_config: Any) -> str:
    try:
        doc = hf_config.to_dict()
    except AttributeError:
        doc = dict(vars(hf_config))
    raw = json.dumps(doc, sort_keys=True, default=str).encode()
    return hashlib.sha256(raw).hexdigest()[:16]


def vllm_key_fields(model_config: Any, tp_size: int, tp_rank: int, pp_size: int, pp_rank: int) -> dict:
    """Expected cache key fields for ``attach(expect=...)``."""
    import vllm

    hf = model_config.hf_config
    arch = (getattr(hf, "architectures", None) or ["unknown"])[0]
    return {
        "loader": "vllm",
        "fingerprint": checkpoint_fingerprint_or_empty(model_config.model),
        "dtype": str(model_config.dtype).removeprefix("torch."),
        "tp_size": tp_size,
        "tp_rank": tp_rank,
        "pp_size": pp_size,
        "pp_rank": pp_rank,
        "extra.vllm_version": vllm.__version__,
        "extra.architecture": arch,
        "extra.quantization": str(model_config.quantization or "none"),
        "extra.config_hash": config_hash(hf),
    }
