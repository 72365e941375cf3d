"""The parts of the vLLM loader that need no vLLM (the rest runs in tests/integrations)."""

from __future__ import annotations

import pytest

from wcached.config import ModelConfig
from wcached.errors import FillError
from wcached.loaders.vllm import _rank, _span_bytes

torch = pytest.importorskip("torch")


def test_span_covers_strided_and_empty_tensors() -> None:
    t = torch.zeros(4, 6, dtype=torch.bfloat16)
    assert _span_bytes(t) == 48
    assert _span_bytes(t.t()) == 48  # transposed: same storage span
    assert _span_bytes(t[:, :3]) == (3 * 6 + 3) * 2  # rows of a wider tensor
    assert _span_bytes(torch.zeros(5).expand(3, 5)) == 20  # stride 0
    assert _span_bytes(torch.zeros(0, 3)) == 0


def test_rank_from_table_or_cpu_index() -> None:
    m = ModelConfig(name="m", path="p", loader="vllm", tensor_parallel_size=2, ranks={"GPU-a": 1})
    assert _rank(m, "GPU-a") == 1
    assert _rank(m, "cpu1") == 1
    with pytest.raises(FillError, match="no rank for instance GPU-b"):
        _rank(m, "GPU-b")
    assert _rank(ModelConfig(name="m", path="p", loader="vllm"), "GPU-b") == 0
