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
    """Entry point of ``vllm.general_plugins``; safe to call repeatedly."""
    from vllm.model_executor.model_loader import register_model_loader

    register_model_loader(LOAD_FORMAT)(_loader_class())


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
    from wcached.errors import DaemonUnavailable, KeyMismatch, WcacheError

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
            try:
                att = self._attach(model_config)
            except (DaemonUnavailable, KeyMismatch) as e:
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
                "wcached: bound %d tensors of %s from %s in %.3f s",
                len(att.manifest.tensors),
                att.manifest.model,
                att.connection.welcome.instance,
                time.perf_counter() - started,
            )
            return model

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
            from vllm.model_executor.utils import weights_already_processed

            device = torch.device(self.load_config.device or vllm_config.device_config.device)
            with set_default_torch_dtype(model_config.dtype):
                with torch.device("meta"):
                    model = initialize_model(
                        vllm_config=vllm_config, model_config=model_config, prefix=prefix
                    )
                _register_all(model, att)
                for key, value in att.manifest.attrs.items():
                    if key.startswith("vllm.attr."):
                        setattr(model, key[len("vllm.attr.") :], value == "1")
                if att.manifest.attrs.get("vllm.processed") == "1":
                    with weights_already_processed():
                        process_weights_after_loading(model, model_config, device)
                else:
                    process_weights_after_loading(model, model_config, device)
                _materialize_meta(model, device)
            return model.eval()

    def _register_all(model: nn.Module, att: Any) -> None:
        modules = dict(model.named_modules(remove_duplicate=False))
        registered: dict[str, torch.Tensor] = {}
        entries = att.manifest.tensors

        def put(name: str, obj: torch.Tensor, is_param: bool) -> None:
            module_name, _, leaf = name.rpartition(".")
            module = modules.get(module_name)
            if module is None:
                raise WcacheError(f"attached tensor {name} has no module {module_name!r} in the model")
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

    def _materialize_meta(model: nn.Module, device: torch.device) -> None:
        for module_name, module in model.named_modules():
            for leaf, p in list(module._parameters.items()):
                if p is not None and p.device.type == "meta":
                    log.warning("wcached: %s.%s is not in the cache; left uninitialised", module_name, leaf)
                    module._parameters[leaf] = nn.Parameter(
                        torch.empty_like(p, device=device), requires_grad=False
                    )
            for leaf, b in list(module._buffers.items()):
                if b is not None and b.device.type == "meta":
                    module._buffers[leaf] = torch.empty_like(b, device=device)

    return WcacheModelLoader


def _current_device() -> str:
    from vllm.platforms import current_platform

    return current_platform.device_type


def _as_bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise ValueError(f"model_loader_extra_config key {key!r} must be a boolean, got {value!r}")
