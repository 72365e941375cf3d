"""Loaders: plugins that fill a model's segments from a checkpoint.

The contract and the lookup are in :mod:`wcached.loaders.base`; the loaders
this package ships are :mod:`wcached.loaders.safetensors` and
:mod:`wcached.loaders.vllm`.
"""

from wcached.loaders.base import Loader, ModelConfig, get_loader, loader_names

__all__ = ["Loader", "ModelConfig", "get_loader", "loader_names"]
