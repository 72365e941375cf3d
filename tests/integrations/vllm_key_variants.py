"""The cache key a vLLM worker computes, for variants of one configuration.

Run with a vLLM interpreter by the tests:
    python vllm_key_variants.py VARIANTS_JSON
Each variant is ``{"name", "model": path, "engine": EngineArgs overrides,
"env": {...}, "role": "target"|"draft"}``; for each this prints
``KEY {"name", "key": CacheKey as builtins}`` or ``KEY {"name", "error"}``,
computed by the same function the loader worker and the engine plugin call.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    import msgspec
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm_single_rank import join_single_rank_world

    from wcached.loaders.base import get_loader

    started = False
    for variant in json.loads(sys.argv[1]):
        saved = dict(os.environ)
        os.environ.update(variant.get("env", {}))
        out: dict = {"name": variant["name"]}
        try:
            args = dict(model=variant["model"], dtype="bfloat16", skip_tokenizer_init=True, max_model_len=256)
            args.update(variant.get("engine", {}))
            vllm_config = EngineArgs(**args).create_engine_config()
            with set_current_vllm_config(vllm_config):
                if not started:
                    join_single_rank_world()
                    started = True
                key = get_loader("vllm").key(
                    "default", vllm_config, vllm_config.model_config, variant.get("role", "target")
                )
            out["key"] = msgspec.to_builtins(key)
        except Exception as e:
            out["error"] = f"{type(e).__name__}: {e}"
        finally:
            os.environ.clear()
            os.environ.update(saved)
        print("KEY " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
