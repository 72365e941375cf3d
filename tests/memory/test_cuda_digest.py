"""The wmix128 kernel: the same digest as the algorithm's torch reference
(on the host), for any size, start and batch; its piece table without a GPU."""

from __future__ import annotations

import pytest

from wcached.memory.cuda_digest import PIECE, pieces_of

SIZES = [1, 7, 8, 9, 4095, PIECE - 1, PIECE, PIECE + 13, 3 * PIECE + 5]


def test_pieces_cover_each_span_once_in_word_steps() -> None:
    spans = [(1 << 40, 3 * PIECE + 5), (7, 0), (4096 + 3, 9)]
    addr, word0, nbytes, span = pieces_of(spans)
    assert list(span) == [0, 0, 0, 0, 2]
    assert list(addr) == [1 << 40, (1 << 40) + PIECE, (1 << 40) + 2 * PIECE, (1 << 40) + 3 * PIECE, 4099]
    assert list(word0) == [0, PIECE // 8, 2 * PIECE // 8, 3 * PIECE // 8, 0]
    assert list(nbytes) == [PIECE, PIECE, PIECE, 5, 9]


@pytest.mark.gpu
@pytest.mark.parametrize("start", [0, 3])
@pytest.mark.parametrize("n", SIZES)
def test_the_kernel_gives_the_reference_digest(n: int, start: int) -> None:
    import torch

    from wcached import tensor_digest
    from wcached.memory import cuda_digest

    g = torch.Generator().manual_seed(n + start)
    host = torch.randint(0, 256, (n + start,), dtype=torch.uint8, generator=g)
    dev = host.cuda()[start:]
    want = tensor_digest.torch_digest(host[start:])
    assert cuda_digest.digest_spans([(dev.data_ptr(), n)])[0] == want
    # The public entry point takes the kernel for GPU bytes.
    assert tensor_digest.digest(dev, tensor_digest.DEVICE) == want
    assert not tensor_digest._kernel_refused


@pytest.mark.gpu
def test_a_batch_is_each_span_alone_and_sees_one_flipped_bit() -> None:
    import torch

    from wcached import tensor_digest
    from wcached.memory import cuda_digest

    parts = [torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda") for n in SIZES]
    spans = [(t.data_ptr(), t.numel()) for t in parts]
    got = cuda_digest.digest_spans(spans)
    assert got == [tensor_digest.torch_digest(t.cpu()) for t in parts]
    parts[-1][PIECE + 1] ^= 1
    again = cuda_digest.digest_spans(spans)
    assert again[:-1] == got[:-1] and again[-1] != got[-1]


@pytest.mark.gpu
def test_the_built_kernel_is_kept_and_a_damaged_copy_is_built_again(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from wcached.memory import cuda_digest, kernel_cache

    torch.empty(1, device="cuda")  # torch's context is current
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    compile_ = cuda_digest._compile
    built: list[bytes] = []

    def counted(opts: list[bytes]) -> bytes:
        built.append(compile_(opts))
        return built[-1]

    monkeypatch.setattr(cuda_digest, "_compile", counted)

    def fresh_process() -> str | None:
        monkeypatch.setattr(cuda_digest, "_kernels", {})
        return cuda_digest.available()

    assert fresh_process() is None and len(built) == 1
    (kept,) = kernel_cache.cache_dir().iterdir()
    assert kernel_cache.load(kept) == built[0]
    # The next worker loads the kept build: NVRTC is not asked.
    assert fresh_process() is None and len(built) == 1
    # A damaged file (cut short: the driver crashes on one) is never loaded:
    # built again, kept again.
    raw = kept.read_bytes()
    kept.write_bytes(raw[: len(raw) // 2])
    assert fresh_process() is None and len(built) == 2
    assert kernel_cache.load(kept) == built[1]
    # A build that loads but digests wrongly is not used either.
    check = cuda_digest._self_check
    calls: list[int] = []

    def wrong_once(cu: object, fn: object) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise cuda_digest.DeviceError("the digest kernel built here gives wrong digests")
        check(cu, fn)

    monkeypatch.setattr(cuda_digest, "_self_check", wrong_once)
    assert fresh_process() is None and len(built) == 3 and len(calls) == 2
    assert cuda_digest._unusable is None
