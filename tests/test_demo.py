"""`make run`: the generated checkpoint and the demo daemon."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import torch

from tests.helpers import NotifyListener
from wcached.demo import LLAMA_TINY, generate_llama, llama_shapes


def test_generated_llama_is_deterministic_and_loadable(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    a = generate_llama(tmp_path / "a")
    b = generate_llama(tmp_path / "b")
    for f in sorted(a.glob("*.safetensors")):
        assert f.read_bytes() == (b / f.name).read_bytes()
    loaded = {}
    for f in sorted(a.glob("*.safetensors")):
        loaded.update(load_file(str(f)))
    shapes = dict(llama_shapes(LLAMA_TINY))
    assert {k: tuple(v.shape) for k, v in loaded.items()} == shapes
    w = loaded["model.layers.0.mlp.up_proj.weight"].float()
    assert 0.007 < w.abs().min() and w.abs().max() < 0.032
    assert torch.all(loaded["model.norm.weight"] == 1)
    assert json.loads((a / "config.json").read_text())["head_dim"] == 64


def test_demo_serves_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    from wcached.client import attach

    notify = NotifyListener(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "wcached.demo", "--dir", str(tmp_path / "demo")],
        stderr=subprocess.PIPE,
        text=True,
        env={**__import__("os").environ, "NOTIFY_SOCKET": notify.path},
    )
    try:
        notify.wait_for("READY=1", 60, proc)
        with attach("default", "cpu0", socket_dir=str(tmp_path / "demo" / "run")) as a:
            assert len(a.tensors) == len(llama_shapes(LLAMA_TINY))
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0
        err = proc.stderr.read()
        assert "attach with:" in err and "received SIGINT" in err
    finally:
        if proc.poll() is None:
            proc.kill()
        notify.close()
