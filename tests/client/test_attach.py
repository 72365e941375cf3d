from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import run_daemon
from wcached.client import DaemonUnavailable, KeyMismatch, attach
from wcached.loaders.checkpoint import Checkpoint


def test_expected_key_matches_and_mismatch_names_fields(cpu_config: Path, sharded_ckpt: Path) -> None:
    fp = Checkpoint(sharded_ckpt).header_fingerprint()
    with run_daemon(cpu_config) as d:
        expect = {"fingerprint": fp, "dtype": "auto", "tp_size": 1, "loader": "safetensors"}
        with attach("default", "cpu0", socket_dir=d.socket_dir, expect=expect) as a:
            assert a.manifest.key.fingerprint == fp
        with pytest.raises(KeyMismatch) as e:
            attach("default", "cpu0", socket_dir=d.socket_dir, expect={"dtype": "bfloat16", "tp_size": 2})
        assert e.value.fields == ["dtype", "tp_size"]
        assert "daemon holds 'auto', client expects 'bfloat16'" in str(e.value)
        with pytest.raises(KeyMismatch) as e:
            attach("default", "cpu0", socket_dir=d.socket_dir, expect={"extra.vllm_version": "0.32"})
        assert e.value.fields == ["extra.vllm_version"]


def test_attachment_is_a_lease(cpu_config: Path) -> None:
    from wcached.client import DaemonConnection

    with run_daemon(cpu_config) as d:
        a = attach("default", "cpu0", socket_dir=d.socket_dir)
        with DaemonConnection(d.socket_path) as c:
            leases = [cl for cl in c.status().clients if cl.models == ["default"]]
            assert len(leases) == 1
        t = a.tensors["embed.weight"]
        a.close()
        assert a.closed
        with DaemonConnection(d.socket_path) as c:
            # The close reached the daemon (poll: the server thread notices EOF).
            for _ in range(50):
                if not [cl for cl in c.status().clients if cl.models]:
                    break
                import time

                time.sleep(0.05)
            assert not [cl for cl in c.status().clients if cl.models]
        assert t.float().abs().sum() > 0  # tensors outlive the lease


def test_unavailable_daemon(tmp_path: Path) -> None:
    with pytest.raises(DaemonUnavailable, match="no daemon socket"):
        attach("default", "cpu0", socket_dir=str(tmp_path))


def test_a_client_attaches_without_nvml(cpu_config: Path) -> None:
    """An engine's virtualenv on a CPU host has no nvidia-ml-py (it is the
    `[cuda]` extra, and Debian does not package it): attaching and reading
    tensors must not import it, and the wheel must not require it."""
    import subprocess
    import sys
    import tomllib

    from tests.helpers import REPO

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("nvidia-ml-py") for d in project["dependencies"])
    assert any(d.startswith("nvidia-ml-py") for d in project["optional-dependencies"]["cuda"])
    with run_daemon(cpu_config) as d:
        code = (
            "import sys\n"
            "sys.modules['pynvml'] = None  # import pynvml now raises ImportError\n"
            "from wcached.client import attach\n"
            f"with attach('default', 'cpu0', socket_dir={d.socket_dir!r}) as a:\n"
            "    print(len(a.tensors), float(next(iter(a.tensors.values())).float().sum()))\n"
        )
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[0]) > 0


def test_by_default_the_model_named_default_found_through_the_config(cpu_config: Path) -> None:
    """An engine that names only its config (the operator's socket_dir is in
    it) and no model attaches the model called "default", and the lease is
    the daemon's to report."""
    from wcached.client import DaemonConnection

    with run_daemon(cpu_config) as d:
        assert d.socket_dir != "/run/wcache"  # the config's own, not the default
        with attach(config=str(cpu_config)) as a:
            assert a.manifest.model == "default"
            assert "embed.weight" in a.tensors
            # The mapping carries the model's name: what an operator finds in
            # /proc/<engine pid>/maps to tell which process maps which model.
            maps = Path("/proc/self/maps").read_text()
            assert "/memfd:wcache:default.0 (deleted)" in maps
            with DaemonConnection(d.socket_path) as c:
                assert [cl.models for cl in c.status().clients if cl.models] == [["default"]]


def test_experts_arrive_as_runs_and_view_the_checkpoints_bytes(work: Path, tmp_path: Path) -> None:
    """Protocol 3 over a real daemon: a layer's experts travel as one run,
    the entries made from it are the fill's, and every view holds the
    checkpoint's bytes; a daemon speaking version 1 (entries) gives the same."""
    import torch

    from tests.helpers import as_bytes, load_reference, one_model_config, write_sharded
    from tests.integrations.fake_daemons import Proxy
    from wcached.protocol.messages import Attach, Hello, Reply
    from wcached.protocol.runs import RunEntries
    from wcached.protocol.wire import MAX_REPLY_BYTES, Channel, close_fds, connect

    g = torch.Generator().manual_seed(5)
    tensors = {f"layers.0.experts.{i:02d}.w": torch.randn(16, 8, generator=g) for i in range(64)}
    tensors |= {"layers.0.norm": torch.randn(8, generator=g), "embed": torch.randn(4, 8, generator=g)}
    ckpt = write_sharded(tmp_path / "moe", tensors, shards=1)
    reference = load_reference(ckpt)
    with run_daemon(one_model_config(work, ckpt)) as d:
        with attach("default", "cpu0", socket_dir=d.socket_dir) as a:
            entries = a.manifest.tensors
            assert isinstance(entries, RunEntries) and len(entries) == 66
            assert max(len(r.names) for r in entries.runs) == 64 and len(entries.runs) == 3
            assert {e.name for e in entries} == set(reference) == set(a.tensors)
            for name, want in reference.items():
                assert torch.equal(as_bytes(a.tensors[name]), as_bytes(want)), name
            runs_form = a.manifest
        # A client of version 2 is sent entries: it would not read runs.
        sock = connect(d.socket_path, 5)
        try:
            chan = Channel(sock, Reply)
            chan.send(Hello(version=2, client="v2"))
            assert chan.recv(MAX_REPLY_BYTES).version == 2
            chan.send(Attach(model="default"))
            reply = chan.recv(MAX_REPLY_BYTES)
            close_fds(chan.recv_fds(reply.fd_count))
            assert reply.manifest.runs == [] and list(reply.manifest.tensors) == list(runs_form.tensors)
        finally:
            sock.close()
        proxy = Proxy(tmp_path / "v1", d.socket_path, "v1")
        try:
            with attach("default", "cpu0", socket_dir=str(tmp_path / "v1")) as old:
                assert old.connection.welcome.version == 1 and isinstance(old.manifest.tensors, list)
                assert old.manifest == runs_form  # the same fill, whichever form it came in
                for name, want in reference.items():
                    assert torch.equal(as_bytes(old.tensors[name]), as_bytes(want)), name
        finally:
            proxy.close()
