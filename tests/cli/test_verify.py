"""``wcached verify`` against a real daemon: memory and disk compared."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import run_daemon, tied_model_config
from wcached.loaders.checkpoint import Checkpoint


def _verify(cfg: Path, *extra: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "wcached", "verify", "cpu0", "--config", str(cfg), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _rewrite_one_tensor(ckpt: Path):
    """One tensor's first bytes inverted in place: same header, same size."""
    victim = next(t for t in Checkpoint(ckpt).headers().tensors if t.nbytes >= 4)
    with open(victim.file, "r+b") as f:
        f.seek(victim.data_start)
        old = f.read(4)
        f.seek(victim.data_start)
        f.write(bytes(b ^ 0xFF for b in old))
    return victim


@pytest.fixture
def ckpt(work: Path, sharded_ckpt: Path) -> Path:
    return Path(shutil.copytree(sharded_ckpt, work / "ckpt"))


def test_verify_passes_then_names_a_tensor_rewritten_in_place(work: Path, ckpt: Path) -> None:
    cfg = tied_model_config(work, ckpt, "64KiB")
    with run_daemon(cfg) as d:
        r = _verify(cfg)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "default: ok" in r.stdout
        checked = int(r.stdout.split("(")[1].split()[0])
        assert checked > 10
        victim = _rewrite_one_tensor(ckpt)
        r = _verify(cfg, "--model", "default")
        assert r.returncode == 1, r.stdout + r.stderr
        assert "default: DIFFERS" in r.stdout
        assert f"{victim.name}: {Path(victim.file).name} on disk differs from what is served" in r.stdout
        # Exactly that one tensor.
        assert r.stdout.count("differs from what is served") == 1, r.stdout
        assert d.proc.poll() is None


def test_verify_of_a_model_it_does_not_serve(work: Path, ckpt: Path) -> None:
    cfg = tied_model_config(work, ckpt, "64KiB")
    with run_daemon(cfg):
        r = _verify(cfg, "--model", "nope")
        assert r.returncode == 2 and "serves no model 'nope'" in r.stdout


def test_served_digest_is_the_fill_digest_for_every_dtype(work: Path, ckpt: Path) -> None:
    from wcached.client import attach
    from wcached.tensor_digest import HOST, digest

    cfg = tied_model_config(work, ckpt, "64KiB")
    with run_daemon(cfg) as d, attach("default", "cpu0", socket_dir=d.socket_dir, keep_lease=False) as a:
        dtypes = set()
        for info in a.manifest.tensors:
            if info.digest and info.alias_of is None:
                assert digest(a.tensors[info.name], HOST) == info.digest, info.name
                dtypes.add(info.dtype)
        assert len(dtypes) >= 4, dtypes
        assert digest(torch.zeros(0), HOST) != ""


@pytest.mark.gpu
def test_verify_hashes_gpu_memory_and_names_a_rewritten_tensor(work: Path, ckpt: Path) -> None:
    cfg = tied_model_config(work, ckpt, "4MiB")
    argv = [sys.executable, "-m", "wcached", "verify", "0", "--config", str(cfg)]
    with run_daemon(cfg, "0"):
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "default: ok" in r.stdout, r.stdout + r.stderr
        victim = _rewrite_one_tensor(ckpt)
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"{victim.name}: {Path(victim.file).name} on disk differs from what is served" in r.stdout
        print(r.stdout)


def test_tensors_over_2_gib_fill_cast_and_verify(work: Path) -> None:
    """One read returns at most 2,147,479,552 bytes on Linux: a 2.24 GB
    float32 tensor (an embedding of a large model) filled as it is and cast
    to bfloat16, then verified against the checkpoint, must all be whole."""
    from safetensors.torch import save_file

    from tests.helpers import write_config

    n = 560_000_000  # 2.24 GB as float32
    big = torch.arange(n, dtype=torch.float32).remainder_(65521.0)
    ckpt = work / "big"
    ckpt.mkdir()
    save_file({"big": big, "small": torch.ones(4)}, str(ckpt / "model.safetensors"))
    expect_bf16 = big[-1000:].to(torch.bfloat16)
    tail = big[-1000:].clone()
    del big
    for dtype, segment in (("auto", "4GiB"), ("bfloat16", "2GiB")):
        cfg = write_config(
            work / f"{dtype}.toml",
            models=[{"name": "default", "path": str(ckpt), "dtype": dtype, "segment_size": segment}],
            daemon={"socket_dir": str(work / "run")},
        )
        with run_daemon(cfg, timeout=300) as d:
            assert "truncated" not in d.log()
            from wcached.client import attach

            with attach("default", "cpu0", socket_dir=d.socket_dir) as a:
                got = a.tensors["big"]
                assert got.numel() == n
                want = expect_bf16 if dtype == "bfloat16" else tail
                assert torch.equal(got[-1000:], want), dtype
            r = _verify(cfg)
            assert r.returncode == 0, r.stdout + r.stderr
            assert "default: ok (2 tensors checked in memory, 2 against the checkpoint)" in r.stdout, r.stdout


def test_nothing_compared_is_not_verified(work: Path, ckpt: Path) -> None:
    """A fill that recorded no digests: nothing can be compared, and that is
    its own answer (exit 3), never "ok"."""
    from tests.helpers import write_config

    cfg = write_config(
        work / "nodigest.toml",
        models=[{"name": "default", "path": str(ckpt), "digest": False}],
        daemon={"socket_dir": str(work / "run")},
    )
    with run_daemon(cfg):
        r = _verify(cfg)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "default: NOT VERIFIED (0 tensors checked in memory, 0 against the checkpoint)" in r.stdout
