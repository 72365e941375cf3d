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


@pytest.mark.parametrize("command", [["verify", "cpu0"], ["release", "cpu0", "--model", "default"]])
def test_a_command_with_no_daemon_to_ask_exits_unavailable(work: Path, ckpt: Path, command: list) -> None:
    """No daemon on the instance's socket (stopped, or not yet started) is
    the service being unavailable (69, as sysexits has it), and says where it
    looked: not 70, which tells a script the command itself broke."""
    cfg = tied_model_config(work, ckpt, "64KiB")
    argv = [sys.executable, "-m", "wcached", *command, "--config", str(cfg)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert r.returncode == 69, r.stdout + r.stderr
    assert f"no daemon socket at {work / 'run' / 'cpu0.sock'}" in r.stdout + r.stderr, r.stdout + r.stderr


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


# -- verify_model, in this process, over a host fill's own views -----------------


def _filled(ckpt: Path, **options):
    """A safetensors fill of ``ckpt`` into host memory: its model table, its
    manifest and a view of every tensor (what an attachment holds)."""
    from tests.loaders.test_safetensors import _views
    from wcached.loaders.safetensors import SafetensorsLoader, SafetensorsModel
    from wcached.memory.host import HostBackend

    model = SafetensorsModel(name="m", path=str(ckpt), **options)
    filled = SafetensorsLoader().fill(model, HostBackend(), "cpu0", lambda *a: None)
    return model, filled.manifest, _views(filled)


def _att(manifest, views):
    return type("Att", (), {"manifest": manifest, "tensors": views})()


def _summary(rep) -> tuple:
    return rep.problems, rep.notes, rep.checked_memory, rep.checked_disk


def test_every_digested_tensor_is_checked_past_an_alias_and_an_undigested_one(ckpt: Path) -> None:
    """Tensors without a digest and aliases are skipped in memory, and only
    they: the one after them is checked all the same, and an alias's own
    bytes are still compared with the disk."""
    import msgspec

    from wcached import tensor_digest
    from wcached.cli.verify import verify_model

    model, manifest, views = _filled(ckpt)
    n = len(manifest.tensors)
    assert n > 10 and all(i.digest for i in manifest.tensors)
    assert manifest.attrs == {"digest": tensor_digest.HOST}
    first_on_disk = Checkpoint(ckpt).headers().tensors[0].name
    undigested = next(i for i in manifest.tensors if i.name == first_on_disk)
    rest = [i for i in manifest.tensors if i is not undigested]
    alias = msgspec.structs.replace(rest[0], alias_of=rest[1].name)
    tensors = [msgspec.structs.replace(undigested, digest=""), alias, *rest[1:]]
    rep = verify_model(_att(msgspec.structs.replace(manifest, tensors=tensors), views), model)
    assert rep.model == "m"
    assert _summary(rep) == ([], [], n - 2, n - 1)


def test_a_fill_that_named_no_digest_algorithm_is_read_as_xxh3(ckpt: Path) -> None:
    """A manifest with digests but no "digest" attribute (a daemon from before
    the attribute) was hashed on the host: it verifies, in memory and on disk."""
    import msgspec

    from wcached.cli.verify import verify_model

    model, manifest, views = _filled(ckpt)
    n = len(manifest.tensors)
    rep = verify_model(_att(msgspec.structs.replace(manifest, attrs={}), views), model)
    assert _summary(rep) == ([], [], n, n)


def test_what_could_not_be_compared_is_noted(ckpt: Path) -> None:
    """A model the config does not name is checked in memory only, and says
    so; a fill without digests says that nothing was recorded."""
    from wcached.cli.verify import verify_model

    model, manifest, views = _filled(ckpt)
    rep = verify_model(_att(manifest, views), None)
    notes = ["not in this config: the checkpoint on disk is not compared"]
    assert _summary(rep) == ([], notes, len(manifest.tensors), 0)
    model, manifest, views = _filled(ckpt, digest=False)
    rep = verify_model(_att(manifest, views), model)
    assert _summary(rep) == ([], ["no per-tensor digests were recorded by this fill (digest = false)"], 0, 0)


def _as_vllm(manifest, fingerprint: str, **attrs: str):
    """``manifest`` as a vLLM fill would have recorded it: another loader, the
    checkpoint's fingerprint in its key, ``attrs`` beside its own."""
    import msgspec

    key = msgspec.structs.replace(manifest.key, loader="vllm", fingerprint=fingerprint)
    return msgspec.structs.replace(manifest, key=key, attrs={**manifest.attrs, **attrs})


def _rewrite_keeping_stamps(ckpt: Path) -> None:
    """One tensor's bytes changed in place, its file's modification time put
    back: no fingerprint of stamps and headers sees it, only the bytes do."""
    stamps = {str(f): os.stat(f) for f in ckpt.glob("*.safetensors")}
    victim = _rewrite_one_tensor(ckpt).file
    os.utime(victim, ns=(stamps[victim].st_atime_ns, stamps[victim].st_mtime_ns))


def test_a_fill_of_transformed_tensors_is_compared_by_its_checkpoints_fingerprint(ckpt: Path) -> None:
    """A vLLM fill's tensors are not the checkpoint's bytes: verify compares
    the fingerprint its key recorded (a checkpoint rewritten since differs;
    a fill that recorded none is not compared by one) and says that the bytes
    were not compared."""
    from wcached.cli.verify import verify_model
    from wcached.loaders.vllm.key import checkpoint_fingerprint

    model, manifest, views = _filled(ckpt)
    n = len(manifest.tensors)
    att = _att(_as_vllm(manifest, checkpoint_fingerprint(str(ckpt))), views)
    note = (
        "vllm loader: the checkpoint's fingerprint compared, not its bytes "
        '(fingerprint = "content" records them)'
    )
    assert _summary(verify_model(att, model)) == ([], [note], n, 0)
    _rewrite_one_tensor(ckpt)
    changed = f"checkpoint {ckpt} changed since the fill (its fingerprint differs)"
    assert _summary(verify_model(att, model)) == ([changed], [note], n, 0)
    unrecorded = _att(_as_vllm(manifest, ""), views)
    assert _summary(verify_model(unrecorded, model)) == ([], [note], n, 0)


def test_a_fill_that_recorded_its_checkpoints_content_compares_every_byte(ckpt: Path) -> None:
    """With the content digest recorded (fingerprint = "content"), a byte
    changed under kept stamps is a difference; a checkpoint gone is one too,
    said as what it is."""
    from wcached.cli.verify import verify_model
    from wcached.loaders.vllm.key import checkpoint_fingerprint

    model, manifest, views = _filled(ckpt)
    n = len(manifest.tensors)
    content = Checkpoint(ckpt).content_digest()
    att = _att(
        _as_vllm(manifest, checkpoint_fingerprint(str(ckpt)), **{"checkpoint.content": content}), views
    )
    assert _summary(verify_model(att, model)) == ([], [], n, 1)
    _rewrite_keeping_stamps(ckpt)
    differs = f"checkpoint {ckpt}: its bytes differ from those the fill read"
    assert _summary(verify_model(att, model)) == ([differs], [], n, 1)
    shutil.rmtree(ckpt)
    rep = verify_model(att, model)
    assert rep.problems[0] == f"checkpoint {ckpt} changed since the fill (its fingerprint differs)"
    assert rep.problems[1].startswith(f"checkpoint {ckpt}: its bytes cannot be read (checkpoint "), (
        rep.problems
    )
    assert "does not exist" in rep.problems[1] and len(rep.problems) == 2
    assert rep.checked_disk == 0


def test_a_tensor_on_disk_but_not_served_is_named_and_the_rest_compared(ckpt: Path) -> None:
    import msgspec

    from wcached.cli.verify import verify_model

    model, manifest, views = _filled(ckpt)
    on_disk = Checkpoint(ckpt).headers().tensors
    first = on_disk[0]
    served = [i for i in manifest.tensors if i.name != first.name]
    rep = verify_model(_att(msgspec.structs.replace(manifest, tensors=served), views), model)
    assert rep.problems == [f"{first.name}: in the checkpoint ({Path(first.file).name}) but not served"]
    assert rep.checked_disk == len(on_disk) - 1


def test_a_checkpoint_verify_cannot_read_is_a_difference_naming_it(ckpt: Path, work: Path) -> None:
    from wcached.cli.verify import verify_model
    from wcached.loaders.safetensors import SafetensorsModel

    _, manifest, views = _filled(ckpt)
    gone = work / "gone"
    rep = verify_model(_att(manifest, views), SafetensorsModel(name="m", path=str(gone)))
    assert len(rep.problems) == 1 and rep.problems[0].startswith(f"checkpoint {gone}: "), rep.problems
    assert "does not exist" in rep.problems[0] and rep.checked_disk == 0


def test_a_shard_cut_or_removed_while_verify_reads_names_each_tensor_it_took(ckpt: Path, monkeypatch) -> None:
    """The checkpoint changes between its headers and its bytes (a copy in
    progress): every tensor cut short is named as truncated, every tensor of
    a removed shard with why, and the others are compared still."""
    from wcached.cli.verify import verify_model

    model, manifest, views = _filled(ckpt)
    headers = Checkpoint(ckpt).headers()
    monkeypatch.setattr(Checkpoint, "headers", lambda self: headers)
    shards = sorted({t.file for t in headers.tensors})
    assert len(shards) >= 2
    cut_shard, gone_shard = shards[-1], shards[0]
    in_cut = [t for t in headers.tensors if t.file == cut_shard]
    cut = next(t for t in in_cut if t.nbytes >= 2).data_start + 1
    os.truncate(cut_shard, cut)
    os.unlink(gone_shard)
    rep = verify_model(_att(manifest, views), model)
    expected = []
    for t in headers.tensors:
        if t.file == gone_shard:
            expected.append(f"{t.name}: checkpoint file {gone_shard} vanished while it was read")
        elif t.file == cut_shard and t.nbytes and t.data_start + t.nbytes > cut:
            expected.append(f"{t.name}: {Path(cut_shard).name} is truncated now")
    assert sum("truncated" in e for e in expected) >= 2 and sum("vanished" in e for e in expected) >= 2
    assert rep.problems == expected
    assert rep.checked_disk == len(headers.tensors) - len(expected) > 0


def test_without_torch_cast_and_device_digested_tensors_are_noted_not_compared(
    ckpt: Path, monkeypatch
) -> None:
    """A host without torch can neither cast nor hash wmix128: each such
    tensor is noted with why, and every other one is compared."""
    import msgspec

    import wcached.cli.verify as verify
    from wcached import tensor_digest
    from wcached.dtypes import BY_TORCH_NAME

    model, manifest, views = _filled(ckpt, dtype="float16")
    monkeypatch.setattr(verify, "_has_torch", lambda: False)
    served = {i.name: i for i in manifest.tensors}
    on_disk = Checkpoint(ckpt).headers().tensors
    cast = [t.name for t in on_disk if BY_TORCH_NAME[served[t.name].dtype] is not t.dtype]
    assert 2 <= len(cast) < len(on_disk) and cast[0] != on_disk[-1].name
    rep = verify.verify_model(_att(manifest, views), model)
    notes = [f"{name}: cast at fill, not compared with the disk (needs torch)" for name in cast]
    assert _summary(rep) == ([], notes, len(on_disk), len(on_disk) - len(cast))
    device = msgspec.structs.replace(
        manifest,
        tensors=[
            msgspec.structs.replace(
                i, digest=tensor_digest.torch_digest(tensor_digest.span_of(views[i.name]))
            )
            for i in manifest.tensors
        ],
        attrs={"digest": tensor_digest.DEVICE},
    )
    rep = verify.verify_model(_att(device, views), model)
    notes = [
        f"{t.name}: cast at fill, not compared with the disk (needs torch)"
        if t.name in cast
        else f"{t.name}: its digest is wmix128, not compared with the disk (needs torch)"
        for t in on_disk
    ]
    assert _summary(rep) == ([], notes, len(on_disk), 0)


def test_verify_without_torch_refuses_what_a_daemon_should_not_send(work: Path) -> None:
    """Host memory mapped without torch is held to what an engine's client
    holds it to: host segments only, an attach answered by an attachment,
    tensors inside their segment, hashed with the host's algorithm."""
    import msgspec
    import xxhash

    from tests.client.test_untrusted_daemon import _fake_daemon, _manifest, _memfd, _u8
    from wcached import tensor_digest
    from wcached.cli.verify import HostBytes
    from wcached.errors import ProtocolError
    from wcached.protocol.messages import PROTOCOL_VERSION, Welcome

    good = _manifest(4096, [_u8("head", 0, 16), _u8("past", 4090, 16)])
    with _fake_daemon(work / "a", lambda: _memfd(b"\7" * 4096), good):
        with HostBytes("default", str(work / "a" / "cpu0.sock")) as hb:
            head, past = hb.manifest.tensors
            assert hb.digest(head, tensor_digest.HOST) == xxhash.xxh3_128(b"\7" * 16).hexdigest()
            with pytest.raises(ProtocolError) as e:
                hb.digest(past, tensor_digest.HOST)
            assert str(e.value) == "past: bytes 4090+16 outside its segment"
            with pytest.raises(ProtocolError) as e:
                hb.digest(head, tensor_digest.DEVICE)
            assert str(e.value) == "head: digest 'wmix128' of host memory"
    gpu = msgspec.structs.replace(good, segments=[msgspec.structs.replace(good.segments[0], backend="cuda")])
    with _fake_daemon(work / "b", lambda: _memfd(b"\7" * 4096), gpu):
        with pytest.raises(ProtocolError) as e:
            HostBytes("default", str(work / "b" / "cpu0.sock"))
        assert str(e.value) == "segment 0 is cuda memory: verify needs torch"

    def welcome_again(chan) -> None:
        chan.send(
            Welcome(version=PROTOCOL_VERSION, instance="cpu0", device="x", daemon_version="fake", pid=1)
        )

    with _fake_daemon(work / "c", lambda: -1, good, answer=welcome_again):
        with pytest.raises(ProtocolError) as e:
            HostBytes("default", str(work / "c" / "cpu0.sock"))
        assert str(e.value) == "expected attached, got Welcome"


def test_a_model_verify_cannot_attach_is_named_with_why_and_fails(
    work: Path, ckpt: Path, monkeypatch, capsys
) -> None:
    from wcached.errors import ProtocolError

    cfg = tied_model_config(work, ckpt, "64KiB")

    def refuse(att) -> None:
        att.close()
        raise ProtocolError("the test refuses this attachment")

    with run_daemon(cfg):
        rc, out = _verify_with_served(monkeypatch, capsys, cfg, refuse)
    assert (rc, out) == (1, "default: cannot attach: the test refuses this attachment\n")


def test_verify_of_no_daemon_says_so_with_its_exit_status(work: Path, capsys) -> None:
    from wcached.cli.verify import run
    from wcached.errors import DaemonUnavailable

    (work / "run").mkdir()
    rc = run("cpu0", None, None, str(work / "run"))
    out = capsys.readouterr().out
    assert (rc, out) == (
        DaemonUnavailable.exit_status,
        f"wcached: no daemon socket at {work}/run/cpu0.sock\n",
    )


def test_host_memory_mapped_without_torch_is_held_as_verify_and_hashes_as_filled(
    work: Path, ckpt: Path
) -> None:
    """HostBytes against a real daemon: the daemon sees it as "wcached verify"
    holding the model, every tensor hashes to its recorded digest, and
    closing it twice is harmless."""
    from wcached.cli.verify import HostBytes
    from wcached.client.connection import DaemonConnection

    cfg = tied_model_config(work, ckpt, "64KiB")
    with run_daemon(cfg) as d:
        with HostBytes("default", d.socket_path) as hb:
            with DaemonConnection(d.socket_path) as conn:
                clients = [(c.client, c.models) for c in conn.status().clients]
            assert ("wcached verify", ["default"]) in clients, clients
            digested = [i for i in hb.manifest.tensors if i.digest and i.alias_of is None]
            assert len(digested) > 10
            for info in digested:
                assert hb.digest(info, hb.manifest.attrs["digest"]) == info.digest, info.name
            hb.close()


def test_host_bytes_refuses_fds_that_do_not_match_and_waits_for_them_only_its_timeout(work: Path) -> None:
    """A tensor may end exactly at its segment's end; a daemon sending fewer
    fds than segments is refused by name, and one that never sends the fds
    it announced is given up on after the timeout, not waited for."""
    import time

    import msgspec

    from tests.client.test_untrusted_daemon import _fake_daemon, _manifest, _memfd, _u8
    from wcached import tensor_digest
    from wcached.cli.verify import HostBytes
    from wcached.errors import ProtocolError, TimeoutExpired
    from wcached.protocol.messages import Attached

    edge = _manifest(4096, [_u8("tail", 4080, 16)])
    with _fake_daemon(work / "a", lambda: _memfd(b"\1" * 4080 + b"\2" * 16), edge):
        with HostBytes("default", str(work / "a" / "cpu0.sock")) as hb:
            assert hb.digest(hb.manifest.tensors[0], tensor_digest.HOST) == xxhash_of(b"\2" * 16)
    two = msgspec.structs.replace(
        edge, segments=[edge.segments[0], msgspec.structs.replace(edge.segments[0], index=1)]
    )
    with _fake_daemon(work / "b", lambda: _memfd(b"\1" * 4096), two):
        with pytest.raises(ProtocolError) as e:
            HostBytes("default", str(work / "b" / "cpu0.sock"))
        assert str(e.value) == "1 fds for 2 segments"

    def announce_and_send_nothing(chan) -> None:
        chan.send(Attached(manifest=edge, fd_count=1))

    with _fake_daemon(work / "c", lambda: -1, edge, answer=announce_and_send_nothing):
        started = time.monotonic()
        with pytest.raises(TimeoutExpired):
            HostBytes("default", str(work / "c" / "cpu0.sock"), timeout=0.5)
        assert time.monotonic() - started < 5


def xxhash_of(data: bytes) -> str:
    import xxhash

    return xxhash.xxh3_128(data).hexdigest()


def _three_model_config(work: Path, ckpt: Path, *names: str, **per_model: dict) -> Path:
    from tests.helpers import write_config

    models = [{"name": n, "path": str(ckpt), **per_model.get(n, {})} for n in names]
    return write_config(work / "models.toml", models=models, daemon={"socket_dir": str(work / "run")})


def test_each_model_is_verified_past_one_that_cannot_attach_and_any_difference_fails(
    work: Path, ckpt: Path, monkeypatch, capsys
) -> None:
    """Of three models, one verify cannot attach, one whose served memory
    differs and one that is fine: all three are reported, in order, and the
    run fails (exit 1); verify holds each as "wcached verify"."""
    from wcached.client.connection import DaemonConnection
    from wcached.errors import ProtocolError

    cfg = _three_model_config(work, ckpt, "refused", "differs", "fine")
    seen: list[tuple[str, list]] = []

    def tamper(att) -> None:
        name = att.manifest.model
        with DaemonConnection(str(work / "run" / "cpu0.sock")) as conn:
            seen.append((name, [(c.client, c.models) for c in conn.status().clients]))
        if name == "refused":
            att.close()
            raise ProtocolError("the test refuses this attachment")
        if name == "differs":
            info = next(i for i in att.manifest.tensors if i.digest and i.alias_of is None and i.nbytes >= 4)
            t = att.tensors[info.name].clone()
            t.view(-1).view(torch.uint8)[0] ^= 0xFF
            att.tensors[info.name] = t

    with run_daemon(cfg):
        rc, out = _verify_with_served(monkeypatch, capsys, cfg, tamper)
    assert rc == 1, out
    lines = out.splitlines()
    assert lines[0] == "refused: cannot attach: the test refuses this attachment", out
    assert lines[1].startswith("differs: DIFFERS ("), out
    assert lines[2].endswith(": the memory served differs from what was filled"), out
    assert lines[3].startswith("fine: ok ("), out
    assert len(lines) == 4, out
    assert [n for n, _ in seen] == ["refused", "differs", "fine"]
    for name, clients in seen:
        assert ("wcached verify", [name]) in clients, (name, clients)


def test_one_model_with_nothing_to_compare_makes_the_run_not_verified(
    work: Path, ckpt: Path, monkeypatch, capsys
) -> None:
    """A model without digests beside a verified one: the run is not a pass
    (exit 3), and the unverified model's note is printed under it."""
    cfg = _three_model_config(work, ckpt, "nodigest", "fine", nodigest={"digest": False})
    with run_daemon(cfg):
        rc, out = _verify_with_served(monkeypatch, capsys, cfg, lambda att: None)
    assert rc == 3, out
    assert out.startswith(
        "nodigest: NOT VERIFIED (0 tensors checked in memory, 0 against the checkpoint)\n"
        "  note: no per-tensor digests were recorded by this fill (digest = false)\n"
        "fine: ok ("
    ), out


def test_verify_without_a_config_checks_memory_and_says_the_disk_was_not_compared(
    work: Path, ckpt: Path, monkeypatch, capsys
) -> None:
    """No --config and no /etc/wcache/wcached.toml: verify finds the daemon by
    its socket directory and checks served memory only, saying so; an
    instance other than cpu0 is the one asked."""
    from wcached import defaults
    from wcached.cli.verify import run

    cfg = tied_model_config(work, ckpt, "64KiB")
    monkeypatch.setattr(defaults, "config_path", lambda: str(work / "no-such.toml"))
    with run_daemon(cfg, "cpu1") as d:
        rc = run("cpu1", None, None, d.socket_dir)
    out = capsys.readouterr().out
    assert rc == 0, out
    head, note = out.splitlines()
    assert head.startswith("default: ok (") and head.endswith(
        " tensors checked in memory, 0 against the checkpoint)"
    )
    assert note == "  note: not in this config: the checkpoint on disk is not compared"
