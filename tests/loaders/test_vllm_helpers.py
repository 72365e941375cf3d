"""The parts of the vLLM loader that need no vLLM (the rest runs in tests/integrations)."""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers import fds_opened_since, open_fds
from wcached.device import Device
from wcached.errors import FillError
from wcached.loaders.layout import PhaseClock, fill_segments_in_order
from wcached.loaders.vllm import VllmModel
from wcached.loaders.vllm.fill import group_by_storage, span_bytes
from wcached.memory.host import HostBackend


def test_span_covers_strided_and_empty_tensors() -> None:
    t = torch.zeros(4, 6, dtype=torch.bfloat16)
    assert span_bytes(t) == 48
    assert span_bytes(t.t()) == 48  # transposed: same storage span
    assert span_bytes(t[:, :3]) == (3 * 6 + 3) * 2  # rows of a wider tensor
    assert span_bytes(torch.zeros(5).expand(3, 5)) == 20  # stride 0
    assert span_bytes(torch.zeros(0, 3)) == 0


def test_rank_from_table_or_cpu_index() -> None:
    m = VllmModel(name="m", path="p", tensor_parallel_size=2, ranks={"GPU-a": 1})
    assert m.rank_of("GPU-a") == 1
    assert m.rank_of("cpu1") == 1
    with pytest.raises(FillError, match="no rank for instance GPU-b"):
        m.rank_of("GPU-b")
    assert VllmModel(name="m", path="p").rank_of("GPU-b") == 0


GPU1 = Device("cuda", "GPU-1111", 1, "H200", aliases=("1",))


def test_ranks_written_with_the_operators_name_reach_the_worker_canonical() -> None:
    # The README's `ranks = { "0" = 0, "1" = 1 }`: the worker only knows GPU-<uuid>.
    m = VllmModel(name="m", path="p", tensor_parallel_size=2, ranks={"0": 0, "1": 1})
    out = m.for_device(GPU1)
    assert out.rank_of(GPU1.instance_id) == 1
    by_uuid = VllmModel(name="m", path="p", tensor_parallel_size=2, ranks={"GPU-1111": 1})
    assert by_uuid.for_device(GPU1).rank_of(GPU1.instance_id) == 1


def test_one_instance_with_two_ranks_under_two_names_is_refused() -> None:
    m = VllmModel(name="m", path="p", tensor_parallel_size=2, ranks={"1": 0, "GPU-1111": 1})
    with pytest.raises(FillError, match="several ranks"):
        m.for_device(GPU1)


def test_storages_are_copied_once_for_views_and_ties() -> None:
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    other = torch.ones(3)
    groups = group_by_storage(
        [
            ("w_tail", base[2:], "param"),  # a view that starts later, seen first
            ("w", base, "param"),
            ("w_t", base.t(), "param"),  # a view: same storage
            ("w_bytes", base.view(torch.uint8), "param"),  # another dtype, same storage
            ("b", other, "buffer"),
            ("empty", torch.zeros(0), "buffer"),
        ]
    )
    assert [[n for n, _, _ in g.members] for g in groups] == [
        ["w_tail", "w", "w_t", "w_bytes"],
        ["b"],
        ["empty"],
    ]
    # One span from the lowest address any member uses, copied once.
    assert groups[0].start == base.data_ptr() and groups[0].nbytes == 96
    assert groups[1].nbytes == 12 and groups[2].nbytes == 0


def test_a_span_starts_aligned_so_members_keep_their_alignment() -> None:
    big = torch.zeros(1024, dtype=torch.float32)
    tail = big[37:]  # 148 bytes into its storage
    (group,) = group_by_storage([("tail", tail, "param")], alignment=64)
    assert group.start == big.data_ptr() + 128  # aligned down from +148
    assert (tail.data_ptr() - group.start) % 4 == 0  # its element size
    assert group.nbytes == tail.numel() * 4 + 20


