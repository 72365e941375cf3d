"""The work behind ``--load-format wcache``: attach, check, bind, or fall back.

Imported only when an engine loads with ``wcache`` (it reaches into vLLM
internals: ``initialize_model``, ``process_weights_after_loading``,
``set_default_torch_dtype``); see :mod:`wcached.integrations.vllm` for what
the plugin promises.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import torch
from torch import nn
from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
from vllm.utils.torch_utils import set_default_torch_dtype

from wcached.client import attach
from wcached.errors import ReadOnlyWeights, WcacheError
from wcached.integrations.vllm import READ_ONLY, PluginOptions, disk_loader, log
from wcached.loaders.base import get_loader
from wcached.loaders.vllm.key import PROCESSED_GUARD, expected_fields, role_of
from wcached.protocol.runs import runs_of

# Attachments made by get_external_weight_memory, taken by load_model (vLLM
# builds a new loader object for each call).
_EARLY: dict[tuple, Any] = {}
# In _EARLY: the hook found the cache unusable and reported 0 bytes.
_DISK = object()


class WcacheLoading:
    def __init__(self, load_config: Any, options: PluginOptions):
        self.load_config = load_config
        self.options = options

    # -- the cache path ------------------------------------------------------

    def load_model(self, vllm_config: Any, model_config: Any, prefix: str = "") -> nn.Module:
        started = time.perf_counter()
        device = self._device(vllm_config)
        freeze_collected_heap(device)
        role = "draft" if prefix.startswith("draft") else role_of(vllm_config, model_config)
        name = self.options.draft_model if role == "draft" else self.options.model
        if not name:
            log.info(
                "wcached: the draft model %s loads from disk (draft_model names the daemon's copy of it)",
                model_config.model,
            )
            return self._from_disk(vllm_config, model_config, prefix, started)
        att = None
        registered = _LayerRegistry(vllm_config)
        try:
            early = _EARLY.pop(self._early_key(name), None)
            if early is not _DISK:
                att = early if early is not None else self._attach(vllm_config, model_config, name, role)
                model = self._bind(vllm_config, model_config, prefix, att)
        except Exception as e:
            if att is not None:
                att.close()
            if not self.options.fallback:
                raise
            # The model built for binding registered its attention layers
            # by name: the disk load registers them again.
            registered.forget_new()
            _log_fallback(e, f"loading {model_config.model} from disk instead")
            early = _DISK
        if early is _DISK:
            # Given up on here, or when the KV cache was sized without
            # external weights (then even if the daemon has come up since).
            return self._from_disk(vllm_config, model_config, prefix, started)
        if self.options.copy:
            # The engine holds its own copy: no lease, nothing mapped.
            att.close()
        else:
            # The attachment is the lease: it lives as long as the model.
            model._wcached_attachment = att
            _guard_writes(model)
        log.info(
            "wcached: bound %d tensors of %s (%s form%s) from %s in %.3f s",
            len(att.manifest.tensors),
            att.manifest.model,
            att.manifest.attrs.get("vllm.form", "loaded"),
            ", copied" if self.options.copy else "",
            att.connection.welcome.instance,
            time.perf_counter() - started,
        )
        if not self.options.copy and early is None:
            # Nobody asked get_external_weight_memory before the KV cache
            # budget was taken (vLLM's hook, or wcached's worker class).
            try:
                _advise_memory(vllm_config, att)
            except Exception as e:  # advice only: never worth an engine
                log.debug("wcached: no memory advice: %s", e)
        return model

    # -- KV-cache sizing -----------------------------------------------------

    def get_external_weight_memory(self, vllm_config: Any) -> int:
        """vLLM's hook (releases that have it): the bytes of weights this
        worker will map from the daemon, so that the KV cache is sized as if
        the engine had loaded them itself. Attaches now (the same attachment
        is bound by load_model); 0 when it will load from disk or copy."""
        if self.options.copy:
            return 0  # the copies are the engine's own allocations
        try:
            key = self._early_key(self.options.model)
        except Exception as e:
            if not self.options.fallback:
                raise
            _log_fallback(e, "the weights will be loaded from disk")
            return 0
        displaced = _EARLY.pop(key, None)
        if displaced not in (None, _DISK):
            displaced.close()
        try:
            model_config = vllm_config.model_config
            att = self._attach(vllm_config, model_config, self.options.model, "target")
        except Exception as e:
            if not self.options.fallback:
                raise
            _log_fallback(e, "the weights will be loaded from disk")
            _EARLY[key] = _DISK
            return 0
        _EARLY[key] = att
        return mapped_weight_bytes(att.manifest)

    # -- writing paths -------------------------------------------------------

    def load_weights(self, model: nn.Module, model_config: Any) -> None:
        """vLLM's in-place load into an existing model (copy mode; the thin
        loader refused it otherwise): the attached tensors copied into the
        model's own, each of the same name, shape and dtype."""
        from vllm.config import get_current_vllm_config

        vllm_config = get_current_vllm_config()
        role = role_of(vllm_config, model_config)
        name = self.options.draft_model if role == "draft" else self.options.model
        att = self._attach(vllm_config, model_config, name, role)
        try:
            own = dict(model.named_parameters()) | dict(model.named_buffers())
            for tname in att.tensors:
                if tname not in own:
                    raise WcacheError(f"attached tensor {tname} is no parameter or buffer of the model")
                _check_like(tname, att.tensors[tname], own[tname], strides=False)
            with torch.no_grad():
                for tname, t in att.tensors.items():
                    own[tname].copy_(t)
        finally:
            att.close()

    # -- helpers -------------------------------------------------------------

    def _early_key(self, name: str) -> tuple:
        # One engine process is one worker (one rank of one model).
        return (self.options.socket_dir, name, self._instance())

    def _from_disk(self, vllm_config: Any, model_config: Any, prefix: str, started: float) -> Any:
        model = disk_loader(self.load_config).load_model(
            vllm_config=vllm_config, model_config=model_config, prefix=prefix
        )
        log.info("wcached: loaded %s from disk in %.3f s", model_config.model, time.perf_counter() - started)
        return model

    def _device(self, vllm_config: Any) -> torch.device:
        return torch.device(self.load_config.device or vllm_config.device_config.device)

    def _instance(self) -> str:
        if self.options.instance:
            return str(self.options.instance)
        device = torch.device(self.load_config.device or _current_device())
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            return "GPU-" + str(torch.cuda.get_device_properties(index).uuid)
        from vllm.distributed import get_world_group

        return f"cpu{get_world_group().local_rank}"

    def _attach(self, vllm_config: Any, model_config: Any, name: str, role: str) -> Any:
        # The same function the daemon's fill called for the key it holds.
        key = get_loader("vllm").key(name, vllm_config, model_config, role)
        return attach(
            name,
            self._instance(),
            socket_dir=self.options.socket_dir,
            expect=expected_fields(key),
            timeout=self.options.timeout_s,
            client=f"vllm {model_config.model}",
            keep_lease=not self.options.copy,
        )

    def _bind(self, vllm_config: Any, model_config: Any, prefix: str, att: Any) -> nn.Module:
        attrs = att.manifest.attrs
        # Manifests before "vllm.form" said "vllm.processed" = "1" or "0".
        form = attrs.get("vllm.form") or ("processed" if attrs.get("vllm.processed") == "1" else "loaded")
        device = self._device(vllm_config)
        already_processed = None
        if form == "processed":
            try:
                from vllm.model_executor.utils import weights_already_processed as already_processed
            except ImportError:
                raise WcacheError(
                    "the daemon holds post-processed weights and this vLLM has no "
                    "already-processed mode to bind them with"
                ) from None
        elif form != "loaded":
            raise WcacheError(f"the daemon holds weights in a form this plugin does not know: {form!r}")
        processed_modules = {n for n in attrs.get("vllm.processed_modules", "").split(",") if n}
        with set_default_torch_dtype(model_config.dtype):
            with torch.device("meta"):
                model = initialize_model(vllm_config=vllm_config, model_config=model_config, prefix=prefix)
            register_all(model, att, strict=form == "loaded", skip=processed_modules, copy=self.options.copy)
            for key, value in attrs.items():
                if key.startswith("vllm.attr."):
                    setattr(model, key[len("vllm.attr.") :], value == "1")
            if already_processed is not None:
                with already_processed():
                    process_weights_after_loading(model, model_config, device)
                # After the hooks, as vLLM's own cache loader checks: the
                # fill's processing may have dropped placeholders.
                left_on_meta(model)
            else:
                left_on_meta(model)
                # Layers vLLM processed while the daemon loaded them (online
                # quantization): marked done, never processed twice.
                modules = dict(model.named_modules())
                for name in processed_modules:
                    if name not in modules:
                        raise WcacheError(f"processed layer {name!r} is not in this model")
                    setattr(modules[name], PROCESSED_GUARD, True)
                    _set_up_kernels(modules[name])
                process_weights_after_loading(model, model_config, device)
        if self.options.copy:
            _reload_on(model, device)
        return model.eval()


