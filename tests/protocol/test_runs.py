"""Runs: a manifest's tensors as protocol 3 sends them, and back, exactly."""

from __future__ import annotations

import random

import msgspec
import pytest

from wcached.errors import ProtocolError
from wcached.keys import CacheKey
from wcached.protocol.messages import Attached, Manifest, Reply, SegmentInfo, TensorInfo, TensorRun
from wcached.protocol.runs import RunEntries, check_run, expand, for_version, received, runs_of, to_runs

KEY = CacheKey(model="m", loader="safetensors", fingerprint="f", dtype="auto")


def _entry(name: str, offset: int, **kw) -> TensorInfo:
    fields = dict(dtype="bfloat16", shape=(4, 8), stride=(8, 1), segment=0, nbytes=64) | kw
    return TensorInfo(name=name, offset=offset, **fields)


def _manifest(entries: list[TensorInfo]) -> Manifest:
    return Manifest(
        model="m",
        key=KEY,
        segments=[SegmentInfo(index=0, nbytes=1 << 20, backend="host", device="cpu0")],
        tensors=entries,
        total_bytes=1 << 20,
        filled_at=1.0,
    )


def _random_entries(rng: random.Random) -> list[TensorInfo]:
    """Stretches of experts with now and then a field that must end a run."""
    entries: list[TensorInfo] = []
    offset = 0
    for _ in range(rng.randint(0, 8)):
        step = rng.choice([64, 128, 64, 0, -64, 32])
        for _ in range(rng.randint(1, 6)):
            e = _entry(f"t{len(entries)}", max(offset, 0), digest=rng.choice(["", "", f"d{len(entries)}"]))
            odd = rng.random()
            if odd < 0.05:
                e = msgspec.structs.replace(e, segment=1)
            elif odd < 0.1:
                e = msgspec.structs.replace(e, dtype="float16")
            elif odd < 0.15:
                e = msgspec.structs.replace(e, shape=(8, 4), stride=(4, 1))
            elif odd < 0.2:
                e = msgspec.structs.replace(e, stride=(1, 4))
            elif odd < 0.25:
                e = msgspec.structs.replace(e, kind="buffer")
            elif odd < 0.3:
                e = msgspec.structs.replace(e, nbytes=62)
            elif odd < 0.35 and entries:
                e = msgspec.structs.replace(e, alias_of=entries[0].name)
            elif odd < 0.4:
                e = msgspec.structs.replace(e, offset=e.offset + 2)  # off the step
            entries.append(e)
            offset += step
        offset += rng.choice([0, 64, 4096])
    return entries


def test_runs_give_back_every_entry_in_order_for_any_manifest() -> None:
    rng = random.Random(3)
    longest = 0
    for case in range(500):
        entries = _random_entries(rng)
        runs = to_runs(entries)
        assert expand(runs) == entries, case
        assert sum(len(r.names) for r in runs) == len(entries)
        # Over the wire too: what a version-3 client decodes is the same fill.
        wire = msgspec.msgpack.encode(Attached(manifest=for_version(_manifest(entries), 3), fd_count=1))
        got = received(msgspec.msgpack.decode(wire, type=Reply).manifest)
        assert list(got.tensors) == entries and got == _manifest(entries), case
        longest = max(longest, max((len(r.names) for r in runs), default=0))
    assert longest >= 5  # runs were found, not only runs of one


def test_a_run_holds_what_its_members_share_and_one_digest_each() -> None:
    experts = [_entry(f"e{i}", 128 * i, digest=f"d{i}") for i in range(4)]
    tied = _entry("lm_head", 0, alias_of="e0")
    (run, alias) = to_runs([*experts, tied])
    assert (run.names, run.offset, run.step, run.digests) == (
        ["e0", "e1", "e2", "e3"],
        0,
        128,
        ["d0", "d1", "d2", "d3"],
    )
    assert (alias.names, alias.alias_of, alias.step) == (["lm_head"], "e0", 0)
    # No digest at all: none sent, and entries get "" back.
    (plain,) = to_runs([_entry("a", 0), _entry("b", 64)])
    assert plain.digests == [] and [e.digest for e in expand([plain])] == ["", ""]
    # Tied entries never run on, even at the step.
    ties = [_entry("a", 0, alias_of="x"), _entry("b", 64, alias_of="x")]
    assert [len(r.names) for r in to_runs(ties)] == [1, 1]


