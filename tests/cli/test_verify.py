"""``wcached verify`` against a real daemon: memory and disk compared."""

from __future__ import annotations

import os
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


def _verify_with_served(monkeypatch, capsys, cfg: Path, tamper) -> tuple[int, str]:
    """``wcached verify`` run in this process, the attachment it gets passed
    through ``tamper`` first (served host memory is sealed: nothing else can
    make it differ from what was filled)."""
    import wcached.client
    from wcached.cli.verify import run

    real = wcached.client.attach

    def attach(*args, **kwargs):
        att = real(*args, **kwargs)
        tamper(att)
        return att

    monkeypatch.setattr(wcached.client, "attach", attach)
    rc = run("cpu0", None, str(cfg), None)
    return rc, capsys.readouterr().out


def test_verify_names_a_tensor_whose_served_memory_differs_from_the_fill(
    work: Path, ckpt: Path, monkeypatch, capsys
) -> None:
    """Host memory served that no longer hashes to the digest the fill recorded
    is a difference (exit 1) naming that tensor, told apart from a checkpoint change."""
    cfg = tied_model_config(work, ckpt, "64KiB")
    victim: list[str] = []

    def flip_one(att) -> None:
        info = next(i for i in att.manifest.tensors if i.digest and i.alias_of is None and i.nbytes >= 4)
        t = att.tensors[info.name].clone()
        t.view(-1).view(torch.uint8)[0] ^= 0xFF
        att.tensors[info.name] = t
        victim.append(info.name)

    with run_daemon(cfg):
        rc, out = _verify_with_served(monkeypatch, capsys, cfg, flip_one)
    assert rc == 1, out
    assert "default: DIFFERS" in out, out
    assert f"  {victim[0]}: the memory served differs from what was filled\n" in out, out
    assert out.lower().count("differs") == 2, out  # the state and that line, no other tensor
    assert "on disk differs" not in out, out  # the checkpoint is what was filled


def test_verify_names_a_tensor_served_but_gone_from_the_checkpoint(work: Path, ckpt: Path) -> None:
    """A checkpoint rewritten without one of the tensors being served has changed
    since the fill: verify names that tensor (exit 1), though every other one matches."""
    from safetensors.torch import load_file, save_file

    cfg = tied_model_config(work, ckpt, "64KiB")
    with run_daemon(cfg):
        assert _verify(cfg).returncode == 0
        shard = sorted(ckpt.glob("*.safetensors"))[-1]
        tensors = load_file(str(shard))
        gone = sorted(tensors)[0]
        del tensors[gone]
        save_file(tensors, str(shard))
        index = ckpt / "model.safetensors.index.json"
        if index.exists():
            import json

            doc = json.loads(index.read_text())
            del doc["weight_map"][gone]
            index.write_text(json.dumps(doc))
        r = _verify(cfg)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "default: DIFFERS" in r.stdout, r.stdout
    assert f"  {gone}: served but no longer in the checkpoint" in r.stdout, r.stdout


def test_verify_of_a_daemon_serving_no_model_is_not_a_pass(work: Path, ckpt: Path) -> None:
    """A daemon whose every model was released has nothing to compare: verify
    says so and exits 3, never 0 ("verified") on silence."""
    cfg = tied_model_config(work, ckpt, "64KiB")
    from wcached.client.connection import DaemonConnection

    with run_daemon(cfg) as d:
        with DaemonConnection(d.socket_path) as conn:
            conn.release("default")
        r = _verify(cfg)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "serves no model to verify" in r.stdout, r.stdout


def test_verify_on_a_host_without_torch_checks_what_it_checks_with_torch(work: Path, ckpt: Path) -> None:
    """A packaged host runs `wcached verify` with Debian's python3, which has
    no torch: host memory is hashed all the same (tensor for tensor), and a
    rewritten tensor is named."""
    cfg = tied_model_config(work, ckpt, "64KiB")
    shadow = work / "no-torch" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no torch on this host (the test)')\n")
    env = {**os.environ, "PYTHONPATH": f"{shadow.parent}:{os.environ.get('PYTHONPATH', '')}"}
    argv = [sys.executable, "-m", "wcached", "verify", "cpu0", "--config", str(cfg)]
    with run_daemon(cfg):
        with_torch = _verify(cfg)
        without = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
        assert without.returncode == 0, without.stdout + without.stderr
        assert without.stdout == with_torch.stdout, (without.stdout, with_torch.stdout)
        victim = _rewrite_one_tensor(ckpt)
        r = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"{victim.name}: {Path(victim.file).name} on disk differs from what is served" in r.stdout


def test_a_fill_digested_on_its_device_is_compared_with_the_disk_the_same_way(ckpt: Path) -> None:
    """A CUDA fill records wmix128 of its own memory (its kernel): verify
    hashes the checkpoint's bytes with that algorithm (not xxh3), so an
    unchanged checkpoint compares equal and a rewritten tensor is named."""
    import msgspec

    from tests.loaders.test_safetensors import _views
    from wcached import tensor_digest
    from wcached.cli.verify import verify_model
    from wcached.loaders.safetensors import SafetensorsLoader, SafetensorsModel
    from wcached.memory.host import HostBackend

    model = SafetensorsModel(name="m", path=str(ckpt))
    filled = SafetensorsLoader().fill(model, HostBackend(), "cpu0", lambda *a: None)
    views = _views(filled)
    tensors = [
        msgspec.structs.replace(t, digest=tensor_digest.torch_digest(tensor_digest.span_of(views[t.name])))
        for t in filled.manifest.tensors
    ]
    manifest = msgspec.structs.replace(
        filled.manifest, tensors=tensors, attrs={"digest": tensor_digest.DEVICE}
    )
    att = type("Att", (), {"manifest": manifest, "tensors": views})()
    rep = verify_model(att, model)
    assert not rep.problems and rep.checked_disk == rep.checked_memory == len(tensors) > 10, rep
    victim = _rewrite_one_tensor(ckpt)
    rep = verify_model(att, model)
    assert rep.problems == [
        f"{victim.name}: {Path(victim.file).name} on disk differs from what is served "
        "(the checkpoint changed since the fill)"
    ], rep.problems
