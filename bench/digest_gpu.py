"""What recording a digest of every tensor costs a GPU fill: wmix128
(wcached.tensor_digest) over N GiB of device memory by the NVRTC kernel
(wcached.memory.cuda_digest: one launch for every tensor, as the safetensors
fill calls it, and one per tensor, as tensor_digest.digest does) and by
torch's integer kernels (the reference, what GPU fills used before), side by
side with a device-to-device copy of the same bytes and with xxh3 through
the host. The kernel's digests are checked equal to torch's.

    python3 bench/digest_gpu.py --gib 13
"""

from __future__ import annotations

import argparse
import time

from common import copy_to_out, write_result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=13.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tensors", type=int, default=291, help="the bytes cut into this many tensors")
    args = ap.parse_args()
    import torch

    from wcached import tensor_digest

    n = int(args.gib * 2**30) // args.tensors // 8 * 8
    src = [torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda") for _ in range(args.tensors)]
    dst = [torch.empty_like(t) for t in src]
    total = n * args.tensors

    def timed(fn) -> float:
        best = float("inf")
        for _ in range(args.rounds):
            torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - start)
        return best

    def copy() -> None:
        for s, d in zip(src, dst, strict=True):
            d.copy_(s)

    from wcached.memory import cuda_digest

    spans = [(s.data_ptr(), s.numel()) for s in src]

    def kernel_batch() -> None:
        cuda_digest.digest_spans(spans)

    def kernel_each() -> None:
        for s in src:
            tensor_digest.digest(s, tensor_digest.DEVICE)

    def device() -> None:
        for s in src:
            tensor_digest.torch_digest(s)

    def host() -> None:
        for s in src[: max(1, args.tensors // 10)]:
            tensor_digest.digest(s, tensor_digest.HOST)

    same = cuda_digest.digest_spans(spans) == [tensor_digest.torch_digest(s) for s in src]
    t_copy, t_dev = timed(copy), timed(device)
    t_batch, t_each = timed(kernel_batch), timed(kernel_each)
    t_host = timed(host) * args.tensors / max(1, args.tensors // 10)
    runs = {
        "bytes": total,
        "tensors": args.tensors,
        "copy_d2d_s": t_copy,
        "wmix128_torch_s": t_dev,
        "wmix128_kernel_batch_s": t_batch,
        "wmix128_kernel_each_s": t_each,
        "kernel_equals_torch": same,
        "xxh3_via_host_s_extrapolated": t_host,
    }
    gpu = torch.cuda.get_device_name()
    table = "\n".join(
        [
            f"| {total / 2**30:.1f} GiB in {args.tensors} tensors, {gpu} | seconds | GB/s |",
            "|---|---|---|",
            f"| device-to-device copy (the fill's copy step) | {t_copy:.3f} | {total / t_copy / 1e9:.0f} |",
            f"| wmix128 kernel, one launch for all tensors | {t_batch:.4f} | {total / t_batch / 1e9:.0f} |",
            f"| wmix128 kernel, one call per tensor | {t_each:.4f} | {total / t_each / 1e9:.0f} |",
            f"| wmix128 by torch's kernels (before) | {t_dev:.3f} | {total / t_dev / 1e9:.0f} |",
            f"| xxh3 through the host (a tenth, scaled) | {t_host:.3f} | {total / t_host / 1e9:.1f} |",
            "",
            f"The kernel (one launch) costs {t_batch / t_copy:.2f}x the copy and is {t_dev / t_batch:.0f}x "
            f"torch's kernels; its digests equal torch's: {same}. "
            f"Best of {args.rounds} rounds each, in one run.",
        ]
    )
    copy_to_out(write_result("digest-gpu", runs, table))
    print(table)


if __name__ == "__main__":
    main()
