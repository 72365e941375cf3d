"""vLLM's own loader for ``--load-format wcache``, once per case, in one process.

Run with a vLLM interpreter by the tests:
    python vllm_loader_cases.py MODEL_DIR CASES_JSON
Each case is ``{"name", "extra": model_loader_extra_config, "engine": EngineArgs
overrides, "write": bool}``. For each, this builds the engine's config, gets the
loader vLLM would (``get_model_loader``) and calls ``load_model`` exactly as an
engine worker does; it prints ``CASE {json}`` with the outcome (``cache``,
``disk`` or ``error``), the error's type and message, the plugin's log lines,
and with ``write`` what writing the weights (the model's ``load_weights``)
raised. One process for all cases: an engine start per case would take
minutes.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _reload_in_place(model, vllm_config) -> str:
    """What vLLM's reload_weights does with weights given (a trainer's
    update): set the layers up for loading, then the model's load_weights;
    the model must still be whole afterwards, whatever was raised."""
    import torch
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    name, param = next(iter(model.named_parameters()))
    try:
        initialize_layerwise_reload(model)
        model.load_weights(iter([(name, torch.zeros_like(param))]))
        finalize_layerwise_reload(model, vllm_config.model_config)
        outcome = "ok"
    except Exception as e:
        outcome = f"{type(e).__name__}: {e}"
    on_meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    return outcome + (f" (left on meta: {on_meta[:3]})" if on_meta else "")


def main() -> None:
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm_single_rank import become_cpu_worker, join_single_rank_world

    model_dir, cases = sys.argv[1], json.loads(sys.argv[2])
    lines = Lines()
    plugin_log = logging.getLogger("vllm.plugins.wcached")
    started = False
    for case in cases:
        args = dict(
            model=model_dir,
            dtype="bfloat16",
            skip_tokenizer_init=True,
            max_model_len=256,
            enforce_eager=True,
            load_format="wcache",
            model_loader_extra_config=case.get("extra", {}),
        )
        args.update(case.get("engine", {}))
        vllm_config = EngineArgs(**args).create_engine_config()
        # vLLM re-runs dictConfig, which empties its child loggers' handlers.
        if lines not in plugin_log.handlers:
            plugin_log.addHandler(lines)
        lines.lines.clear()
        out: dict = {"name": case["name"]}
        with set_current_vllm_config(vllm_config):
            if not started:
                join_single_rank_world()
                become_cpu_worker()
                started = True
            try:
                loader = get_model_loader(vllm_config.load_config)
                model = loader.load_model(vllm_config=vllm_config, model_config=vllm_config.model_config)
                out["outcome"] = "cache" if any("wcached: bound" in x for x in lines.lines) else "disk"
                out["zero_copy"] = hasattr(model, "_wcached_attachment")
                if case.get("write"):
                    out["write"] = _reload_in_place(model, vllm_config)
                att = getattr(model, "_wcached_attachment", None)
                if att is not None:
                    att.close()
            except Exception as e:
                out["outcome"] = "error"
                out["error"] = f"{type(e).__name__}: {e}"
                out["traceback"] = traceback.format_exc()[-3000:]
        out["log"] = list(lines.lines)
        print("CASE " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
