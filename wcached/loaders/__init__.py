"""Loader registry.

A loader runs inside the loader worker: it reads a checkpoint described by a
``[[model]]`` table into segments of a memory backend and returns the manifest.
Loaders are named by an import path so that the daemon (which only validates
names) never imports torch or vLLM.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from wcached.config import ModelConfig
    from wcached.loaders.layout import FilledModel
    from wcached.memory.base import MemoryBackend, ProgressFn


class Loader(Protocol):
    def fill(
        self,
        model: ModelConfig,
        backend: MemoryBackend,
        instance: str,
        progress: ProgressFn,
    ) -> FilledModel: ...


_REGISTRY: dict[str, str] = {
    "safetensors": "wcached.loaders.safetensors:SafetensorsLoader",
    "vllm": "wcached.loaders.vllm:VllmLoader",
}


def register_loader(name: str, target: str) -> None:
    """Register ``name`` -> ``"module:Class"``; the class is imported on use."""
    _REGISTRY[name] = target


def loader_names() -> frozenset[str]:
    return frozenset(_REGISTRY)


def get_loader(name: str) -> Loader:
    module_name, _, cls_name = _REGISTRY[name].partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, cls_name)()