def freeze_collected_heap(device: torch.device) -> None:
    """Mark the engine's start-up heap as static (``gc.freeze``) as the load
    begins, on a GPU.

    vLLM's GPU model runners (0.26, 0.27, 0.32, both runners) time the load
    inside a memory profiler that runs a full garbage collection on entry
    and two on exit: with vLLM imported that is ~650k objects, 0.36 s a
    collection on the H200 host, so 1.09 of the 1.31 s "Model loading took"
    for a 32-layer Llama (bench/results/vllm-load-profile-gpu-20261202).
    The loader is called right after the entry's collection, so the heap
    frozen here holds no garbage; the exit's collections then scan only
    what the load made. vLLM freezes the same heap itself once the worker is
    warmed up (``freeze_gc_heap``) and unfreezes it at shutdown; this only
    brings the freeze forward. vLLM's CPU runner collects nothing around
    the load, so there the heap is left as it is (a freeze could keep
    cyclic garbage until shutdown)."""
    if device.type == "cuda":
        gc.freeze()


class _LayerRegistry:
    """The layers a model registered in vLLM's forward context while it was
    built, so that a model given up can take them back out."""

    def __init__(self, vllm_config: Any):
        self.config = getattr(vllm_config, "compilation_config", None)
        self.names = set(getattr(self.config, "static_forward_context", {}))
        self.moe = list(getattr(self.config, "static_all_moe_layers", []) or [])

    def forget_new(self) -> None:
        context = getattr(self.config, "static_forward_context", None)
        if context is not None:
            for name in set(context) - self.names:
                del context[name]
        moe = getattr(self.config, "static_all_moe_layers", None)
        if isinstance(moe, list):
            moe[:] = self.moe