def test_many_experts_travel_as_one_run() -> None:
    experts = [_entry(f"layers.{i // 64}.experts.{i % 64}.w", 64 * i) for i in range(5000)]
    manifest = for_version(_manifest(experts), 3)
    assert manifest.tensors == [] and len(manifest.runs) == 1
    assert len(msgspec.msgpack.encode(manifest)) < len(msgspec.msgpack.encode(_manifest(experts))) / 2


def test_runs_are_the_fewest_wherever_in_the_manifest_they_start() -> None:
    """A Llama layer's stretches start after other tensors, at any offset: each
    is one run, and what stands alone is a run of one with step 0 (the one
    form of a fill, so the lease's "same fill" test compares runs that a
    daemon of another version would make alike)."""
    norm = _entry("norm", 0, shape=(8,), stride=(1,), nbytes=16)
    gate_up = [_entry(f"l0.gate_up.{i}", 4096 + 64 * i) for i in range(3)]
    head = _entry("head", 8192, dtype="float16")
    scales = [
        _entry(f"l0.scale.{i}", 9000 + i, dtype="int8", shape=(1,), stride=(1,), nbytes=1) for i in range(4)
    ]
    runs = to_runs([norm, *gate_up, head, *scales])
    assert [(r.names[0], len(r.names), r.offset, r.step) for r in runs] == [
        ("norm", 1, 0, 0),
        ("l0.gate_up.0", 3, 4096, 64),
        ("head", 1, 8192, 0),
        # Byte-sized scales back to back: a step of one byte is a step.
        ("l0.scale.0", 4, 9000, 1),
    ]


def test_a_client_below_version_3_gets_entries() -> None:
    m = _manifest([_entry("a", 0), _entry("b", 64)])
    assert for_version(m, 2) is m and for_version(m, 1) is m and for_version(m, 3).runs


@pytest.mark.parametrize(
    ("run", "problem"),
    [
        (TensorRun("bfloat16", (2,), (1,), 0, 0, 0, 4, "param", []), "^a run names no tensor$"),
        (
            TensorRun("bfloat16", (2,), (1,), 0, 0, 4, 4, "param", ["a", "b"], ["d"]),
            "^run of 'a': 1 digests for 2 tensors$",
        ),
        (TensorRun("bfloat16", (2,), (1,), 0, 0, 4, 4, "param", ["a", "b"], list("def")), "3 digests for 2"),
        (TensorRun("bfloat16", (2,), (1,), 0, 0, 0, 4, "param", ["a", "b"]), "positive step"),
        (TensorRun("bfloat16", (2,), (1,), 0, 64, -4, 4, "param", ["a", "b"]), "positive step"),
        (TensorRun("bfloat16", (2,), (1,), 0, 0, 4, 4, "param", ["a", "b"], [], "x"), "no alias"),
    ],
)
def test_a_malformed_run_is_a_protocol_error(run: TensorRun, problem: str) -> None:
    with pytest.raises(ProtocolError, match=problem):
        check_run(run)
    wire = _manifest([])
    with pytest.raises(ProtocolError, match=problem):
        received(msgspec.structs.replace(wire, runs=[run]))


def test_a_manifest_with_both_entries_and_runs_is_refused() -> None:
    m = _manifest([_entry("a", 0)])
    with pytest.raises(ProtocolError, match=r"^a manifest must carry tensors or runs, not both$"):
        received(msgspec.structs.replace(m, runs=to_runs(m.tensors)))


def test_entries_are_made_only_when_read() -> None:
    runs = to_runs([_entry(f"e{i}", 64 * i) for i in range(10)])
    entries = RunEntries(runs)
    assert len(entries) == 10 and entries._entries is None and runs_of(_manifest(entries)) is runs  # type: ignore[arg-type]
    assert entries[3].offset == 192 and [e.name for e in entries[8:]] == ["e8", "e9"]
    assert entries == expand(runs) and expand(runs) == entries
    assert entries == RunEntries(to_runs(expand(runs)))
    assert entries != expand(runs)[:9] and "10 tensors in 1 runs" in repr(entries)
    # A manifest of entries is grouped when asked for its runs.
    assert runs_of(_manifest(expand(runs))) == runs
