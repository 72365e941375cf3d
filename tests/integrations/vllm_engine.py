"""Run a real vLLM engine once and print what it generated, as JSON.

Used by the tests and benchmarks with the vLLM interpreter:
    python vllm_engine.py MODEL_DIR '{"load_format": "wcache", ...}'
Prompts are token ids (the test checkpoint has no tokenizer); decoding is greedy.
:func:`run_engine` runs it from the host side and reads what it printed.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

PROMPTS = [[1, 5, 9, 42], [1, 100, 200], [1, 7, 7, 7, 300, 12], [1, 1999, 3, 64]]


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    model, overrides = sys.argv[1], json.loads(sys.argv[2])
    # A worker method to call after the first generation ("reload_weights").
    rpc = overrides.pop("_rpc", None)
    kwargs = dict(
        model=model,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        gpu_memory_utilization=0.2,
        max_model_len=256,
        enforce_eager=True,
    )
    kwargs.update(overrides)
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    init_s = time.perf_counter() - t0
    first = SamplingParams(temperature=0, max_tokens=1, detokenize=False)
    llm.generate([TokensPrompt(prompt_token_ids=PROMPTS[0])], first, use_tqdm=False)
    first_token_s = time.perf_counter() - t0
    params = SamplingParams(temperature=0, max_tokens=12, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params, use_tqdm=False)
    result = {
        "tokens": [list(o.outputs[0].token_ids) for o in outs],
        "init_s": init_s,
        "first_token_s": first_token_s,
    }
    if rpc:
        try:
            llm.collective_rpc(rpc)
            result["rpc"] = "ok"
        except Exception as e:
            result["rpc"] = f"{type(e).__name__}: {e}"
        # The engine goes on serving either way.
        outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in PROMPTS], params, use_tqdm=False)
        result["tokens_after_rpc"] = [list(o.outputs[0].token_ids) for o in outs]
    print("RESULT " + json.dumps(result))


def run_engine(python: str, model: str, overrides: dict, env: dict[str, str], timeout: float = 600) -> dict:
    """One engine in a fresh process: its tokens, start-up times, KV cache
    size, load times (wcached's line and vLLM's own) and log."""
    r = subprocess.run(
        [python, __file__, str(model), json.dumps(overrides)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, **env),
    )
    log = r.stdout + r.stderr
    m = re.search(r"^RESULT (.*)$", r.stdout, re.M)
    out = json.loads(m.group(1)) if m else {}

    def number(pattern: str, group: int = 1) -> float | None:
        found = re.search(pattern, log)
        return float(found.group(group).replace(",", "")) if found else None

    out.update(
        rc=r.returncode,
        log=log,
        load_s=number(r"wcached: (?:bound .*?|loaded .*? from disk) in ([0-9.]+) s"),
        vllm_load_s=number(r"Model loading took ([0-9.]+) GiB(?: memory)? and ([0-9.]+) seconds", 2),
        kv_gib=number(r"Available KV cache memory: ([0-9.]+) GiB"),
        kv_tokens=number(r"GPU KV cache size: ([0-9,]+) tokens"),
    )
    return out


def vllm_daemon_config(
    python: str,
    work: Path,
    model_dir: Path,
    engine_args: dict | None = None,
    *,
    draft: Path | None = None,
    **model: object,
) -> Path:
    """A daemon config serving ``model_dir`` through the vLLM loader, its
    worker in ``python``; ``engine_args`` add to a short eager engine's.
    ``draft``: a speculative-decoding draft beside it, as model "draft"."""
    from tests.helpers import write_config

    table = {
        "name": "default",
        "path": str(model_dir),
        "loader": "vllm",
        "dtype": "bfloat16",
        "engine_args": {"max_model_len": 256, "enforce_eager": True, **(engine_args or {})},
        **model,
    }
    models = [table]
    if draft is not None:
        models.append({**table, "name": "draft", "path": str(draft), "role": "draft"})
    return write_config(
        work / "wcached.toml",
        models=models,
        daemon={"socket_dir": str(work / "run"), "worker_python": python},
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    main()
