"""Run a real vLLM engine once and print what it generated, as JSON.

Used by the tests and benchmarks with the vLLM interpreter:
    python vllm_engine.py MODEL_DIR '{"load_format": "wcache", ...}'
Prompts are token ids (the test checkpoint has no tokenizer); decoding is greedy.
:func:`run_engine` runs it from the host side and reads what it printed.

Each prompt is generated on its own. Sent together, how many of them the
engine's first step holds depends on when its core process reads them, and a
batch of another size can take another matrix kernel: on a random-weight model
whose logits lie close, that flips a greedy token between runs of one engine.

``"_weights": true`` also returns a digest of every parameter and buffer of the
engine's model (read in the engine's worker), so a test compares the bytes the
engine computes with, not only tokens that depend on them.
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


def weights_digest(model) -> dict[str, str]:
    """Runs in the engine's worker: a blake2b of each parameter's and buffer's
    bytes, by name."""
    import hashlib

    import torch

    named = list(model.named_parameters()) + list(model.named_buffers())
    out = {}
    for name, t in named:
        raw = t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy()
        out[name] = hashlib.blake2b(raw, digest_size=16).hexdigest()
    return out


def _generate(llm, params) -> list[list[int]]:
    from vllm.inputs import TokensPrompt

    return [
        list(llm.generate([TokensPrompt(prompt_token_ids=p)], params, use_tqdm=False)[0].outputs[0].token_ids)
        for p in PROMPTS
    ]


def _weights(llm) -> list[dict[str, str]]:
    # The function goes to the engine's processes by reference, as this file
    # under its own name (its folder is first on their path): as __main__'s,
    # pickling it again there fails.
    import vllm_engine

    return llm.apply_model(vllm_engine.weights_digest)  # one digest per worker (rank)


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    model, overrides = sys.argv[1], json.loads(sys.argv[2])
    # A worker method to call after the first generation ("reload_weights").
    rpc = overrides.pop("_rpc", None)
    weights = overrides.pop("_weights", False)
    if weights:
        # apply_model sends the digest function to the worker by pickle.
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
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
    result = {"tokens": _generate(llm, params), "init_s": init_s, "first_token_s": first_token_s}
    if weights:
        result["weights"] = _weights(llm)
    if rpc:
        try:
            llm.collective_rpc(rpc)
            result["rpc"] = "ok"
        except Exception as e:
            result["rpc"] = f"{type(e).__name__}: {e}"
        # The engine goes on serving either way.
        result["tokens_after_rpc"] = _generate(llm, params)
        if weights:
            result["weights_after_rpc"] = _weights(llm)
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


def weights_differ(a: list[dict[str, str]], b: list[dict[str, str]]) -> list[str]:
    """What differs between two engines' ``weights`` (per rank): the names
    whose bytes differ or that one engine lacks; empty when they are the same."""
    if len(a) != len(b):
        return [f"{len(a)} ranks against {len(b)}"]
    return [
        f"rank {rank}: {name}"
        for rank, (x, y) in enumerate(zip(a, b, strict=True))
        for name in sorted(x.keys() | y.keys())
        if x.get(name) != y.get(name)
    ]


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
