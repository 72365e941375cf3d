"""The parts of the vLLM loader that need no vLLM (the rest runs in tests/integrations)."""

from __future__ import annotations

import os

import pytest
import torch

from wcached.config import ModelConfig
from wcached.daemon.filler import with_canonical_ranks
from wcached.device import Device
from wcached.errors import FillError
from wcached.loaders.layout import PhaseClock, fill_segments_in_order
from wcached.loaders.vllm import group_by_storage, rank_of, span_bytes
from wcached.memory.host import HostBackend


def test_span_covers_strided_and_empty_tensors() -> None:
    t = torch.zeros(4, 6, dtype=torch.bfloat16)
    assert span_bytes(t) == 48
    assert span_bytes(t.t()) == 48  # transposed: same storage span
    assert span_bytes(t[:, :3]) == (3 * 6 + 3) * 2  # rows of a wider tensor
    assert span_bytes(torch.zeros(5).expand(3, 5)) == 20  # stride 0
    assert span_bytes(torch.zeros(0, 3)) == 0


def test_rank_from_table_or_cpu_index() -> None:
    m = ModelConfig(name="m", path="p", loader="vllm", tensor_parallel_size=2, ranks={"GPU-a": 1})
    assert rank_of(m, "GPU-a") == 1
    assert rank_of(m, "cpu1") == 1
    with pytest.raises(FillError, match="no rank for instance GPU-b"):
        rank_of(m, "GPU-b")
    assert rank_of(ModelConfig(name="m", path="p", loader="vllm"), "GPU-b") == 0


GPU1 = Device("cuda", "GPU-1111", 1, "H200", aliases=("1",))


def test_ranks_written_with_the_operators_name_reach_the_worker_canonical() -> None:
    # The README's `ranks = { "0" = 0, "1" = 1 }`: the worker only knows GPU-<uuid>.
    m = ModelConfig(name="m", path="p", loader="vllm", tensor_parallel_size=2, ranks={"0": 0, "1": 1})
    out = with_canonical_ranks(m, GPU1)
    assert rank_of(out, GPU1.instance_id) == 1
    by_uuid = ModelConfig(name="m", path="p", loader="vllm", tensor_parallel_size=2, ranks={"GPU-1111": 1})
    assert rank_of(with_canonical_ranks(by_uuid, GPU1), GPU1.instance_id) == 1


def test_one_instance_with_two_ranks_under_two_names_is_refused() -> None:
    m = ModelConfig(name="m", path="p", loader="vllm", tensor_parallel_size=2, ranks={"1": 0, "GPU-1111": 1})
    with pytest.raises(FillError, match="several ranks"):
        with_canonical_ranks(m, GPU1)


def test_storages_are_copied_once_for_views_and_ties() -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    other = torch.ones(3)
    groups = group_by_storage(
        [
            ("w", base, "param"),
            ("w_t", base.t(), "param"),  # a view: same storage
            ("w_tail", base[2:], "param"),  # a view starting later
            ("b", other, "buffer"),
            ("empty", torch.zeros(0), "buffer"),
        ]
    )
    assert [[n for n, _, _ in g.members] for g in groups] == [["w", "w_t", "w_tail"], ["b"], ["empty"]]
    assert groups[0].start == base.data_ptr() and groups[0].nbytes == 96
    assert groups[1].nbytes == 12 and groups[2].nbytes == 0


def test_segments_are_filled_one_at_a_time_and_freed_on_failure() -> None:
    backend = HostBackend()
    seen: list[int] = []

    def fill_one(i: int, writer) -> None:
        seen.append(i)
        # The earlier segment is sealed before this one is allocated.
        assert len(seen) == i + 1
        writer.write_bytes(0, memoryview(bytes([i + 1]) * 8), None)

    _, fds = fill_segments_in_order(backend, "m", [4096, 4096], PhaseClock(), fill_one)
    assert seen == [0, 1] and len(fds) == 2
    assert os.pread(fds[1], 8, 0) == b"\x02" * 8
    for fd in fds:
        os.close(fd)

    opened: list[int] = []

    def failing(i: int, writer) -> None:
        opened.append(i)
        if i == 1:
            raise RuntimeError("boom")

    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(RuntimeError, match="boom"):
        fill_segments_in_order(backend, "m", [4096, 4096, 4096], PhaseClock(), failing)
    assert opened == [0, 1]
    assert set(os.listdir("/proc/self/fd")) <= before  # sealed and open segments closed