def register_all(model: nn.Module, att: Any, strict: bool, skip: set[str], copy: bool = False) -> None:
    """Every attached tensor in place of the parameter or buffer it replaces.

    ``strict`` (the loaded form, which the meta model's placeholders
    describe exactly): each tensor must replace a placeholder of the same
    shape, dtype and strides, outside the layers in ``skip`` (processed while
    loading, their placeholders are the unprocessed ones). Nothing here is
    left unchecked for lack of a placeholder: a tensor the model does not
    have is an error, not a new parameter."""
    modules = dict(model.named_modules(remove_duplicate=False))
    registered: dict[str, torch.Tensor] = {}
    # By run: a manifest that came as runs makes no entry per tensor here.
    runs = runs_of(att.manifest)

    def put(name: str, obj: torch.Tensor, is_param: bool) -> None:
        module_name, _, leaf = name.rpartition(".")
        module = modules.get(module_name)
        if module is None:
            raise WcacheError(f"attached tensor {name} has no module {module_name!r} in the model")
        placeholder = module._parameters.get(leaf)
        if placeholder is None:
            placeholder = module._buffers.get(leaf)
        if strict and module_name not in skip:
            if placeholder is None:
                raise WcacheError(f"attached tensor {name} is no parameter or buffer of the model")
            _check_like(name, obj, placeholder)
        module._parameters.pop(leaf, None)
        module._buffers.pop(leaf, None)
        if is_param:
            module.register_parameter(leaf, obj)
        else:
            module.register_buffer(leaf, obj)
        registered[name] = obj

    for run in runs:
        if run.alias_of is None:
            for name in run.names:
                t = att.tensors[name]
                if run.kind == "param":
                    # Zero copy: the engine computes from the daemon's read-only
                    # pages; copy mode: from its own memory.
                    put(name, nn.Parameter(t.clone() if copy else t, requires_grad=False), True)
                else:
                    # Buffers (KV-cache scales, rotary caches) are small, and
                    # post-processing updates some of them in place: the engine
                    # gets its own copy.
                    put(name, t.clone(), False)
    for run in runs:
        if run.alias_of is not None:
            for name in run.names:
                if run.alias_of not in registered:
                    raise WcacheError(f"attached tensor {name} ties to {run.alias_of}, which the cache lacks")
                # The same object: a tie stays a tie.
                obj = registered[run.alias_of]
                put(name, obj, isinstance(obj, nn.Parameter))


def _check_like(name: str, obj: torch.Tensor, placeholder: torch.Tensor, strides: bool = True) -> None:
    if placeholder.shape != obj.shape or placeholder.dtype != obj.dtype:
        raise WcacheError(
            f"attached tensor {name} is {str(obj.dtype).removeprefix('torch.')} {tuple(obj.shape)}, "
            f"the model's is {str(placeholder.dtype).removeprefix('torch.')} {tuple(placeholder.shape)}"
        )
    if strides and obj.numel() > 1 and placeholder.stride() != obj.stride():
        raise WcacheError(
            f"attached tensor {name} has strides {obj.stride()}, the model's {placeholder.stride()}"
        )


