"""The two ways a filled tensor's bytes are hashed: xxh3 on the host and
wmix128 where the bytes live (a GPU); the fill and verify share them."""

from __future__ import annotations

import pytest
import torch
import xxhash

from wcached import tensor_digest
from wcached.tensor_digest import DEVICE, HOST, digest

MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def _reference(data: bytes) -> str:
    """wmix128 as its docstring states it, in plain integers."""
    a = b = len(data)
    padded = data + b"\0" * (-len(data) % 8)
    for i in range(len(padded) // 8):
        w = int.from_bytes(padded[8 * i : 8 * i + 8], "little")
        a += _mix((w + _mix(i ^ 0x9E3779B97F4A7C15)) & MASK)
        b += _mix(w ^ _mix(i ^ 0xD1B54A32D192ED03))
    return f"{a & MASK:016x}{b & MASK:016x}"


def _bytes(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 64, 1001])
def test_device_digest_is_the_documented_formula(n: int) -> None:
    data = _bytes(n)
    assert digest(data, DEVICE) == _reference(bytes(data.tolist()))


def test_device_digest_does_not_depend_on_chunking_or_alignment(monkeypatch) -> None:
    data = _bytes(4099, seed=1)
    whole = digest(data, DEVICE)
    for chunk in (8, 24, 4096):
        monkeypatch.setattr(tensor_digest, "CHUNK", chunk)
        assert digest(data, DEVICE) == whole, chunk
    # The same bytes at an odd address (a uint8 tensor inside a storage).
    holder = torch.zeros(4099 + 3, dtype=torch.uint8)
    holder[3:] = data
    assert digest(holder[3:], DEVICE) == whole


def test_device_digest_sees_a_flipped_bit_a_moved_word_and_a_zero_tail() -> None:
    data = _bytes(4096, seed=2)
    base = digest(data, DEVICE)
    flipped = data.clone()
    flipped[1000] ^= 0x10
    swapped = data.clone()
    swapped[0:8], swapped[8:16] = data[8:16].clone(), data[0:8].clone()
    longer = torch.cat([data, torch.zeros(8, dtype=torch.uint8)])
    seen = {base, digest(flipped, DEVICE), digest(swapped, DEVICE), digest(longer, DEVICE)}
    assert len(seen) == 4


def test_host_digest_needs_no_numpy_and_hashes_a_views_storage_span(monkeypatch) -> None:
    def no_numpy(self):
        raise RuntimeError("Numpy is not available")

    monkeypatch.setattr(torch.Tensor, "numpy", no_numpy)
    base = torch.arange(64, dtype=torch.float32).reshape(8, 8)
    assert digest(base, HOST) == xxhash.xxh3_128(bytes(base.untyped_storage())).hexdigest()
    # A strided view (as vLLM keeps some): the fill hashed its storage span.
    view = base[2:, ::2]
    span = 6 * 8 * 4 - 4  # from its first element to its last
    raw = bytes(base.untyped_storage())[2 * 8 * 4 : 2 * 8 * 4 + span]
    assert digest(view, HOST, span) == xxhash.xxh3_128(raw).hexdigest()
    assert digest(view, DEVICE, span) == _reference(raw)
    with pytest.raises(ValueError, match="unknown digest algorithm 'md5'"):
        digest(base, "md5")


@pytest.mark.gpu
def test_device_digest_on_a_gpu_equals_the_cpus() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    data = _bytes((3 << 20) + 5, seed=3)
    on_gpu = data.cuda()
    assert digest(on_gpu, DEVICE) == digest(data, DEVICE)
    assert digest(on_gpu[1:], DEVICE) == digest(data[1:], DEVICE)
    assert digest(on_gpu, HOST) == digest(data, HOST)


@pytest.mark.parametrize("algorithm", [DEVICE, HOST])
def test_digests_of_many_are_each_ones_digest_in_order(algorithm: str) -> None:
    parts = [_bytes(n, seed=n) for n in (9, 0, 1001, 8)]
    items = [(parts[0], None), (parts[1], None), (parts[2][1:].view(-1), 500), (parts[3], 4)]
    want = [digest(t, algorithm, n) for t, n in items]
    assert tensor_digest.digests(items, algorithm) == want
    assert len(set(want)) == 4
    assert tensor_digest.digests([], algorithm) == []
    with pytest.raises(ValueError, match="unknown digest algorithm 'md5'"):
        tensor_digest.digests(items, "md5")


@pytest.mark.gpu
def test_gpu_digests_of_many_take_one_launch_and_equal_the_cpus(monkeypatch) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from wcached.memory import cuda_digest

    launches: list[int] = []
    spans = cuda_digest.digest_spans

    def counted(batch, stream=0):
        launches.append(len(batch))
        return spans(batch, stream)

    monkeypatch.setattr(cuda_digest, "digest_spans", counted)
    parts = [_bytes(n, seed=n) for n in (9, 0, (2 << 20) + 3, 8, 4096)]
    items = [(p.cuda(), None) for p in parts] + [(parts[2], None)]
    got = tensor_digest.digests(items, DEVICE)
    assert got == [digest(p, DEVICE) for p in parts] + [digest(parts[2], DEVICE)]
    assert launches == [4]  # the empty one and the host one need no kernel


@pytest.mark.parametrize("algorithm", [DEVICE, HOST])
@pytest.mark.parametrize("cuts", [[], [1], [7, 8, 9], [3, 4096], [4098]])
def test_a_stream_of_pieces_gives_the_whole_tensors_digest(
    algorithm: str, cuts: list[int], monkeypatch
) -> None:
    # verify reads a checkpoint's tensor in pieces of any size; words cross them.
    monkeypatch.setattr(tensor_digest, "CHUNK", 24)  # pieces longer than a chunk too
    data = _bytes(4099, seed=5)
    raw = bytes(data.tolist())
    h = tensor_digest.stream(algorithm)
    for start, end in zip([0, *cuts], [*cuts, len(raw)], strict=True):
        h.update(memoryview(raw)[start:end])
    assert h.hexdigest() == digest(data, algorithm)
    assert h.hexdigest() == digest(data, algorithm)  # asking twice changes nothing


def test_a_stream_of_nothing_and_an_unknown_algorithm() -> None:
    assert tensor_digest.stream(DEVICE).hexdigest() == digest(_bytes(0), DEVICE)
    with pytest.raises(ValueError, match="unknown digest algorithm 'md5'"):
        tensor_digest.stream("md5")


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1001])
def test_the_formula_the_kernel_checks_itself_with_is_the_documented_one(n: int) -> None:
    raw = bytes(_bytes(n, seed=n).tolist())
    assert tensor_digest.formula_digest(raw) == _reference(raw) == digest(_bytes(n, seed=n), DEVICE)
