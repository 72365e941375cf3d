"""Run a real vLLM engine once and print what it generated, as JSON.

Used by the tests and bench/vllm_load.py with the vLLM interpreter:
    python vllm_engine.py MODEL_DIR '{"load_format": "wcache", ...}'
Prompts are token ids (the test checkpoint has no tokenizer); decoding is greedy.
"""

from __future__ import annotations

import json
import sys
import time

PROMPTS = [[1, 5, 9, 42], [1, 100, 200], [1, 7, 7, 7, 300, 12], [1, 1999, 3, 64]]


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    model, overrides = sys.argv[1], json.loads(sys.argv[2])
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
    print(
        "RESULT "
        + json.dumps(
            {
                "tokens": [list(o.outputs[0].token_ids) for o in outs],
                "init_s": init_s,
                "first_token_s": first_token_s,
            }
        )
    )


if __name__ == "__main__":
    main()