def left_on_meta(model: nn.Module) -> None:
    """Every parameter and buffer must have come from the cache: one left on
    the meta device would be uninitialised memory, never served."""
    missing = [
        f"{module_name}.{leaf}" if module_name else leaf
        for module_name, module in model.named_modules()
        for leaf, t in [*module._parameters.items(), *module._buffers.items()]
        if t is not None and t.device.type == "meta"
    ]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise WcacheError(f"the cache lacks {', '.join(missing[:5])}{more}")


def _set_up_kernels(layer: nn.Module) -> None:
    """A layer processed while the daemon loaded it skips its quant method's
    processing here (the guard), and with it the set-up of the method's GEMM
    kernel objects, which hold state of their own (the logical output width,
    say). Their processing only re-lays out weights that are not yet in
    kernel format (padding to 16): over the processed weights it sets that
    state and changes nothing."""
    method = getattr(layer, "quant_method", None)
    for kernel in vars(method).values() if method is not None else ():
        hook = getattr(kernel, "process_weights_after_loading", None)
        if hook is not None and not isinstance(kernel, nn.Module):
            hook(layer)


def _guard_writes(model: nn.Module) -> None:
    """Zero-copy: vLLM's weight updates (``reload_weights`` with weights,
    trainer updates) call the model's ``load_weights``, which would write
    into read-only pages and fault the process; they get an error instead."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ReadOnlyWeights(READ_ONLY)

    model.load_weights = refuse  # type: ignore[method-assign]
    # vLLM's reload first moves every layer not yet set up for loading to
    # the meta device (initialize_layerwise_reload), then calls
    # load_weights: marked as set up, the layers stay where they are and the
    # refusal leaves an engine that goes on serving. (A reload in kernel
    # format, is_checkpoint_format=False, copies into parameters directly:
    # that one still faults.)
    try:
        from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info
    except ImportError:
        return
    for layer in model.modules():
        info = get_layerwise_info(layer)
        if getattr(info, "load_numel_total", 0) is None:
            info.load_numel_total = 0


def _reload_on(model: nn.Module, device: torch.device) -> None:
    """The model was built on the meta device, so vLLM's reload bookkeeping
    recorded meta as where to rebuild layers; a private copy lives on
    ``device``, where a reload must rebuild them."""
    try:
        from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info
    except ImportError:
        return
    for layer in model.modules():
        get_layerwise_info(layer).restore_device = device


def _log_fallback(e: BaseException, what: str) -> None:
    """One warning line with the reason (the traceback at debug level)."""
    log.warning("wcached: %s: %s; %s", type(e).__name__, e, what)
    log.debug("wcached: why the cache was not used", exc_info=e)


# The GPU worker that counts mapped weights on vLLM releases without the hook.
WORKER_CLS = "wcached.integrations.vllm_worker.Worker"


def mapped_weight_bytes(manifest: Any) -> int:
    """Device bytes an engine maps from the daemon and does not copy: the
    parameters (buffers are copied into the engine's own memory)."""
    return sum(r.nbytes * len(r.names) for r in runs_of(manifest) if r.alias_of is None and r.kind == "param")


def _advise_memory(vllm_config: Any, att: Any) -> None:
    """On a GPU, when the mapped weights were not counted (a vLLM without the
    external-weight hook, started without wcached's worker class), the KV
    cache is sized as if they were free memory: say how to count them."""
    segments = att.manifest.segments
    if not segments or segments[0].backend != "cuda":
        return
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    mapped = sum(s.nbytes for s in segments)
    util = vllm_config.cache_config.gpu_memory_utilization
    # The worker class counts the target model where vLLM has no hook; a
    # draft model's weights neither counts.
    worker = (
        f"start it with --worker-cls {WORKER_CLS}, or "
        if not hasattr(BaseModelLoader, "get_external_weight_memory")
        and vllm_config.parallel_config.worker_cls != WORKER_CLS
        else ""
    )
    log.warning(
        "wcached: this vLLM does not count the %.2f GiB of weights mapped from wcached "
        "(%.1f%% of this GPU) against gpu_memory_utilization=%.3g; for the KV cache an engine "
        "loading from disk gets, %sset gpu_memory_utilization=%.3f",
        mapped / 2**30,
        100 * mapped / total,
        util,
        worker,
        util - mapped / total,
    )


def _current_device() -> str:
    from vllm.platforms import current_platform

    return current_platform.device_type


def _current_vllm_config() -> Any:
    from vllm.config import get_current_vllm_config

    return get_current_vllm_config()
