"""vLLM plugin: ``--load-format wcache`` binds weights attached from wcached.

Registered through the ``vllm.general_plugins`` entry point. Each engine
worker finds its daemon by its device (the GPU's UUID; ``cpu<local_rank>`` on
CPU), builds the model on the meta device, binds the attached tensors as its
parameters and buffers (ties re-established as the same objects), and keeps
the attachment open as its lease. If the daemon is absent or holds something
else, it loads from disk and logs why, or, with ``fallback`` off, fails
naming the mismatched fields.

Extra config (``--model-loader-extra-config``):

- ``socket_dir``: where the daemons' sockets are (default ``/run/wcache``);
- ``model``: the daemon's model name (default ``"default"``);
- ``instance``: override the instance this worker attaches to;
- ``fallback``: load from disk when the cache is unusable (default true);
- ``timeout_s``: connect and reply timeout (default 30).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

LOAD_FORMAT = "wcache"
_EXTRA_KEYS = {"socket_dir", "model", "instance", "fallback", "timeout_s"}

# Under the "vllm" logger: vLLM configures its handlers, so these lines show
# in engine logs with vLLM's own format and level.
log = logging.getLogger("vllm.plugins.wcached")


def register() -> None:
    """Entry point of ``vllm.general_plugins``; safe to call repeatedly.

    vLLM calls it in every process of every engine, including those that
    never use ``wcache``: a vLLM release this plugin cannot work with gets a
    warning here, never an exception.
    """
    try:
        from vllm.model_executor.model_loader import register_model_loader

        register_model_loader(LOAD_FORMAT)(_loader_class())
    except Exception as e:
        log.warning("wcached: --load-format %s is unavailable with this vLLM: %s", LOAD_FORMAT, e)


_CLASS: type | None = None


def _loader_class() -> type:
    global _CLASS
    if _CLASS is None:
        _CLASS = _make_loader_class()
    return _CLASS


def _make_loader_class() -> type:
    import torch
    from torch import nn
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.utils import initialize_model, process_weights_after_loading
    from vllm.utils.torch_utils import set_default_torch_dtype

    from wcached.client import attach
    from wcached.errors import WcacheError
    from wcached.integrations.vllm_keys import PROCESSED_GUARD

    class WcacheModelLoader(BaseModelLoader):
        def __init__(self, load_config: Any):
            super().__init__(load_config)
            extra = dict(load_config.model_loader_extra_config or {})
            unknown = sorted(set(extra) - _EXTRA_KEYS)
            if unknown:
                raise ValueError(
                    f"unknown model_loader_extra_config keys for load format {LOAD_FORMAT!r}: "
                    f"{unknown}; known: {sorted(_EXTRA_KEYS)}"
                )
            self.socket_dir = str(extra.get("socket_dir", "/run/wcache"))
            self.model_name = str(extra.get("model", "default"))
            self.instance = extra.get("instance")
            self.fallback = _as_bool(extra.get("fallback", True), "fallback")
            self.timeout_s = float(extra.get("timeout_s", 30.0))
            self.attachment = None

        # -- disk path ------------------------------------------------------

        def _disk_loader(self) -> Any:
            cfg = dataclasses.replace(self.load_config, load_format="auto", model_loader_extra_config={})
            return DefaultModelLoader(cfg)

        def download_model(self, model_config: Any) -> None:
            self._disk_loader().download_model(model_config)

        def load_weights(self, model: nn.Module, model_config: Any) -> None:
            """In-place reload: copy the attached tensors into the model's."""
            att = self._attach(model_config)
            own = dict(model.named_parameters()) | dict(model.named_buffers())
            with torch.no_grad():
                for name, t in att.tensors.items():
                    if name in own and own[name].shape == t.shape:
                        own[name].copy_(t)
            att.close()

        # -- cache path -----------------------------------------------------

        def load_model(self, vllm_config: Any, model_config: Any, prefix: str = "") -> nn.Module:
            started = time.perf_counter()
            early = _EARLY.pop(self._early_key(), None)
            if early is _DISK:
                # The KV cache was sized without external weights: stay on disk
                # even if the daemon has come up since.
                return self._from_disk(vllm_config, model_config, prefix, started)
            try:
                att = early or self._attach(model_config)
            except WcacheError as e:
                if not self.fallback:
                    raise
                log.warning("wcached: %s; loading %s from disk instead", e, model_config.model)
                return self._from_disk(vllm_config, model_config, prefix, started)
            try:
                model = self._bind(vllm_config, model_config, prefix, att)
            except Exception:
                att.close()
                if not self.fallback:
                    raise
                log.exception("wcached: binding the attached weights failed; loading from disk")
                return self._from_disk(vllm_config, model_config, prefix, started)
            # The attachment is the lease: it lives as long as the model.
            model._wcached_attachment = att
            self.attachment = att
            log.info(
                "wcached: bound %d tensors of %s (%s form) from %s in %.3f s",
                len(att.manifest.tensors),
                att.manifest.model,
                att.manifest.attrs.get("vllm.form", "loaded"),
                att.connection.welcome.instance,
                time.perf_counter() - started,
            )
            _advise_memory(self, vllm_config, att)
            return model

        # -- KV-cache sizing ------------------------------------------------

        def get_external_weight_memory(self, vllm_config: Any) -> int:
            """vLLM's hook (releases that have it): the bytes of weights this
            worker will map from the daemon, so that the KV cache is sized as
            if the engine had loaded them itself. Attaches now (the same
            attachment is bound by load_model); 0 when it will load from disk."""
            key = self._early_key()
            displaced = _EARLY.pop(key, None)
            if displaced not in (None, _DISK):
                displaced.close()
            try:
                att = self._attach(vllm_config.model_config)
            except WcacheError as e:
                if not self.fallback:
                    raise
                log.warning("wcached: %s; the weights will be loaded from disk", e)
                _EARLY[key] = _DISK
                return 0
            _EARLY[key] = att
            return mapped_weight_bytes(att.manifest)

        def _early_key(self) -> tuple:
            # One engine process is one worker (one rank of one model).
            return (self.socket_dir, self.model_name, self._instance())

        def _from_disk(self, vllm_config: Any, model_config: Any, prefix: str, started: float) -> Any:
            model = self._disk_loader().load_model(vllm_config, model_config, prefix=prefix)
            log.info(
                "wcached: loaded %s from disk in %.3f s", model_config.model, time.perf_counter() - started
            )
            return model

        def _instance(self) -> str:
            if self.instance:
                return str(self.instance)
            device = torch.device(self.load_config.device or _current_device())
            if device.type == "cuda":
                index = device.index if device.index is not None else torch.cuda.current_device()
                return "GPU-" + str(torch.cuda.get_device_properties(index).uuid)
            from vllm.distributed import get_world_group

            return f"cpu{get_world_group().local_rank}"

        def _attach(self, model_config: Any) -> Any:
            from vllm.distributed import (
                get_pp_group,
                get_tensor_model_parallel_rank,
                get_tensor_model_parallel_world_size,
            )

            from wcached.integrations.vllm_keys import vllm_key_fields

            pp = get_pp_group()
            expect = vllm_key_fields(
                model_config,
                get_tensor_model_parallel_world_size(),
                get_tensor_model_parallel_rank(),
                pp.world_size,
                pp.rank_in_group,
            )
            return attach(
                self.model_name,
                self._instance(),
                socket_dir=self.socket_dir,
                expect=expect,
                timeout=self.timeout_s,
                client=f"vllm {model_config.model}",
            )

        def _bind(self, vllm_config: Any, model_config: Any, prefix: str, att: Any) -> nn.Module:
            attrs = att.manifest.attrs
            # Manifests before "vllm.form" said "vllm.processed" = "1" or "0".
            form = attrs.get("vllm.form") or ("processed" if attrs.get("vllm.processed") == "1" else "loaded")
            device = torch.device(self.load_config.device or vllm_config.device_config.device)
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
                    model = initialize_model(
                        vllm_config=vllm_config, model_config=model_config, prefix=prefix
                    )
                _register_all(model, att, check_shapes=form == "loaded", skip=processed_modules)
                for key, value in attrs.items():
                    if key.startswith("vllm.attr."):
                        setattr(model, key[len("vllm.attr.") :], value == "1")
                if already_processed is not None:
                    with already_processed():
                        process_weights_after_loading(model, model_config, device)
                    # After the hooks, as vLLM's own cache loader checks: the
                    # fill's processing may have dropped placeholders.
                    _left_on_meta(model)
                else:
                    _left_on_meta(model)
                    # Layers vLLM processed while the daemon loaded them
                    # (online quantization): marked done, never processed twice.
                    modules = dict(model.named_modules())
                    for name in processed_modules:
                        if name not in modules:
                            raise WcacheError(f"processed layer {name!r} is not in this model")
                        setattr(modules[name], PROCESSED_GUARD, True)
                        _set_up_kernels(modules[name])
                    process_weights_after_loading(model, model_config, device)
            return model.eval()

    def _register_all(model: nn.Module, att: Any, check_shapes: bool, skip: set[str]) -> None:
        modules = dict(model.named_modules(remove_duplicate=False))
        registered: dict[str, torch.Tensor] = {}
        entries = att.manifest.tensors

        def put(name: str, obj: torch.Tensor, is_param: bool) -> None:
            module_name, _, leaf = name.rpartition(".")
            module = modules.get(module_name)
            if module is None:
                raise WcacheError(f"attached tensor {name} has no module {module_name!r} in the model")
            placeholder = module._parameters.get(leaf)
            if placeholder is None:
                placeholder = module._buffers.get(leaf)
            if check_shapes and placeholder is not None and module_name not in skip:
                if placeholder.shape != obj.shape or placeholder.dtype != obj.dtype:
                    raise WcacheError(
                        f"attached tensor {name} is {obj.dtype} {tuple(obj.shape)}, the model's is "
                        f"{placeholder.dtype} {tuple(placeholder.shape)}"
                    )
            module._parameters.pop(leaf, None)
            module._buffers.pop(leaf, None)
            if is_param:
                module.register_parameter(leaf, obj)
            else:
                module.register_buffer(leaf, obj)
            registered[name] = obj

        for e in entries:
            if e.alias_of is None:
                t = att.tensors[e.name]
                if e.kind == "param":
                    # Zero copy: the engine computes from the daemon's read-only pages.
                    put(e.name, nn.Parameter(t, requires_grad=False), True)
                else:
                    # Buffers (KV-cache scales, rotary caches) are small, and
                    # post-processing updates some of them in place: the
                    # engine gets its own copy.
                    put(e.name, t.clone(), False)
        for e in entries:
            if e.alias_of is not None:
                # The same object: a tie stays a tie.
                obj = registered[e.alias_of]
                put(e.name, obj, isinstance(obj, nn.Parameter))

    def _set_up_kernels(layer: nn.Module) -> None:
        """A layer processed while the daemon loaded it skips its quant
        method's processing here (the guard), and with it the set-up of the
        method's GEMM kernel objects, which hold state of their own (the
        logical output width, say). Their processing only re-lays out weights
        that are not yet in kernel format (padding to 16): over the processed
        weights it sets that state and changes nothing."""
        method = getattr(layer, "quant_method", None)
        for kernel in vars(method).values() if method is not None else ():
            hook = getattr(kernel, "process_weights_after_loading", None)
            if hook is not None and not isinstance(kernel, nn.Module):
                hook(layer)

    def _left_on_meta(model: nn.Module) -> None:
        """Every parameter and buffer must have come from the cache: one left
        on the meta device would be uninitialised memory, never served."""
        missing = [
            f"{module_name}.{leaf}" if module_name else leaf
            for module_name, module in model.named_modules()
            for leaf, t in [*module._parameters.items(), *module._buffers.items()]
            if t is not None and t.device.type == "meta"
        ]
        if missing:
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            raise WcacheError(f"the cache lacks {', '.join(missing[:5])}{more}")

    return WcacheModelLoader