def test_segments_are_filled_one_at_a_time_and_freed_on_failure() -> None:
    events: list[str] = []

    class Recording(HostBackend):
        def allocate(self, nbytes: int, label: str):
            writer = super().allocate(nbytes, label)
            events.append(f"allocate {label}")
            finish = writer.finish

            def recorded_finish() -> int:
                events.append(f"seal {label}")
                return finish()

            writer.finish = recorded_finish
            return writer

    def fill_one(i: int, writer) -> None:
        events.append(f"fill {i}")
        writer.write_bytes(0, memoryview(bytes([i + 1]) * 8), None)

    backend = Recording()
    _, fds = fill_segments_in_order(backend, "m", [4096, 4096], PhaseClock(), fill_one)
    # The first segment is sealed before the second is allocated: a loader
    # frees what it copied in between.
    assert events == ["allocate m.0", "fill 0", "seal m.0", "allocate m.1", "fill 1", "seal m.1"]
    assert os.pread(fds[1], 8, 0) == b"\x02" * 8
    for fd in fds:
        os.close(fd)

    opened: list[int] = []

    def failing(i: int, writer) -> None:
        opened.append(i)
        if i == 1:
            raise RuntimeError("boom")

    before = open_fds()
    with pytest.raises(RuntimeError, match="boom"):
        fill_segments_in_order(backend, "m", [4096, 4096, 4096], PhaseClock(), failing)
    assert opened == [0, 1]
    assert fds_opened_since(before) == {}  # sealed and open segments closed


class _HostArena:
    """An arena over plain host memory, sealed as the CUDA one is: what
    ``_export_arena`` decides from it is the same on a GPU."""

    def __init__(self, label: str = "m"):
        import ctypes

        from wcached.memory.arena import Arena

        self.label = label
        self.memory = (ctypes.c_char * (96 << 20))()  # chunks live inside it
        base = ctypes.addressof(self.memory)
        self.next = base + (-base) % (2 << 20)
        self.arena = Arena(16 << 20, 2 << 20, self._create)

    def _create(self, nbytes: int):
        base, self.next = self.next, self.next + nbytes
        return base, None

    def tensor(self, address: int, numel: int) -> torch.Tensor:
        import ctypes

        return torch.frombuffer((ctypes.c_char * (numel * 4)).from_address(address), dtype=torch.float32)

    def seal(self, spans):
        sealed = self.arena.seal(spans)
        return sealed, [-1] * len(sealed.chunks)


