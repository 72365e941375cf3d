"""The vLLM bind's checks on plain torch modules, without vLLM installed.

``wcached.integrations.vllm_bind`` imports three vLLM helpers at its top;
stand-ins for them let :func:`register_all` (which needs none of them) be
driven with a meta-device model, as vLLM builds one, and tensors that are
not what its placeholders describe.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from wcached.errors import WcacheError
from wcached.protocol.messages import TensorInfo


@pytest.fixture
def bind(monkeypatch) -> Iterator[types.ModuleType]:
    """vllm_bind imported against stand-ins for vLLM, forgotten afterwards."""
    if "vllm" not in sys.modules:
        stubs = {
            "vllm": {},
            "vllm.model_executor": {},
            "vllm.model_executor.model_loader": {},
            "vllm.model_executor.model_loader.utils": {
                "initialize_model": None,
                "process_weights_after_loading": None,
            },
            "vllm.utils": {},
            "vllm.utils.torch_utils": {"set_default_torch_dtype": None},
        }
        for name, attrs in stubs.items():
            mod = types.ModuleType(name)
            mod.__dict__.update(attrs)
            monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "wcached.integrations.vllm_bind", raising=False)
    import wcached.integrations.vllm_bind as module

    yield module
    sys.modules.pop("wcached.integrations.vllm_bind", None)
    import wcached.integrations

    wcached.integrations.__dict__.pop("vllm_bind", None)


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 4, bias=False, device="meta")  # weight (4, 8), strides (8, 1)


def _attachment(tensors: dict[str, torch.Tensor]) -> SimpleNamespace:
    entries = [
        TensorInfo(
            name=n,
            dtype=str(t.dtype).removeprefix("torch."),
            shape=tuple(t.shape),
            stride=tuple(t.stride()),
            segment=0,
            offset=0,
            nbytes=t.numel() * t.element_size(),
        )
        for n, t in tensors.items()
    ]
    # As an earlier daemon sends it: entries, no runs (the bind groups them).
    return SimpleNamespace(manifest=SimpleNamespace(tensors=entries, runs=[]), tensors=tensors)


def test_a_tensor_laid_out_as_the_parameter_is_bound_in_place(bind) -> None:
    """A tensor of the parameter's shape, dtype and strides replaces it, no copy."""
    model = _Model()
    t = torch.arange(32, dtype=torch.float32).reshape(4, 8)
    bind.register_all(model, _attachment({"proj.weight": t}), strict=True, skip=set())
    assert model.proj.weight.data_ptr() == t.data_ptr()
    assert not model.proj.weight.requires_grad


def test_a_transposed_tensor_is_refused_at_bind_naming_its_strides(bind) -> None:
    """A tensor of the right shape and dtype but another memory layout (a
    transposed view) would make the engine's kernels read wrong weights: the
    bind refuses it, naming the tensor and both strides."""
    model = _Model()
    transposed = torch.zeros(8, 4, dtype=torch.float32).t()  # shape (4, 8), strides (1, 4)
    assert transposed.shape == model.proj.weight.shape
    with pytest.raises(WcacheError, match=r"proj\.weight has strides \(1, 4\), the model's \(8, 1\)"):
        bind.register_all(model, _attachment({"proj.weight": transposed}), strict=True, skip=set())


def test_a_row_strided_tensor_is_refused_at_bind(bind) -> None:
    """Rows further apart than the parameter's (a slice of a wider tensor) are
    another layout too: refused, not bound."""
    model = _Model()
    wide = torch.zeros(4, 16, dtype=torch.float32)[:, :8]  # shape (4, 8), strides (16, 1)
    with pytest.raises(WcacheError, match=r"strides \(16, 1\)"):
        bind.register_all(model, _attachment({"proj.weight": wide}), strict=True, skip=set())


def test_a_tensor_the_model_lacks_is_refused_at_bind(bind) -> None:
    """A cached tensor with no parameter or buffer of that name in the model is
    an error, not a new parameter the engine never reads."""
    model = _Model()
    tensors = {"proj.weight": torch.zeros(4, 8), "proj.bias": torch.zeros(4)}
    with pytest.raises(WcacheError, match=r"proj\.bias is no parameter or buffer"):
        bind.register_all(model, _attachment(tensors), strict=True, skip=set())


@pytest.mark.parametrize(("device", "frozen"), [("cuda", True), ("cuda:1", True), ("cpu", False)])
def test_the_start_up_heap_is_frozen_as_a_gpu_load_begins(bind, device: str, frozen: bool) -> None:
    import gc

    gc.collect()  # as vLLM's memory profiler does before the loader is called
    gc.unfreeze()
    try:
        young = {"made": ["before the load"]}
        bind.freeze_collected_heap(torch.device(device))
        # Frozen objects are out of every generation a collection scans.
        assert (gc.get_freeze_count() > 0) is frozen
        assert gc.is_tracked(young)
        assert (young not in gc.get_objects()) is frozen
    finally:
        gc.unfreeze()