# Attachments made by get_external_weight_memory, taken by load_model (vLLM
# builds a new loader object for each call).
_EARLY: dict[tuple, Any] = {}
# In _EARLY: the hook found the cache unusable and reported 0 bytes.
_DISK = object()


def mapped_weight_bytes(manifest: Any) -> int:
    """Device bytes an engine maps from the daemon and does not copy: the
    parameters (buffers are copied into the engine's own memory)."""
    return sum(t.nbytes for t in manifest.tensors if t.alias_of is None and t.kind == "param")


def _advise_memory(loader: Any, vllm_config: Any, att: Any) -> None:
    """On a GPU, with a vLLM that has no hook for external weight memory, the
    KV cache is sized as if the mapped weights were free memory: say which
    gpu_memory_utilization gives the KV cache a disk engine would get."""
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    if hasattr(BaseModelLoader, "get_external_weight_memory"):
        return
    segments = att.manifest.segments
    if not segments or segments[0].backend != "cuda":
        return
    import torch

    total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
    mapped = sum(s.nbytes for s in segments)
    util = vllm_config.cache_config.gpu_memory_utilization
    log.warning(
        "wcached: this vLLM does not count the %.2f GiB of weights mapped from wcached "
        "(%.1f%% of this GPU) against gpu_memory_utilization=%.3g; for the KV cache an engine "
        "loading from disk gets, set gpu_memory_utilization=%.3f",
        mapped / 2**30,
        100 * mapped / total,
        util,
        util - mapped / total,
    )


def _current_device() -> str:
    from vllm.platforms import current_platform

    return current_platform.device_type


def _as_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise ValueError(f"model_loader_extra_config key {key!r} must be a boolean, got {value!r}")
