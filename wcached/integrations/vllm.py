"""vLLM plugin: ``--load-format wcache`` binds weights attached from wcached.

Registered through the ``vllm.general_plugins`` entry point, which vLLM runs in
every process of every engine, including those that never use ``wcache``. So
:func:`register` imports only vLLM's public loader registry and cannot fail;
the work (:mod:`wcached.integrations.vllm_bind`, which reaches into vLLM
internals) is imported when an engine actually loads with ``wcache``, and a
vLLM it cannot work with then loads from disk with a warning.

Each engine worker finds its daemon by its device (the GPU's UUID; ``cpu<local
rank>`` on CPU), builds the model on the meta device, checks every attached
tensor against the parameter or buffer it replaces, binds them (ties
re-established as the same objects), and keeps the attachment open as its
lease. Whatever goes wrong on the daemon's side (no daemon, another key, a
protocol version it does not share, an unknown or released model, a refused
permission, a busy daemon, a timeout, a protocol error, a failed bind) loads
from disk with the reason logged once; with ``fallback`` off the typed error
is raised instead.

Extra config (``--model-loader-extra-config``):

- ``socket_dir``: where the daemons' sockets are (default ``/run/wcache``);
- ``model``: the daemon's model name (default ``"default"``);
- ``draft_model``: the daemon's name for the speculative-decoding draft
  (default: the draft loads from disk);
- ``instance``: override the instance this worker attaches to;
- ``fallback``: load from disk when the cache is unusable (default true);
- ``timeout_s``: connect and reply timeout (default 30);
- ``copy``: give the engine a private copy of the weights (default false):
  it then owns them, independent of the daemon, and may write them
  (``reload_weights``, weight updates); in the default zero-copy mode those
  raise a ``ReadOnlyWeights`` error naming this option.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import msgspec

from wcached import defaults

LOAD_FORMAT = "wcache"

# Under the "vllm" logger: vLLM configures its handlers, so these lines show
# in engine logs with vLLM's own format and level.
log = logging.getLogger("vllm.plugins.wcached")


class PluginOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    socket_dir: str = defaults.SOCKET_DIR
    model: str = "default"
    draft_model: str = ""
    instance: str | None = None
    fallback: bool = True
    timeout_s: float = 30.0
    copy: bool = False


def parse_options(extra: dict[str, Any] | None) -> PluginOptions:
    """``model_loader_extra_config`` -> options; a mistake is a ValueError
    naming the key (vLLM reports it at engine start)."""
    extra = dict(extra or {})
    known = sorted(PluginOptions.__struct_fields__)
    unknown = sorted(set(extra) - set(known))
    if unknown:
        raise ValueError(
            f"unknown model_loader_extra_config keys for load format {LOAD_FORMAT!r}: {unknown}; "
            f"known: {known}"
        )
    try:
        # Not strict: "true" from a command line is a boolean.
        return msgspec.convert(extra, PluginOptions, strict=False)
    except msgspec.ValidationError as e:
        raise ValueError(f"model_loader_extra_config for load format {LOAD_FORMAT!r}: {e}") from None


def register() -> None:
    """Entry point of ``vllm.general_plugins``; cheap, and never raises."""
    try:
        from vllm.model_executor.model_loader import register_model_loader
        from vllm.model_executor.model_loader.base_loader import BaseModelLoader

        register_model_loader(LOAD_FORMAT)(_loader_class(BaseModelLoader))
    except Exception as e:
        log.warning("wcached: --load-format %s is unavailable with this vLLM: %s", LOAD_FORMAT, e)


_CLASS: type | None = None


def _loader_class(base: type) -> type:
    global _CLASS
    if _CLASS is None:
        _CLASS = _make_loader_class(base)
    return _CLASS


READ_ONLY = (
    "the weights of this engine are read-only mappings of wcached's memory (zero-copy); "
    f"to let the engine write them, load with --load-format {LOAD_FORMAT} and "
    "--model-loader-extra-config '{\"copy\": true}' (the engine then holds its own copy)"
)


def _writable(options: PluginOptions) -> None:
    if not options.copy:
        from wcached.errors import ReadOnlyWeights

        raise ReadOnlyWeights(READ_ONLY)


def disk_loader(load_config: Any) -> Any:
    """vLLM's own loader for the checkpoint on disk."""
    from vllm.model_executor.model_loader import get_model_loader

    return get_model_loader(
        dataclasses.replace(load_config, load_format="auto", model_loader_extra_config={})
    )


def _make_loader_class(base: type) -> type:
    class WcacheModelLoader(base):  # type: ignore[misc, valid-type]
        """What vLLM instantiates; the work is in vllm_bind, imported on first use."""

        def __init__(self, load_config: Any):
            super().__init__(load_config)
            self.options = parse_options(load_config.model_loader_extra_config)
            self._impl: Any = None

        def _implementation(self) -> Any:
            if self._impl is None:
                from wcached.integrations.vllm_bind import WcacheLoading

                self._impl = WcacheLoading(self.load_config, self.options)
            return self._impl

        def _unusable(self, e: Exception, what: str) -> None:
            """This vLLM lacks an internal the binding needs."""
            if not self.options.fallback:
                raise e
            log.warning(
                "wcached: --load-format %s cannot work with this vLLM (%s: %s); %s",
                LOAD_FORMAT,
                type(e).__name__,
                e,
                what,
            )

        def download_model(self, model_config: Any) -> None:
            disk_loader(self.load_config).download_model(model_config)

        def load_model(self, vllm_config: Any, model_config: Any, prefix: str = "") -> Any:
            try:
                impl = self._implementation()
            except Exception as e:
                self._unusable(e, f"loading {model_config.model} from disk instead")
                return disk_loader(self.load_config).load_model(
                    vllm_config=vllm_config, model_config=model_config, prefix=prefix
                )
            return impl.load_model(vllm_config, model_config, prefix)

        def get_external_weight_memory(self, vllm_config: Any) -> int:
            try:
                impl = self._implementation()
            except Exception as e:
                self._unusable(e, "the weights will be loaded from disk")
                return 0
            return impl.get_external_weight_memory(vllm_config)

        # Writing paths: refused in zero-copy mode before anything is
        # imported (a vLLM the binding cannot use still gets the right error).

        def load_weights(self, model: Any, model_config: Any) -> None:
            _writable(self.options)
            self._implementation().load_weights(model, model_config)

        def get_all_weights(self, model_config: Any, model: Any) -> Any:
            """``reload_weights`` from disk: vLLM reads the checkpoint and
            writes it into the model, which only a private copy allows."""
            _writable(self.options)
            return disk_loader(self.load_config).get_all_weights(model_config, model)

    return WcacheModelLoader