def test_storages_in_the_arena_are_placed_in_its_chunks_and_the_rest_left_to_copy() -> None:
    from wcached.loaders.vllm.fill import _export_arena

    arena = _HostArena()
    big = arena.tensor(arena.arena.alloc(10 << 20), (10 << 20) // 4)  # an exact chunk
    shared = arena.arena.alloc(2 << 20)  # torch's small segment: two tensors in it
    a = arena.tensor(shared, 100)
    b = arena.tensor(shared + 512, 50)
    odd = arena.tensor(shared + 1024 + 256, 8)  # at 256 past a 512 boundary
    arena.arena.alloc(10 << 20)  # scratch: an exact chunk no tensor uses
    elsewhere = torch.ones(4)  # memory torch got outside the arena
    storages = group_by_storage(
        [
            ("big", big, "param"),
            ("a", a, "param"),
            ("b", b, "param"),
            ("odd", odd, "param"),
            ("elsewhere", elsewhere, "buffer"),
            ("empty", torch.zeros(0), "buffer"),
        ],
        alignment=512,
    )
    clock = PhaseClock()
    placed, sizes, fds = _export_arena(arena, storages, 512, clock)
    # Segments are the chunks holding tensors, in address order.
    assert sizes == [10 << 20, 16 << 20] and fds == [-1, -1]
    assert placed[0] == (0, 0)  # big
    assert placed[1] == (1, 0) and placed[2] == (1, 512)  # a and b share the chunk
    # Off the model's alignment, or not the arena's: copied. Empty: segment 0.
    assert placed[3] is None and placed[4] is None
    assert placed[5] == (0, 0)
    assert "export" in clock.phases


def test_with_no_chunk_kept_every_storage_is_copied() -> None:
    from wcached.loaders.vllm.fill import _export_arena

    arena = _HostArena()
    arena.arena.alloc(4 << 20)
    storages = group_by_storage([("w", torch.ones(3), "param"), ("empty", torch.zeros(0), "buffer")])
    placed, sizes, fds = _export_arena(arena, storages, 256, PhaseClock())
    assert placed == [None, None] and sizes == [] and fds == []


def test_a_storage_off_the_alignment_alone_in_its_chunk_is_copied() -> None:
    from wcached.loaders.vllm.fill import _export_arena

    arena = _HostArena()
    odd = arena.tensor(arena.arena.alloc(10 << 20) + 256, 1000)  # alone in an exact chunk
    (group,) = group_by_storage([("odd", odd, "param")], alignment=512)
    placed, sizes, _ = _export_arena(arena, [group], 512, PhaseClock())
    # Copied; its chunk stays exported (and mapped) under it meanwhile.
    assert placed == [None] and sizes == [10 << 20]


def test_storages_copied_after_the_chunks_are_numbered_after_them() -> None:
    from wcached.loaders.vllm.fill import _copy_storages, _PeakMemory

    w = torch.arange(1000, dtype=torch.float32)
    storages = group_by_storage([("w", w, "param"), ("b", torch.ones(7), "buffer")])
    infos: dict = {}
    reported: list[int] = []
    model = VllmModel(name="m", path="p", segment_size=4096)
    sizes, fds = _copy_storages(
        model,
        HostBackend(),
        storages,
        first_segment=3,
        infos=infos,
        algorithm="",
        clock=PhaseClock(),
        peak=_PeakMemory(HostBackend()),
        report=reported.append,
    )
    try:
        # Two segments of their own (4000 bytes fill the first), after the 3 chunks.
        assert [infos[n].segment for n in ("w", "b")] == [3, 4] and len(sizes) == len(fds) == 2
        assert infos["w"].offset == 0 and infos["b"].offset == 0
        assert reported == [4000, 28]
        assert os.pread(fds[0], 8, 0) == torch.arange(2, dtype=torch.float32).numpy().tobytes()
    finally:
        for fd in fds:
            os.close(fd)


def _two_tensor_checkpoint(tmp_path) -> str:
    from safetensors.torch import save_file

    save_file(
        {"w": torch.zeros(1024, 512, dtype=torch.float32), "ids": torch.zeros(256, dtype=torch.int64)},
        str(tmp_path / "model.safetensors"),
    )
    return str(tmp_path)


def test_the_arenas_expected_bytes_are_the_checkpoints_as_served_split_over_the_ranks(tmp_path) -> None:
    from wcached.loaders.vllm.fill import EXPECTED_MARGIN, EXPECTED_SLACK, expected_bytes

    path = _two_tensor_checkpoint(tmp_path)

    def margin(n: float) -> int:
        return int(n * (1 + EXPECTED_MARGIN)) + EXPECTED_SLACK

    stored = 1024 * 512 * 4 + 256 * 8
    assert expected_bytes(VllmModel(name="m", path=path)) == margin(stored)
    # dtype casts the floating tensor, not the integers.
    assert expected_bytes(VllmModel(name="m", path=path, dtype="bfloat16")) == margin(
        1024 * 512 * 2 + 256 * 8
    )
    assert expected_bytes(
        VllmModel(name="m", path=path, tensor_parallel_size=2, pipeline_parallel_size=2)
    ) == (margin(stored / 4))


def test_the_arena_expects_nothing_where_the_checkpoint_cannot_say(tmp_path) -> None:
    from wcached.loaders.vllm.fill import expected_bytes

    path = _two_tensor_checkpoint(tmp_path)
    # Online quantization: the served bytes are not the checkpoint's.
    assert expected_bytes(VllmModel(name="m", path=path, engine_args={"quantization": "fp8"})) is None
    assert expected_bytes(VllmModel(name="m", path=str(tmp_path / "absent"))) is None  # not mounted
    assert expected_bytes(VllmModel(name="m", path="org/model")) is None  # a hub id
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 4)  # truncated: the fill says so, not this
    assert expected_bytes(VllmModel(name="m", path=path)) is None
