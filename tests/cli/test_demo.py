"""`make run`: the generated checkpoint and the demo daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch

from tests.helpers import REPO, NotifyListener
from wcached.cli.demo import LLAMA_TINY, generate_llama, llama_shapes


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
    """`make run`: how to attach is printed once the daemon answers, and the
    printed commands work in a new shell that knows nothing of the venv."""
    notify = NotifyListener(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "wcached.cli.demo", "--dir", str(tmp_path / "demo")],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "NOTIFY_SOCKET": notify.path},
    )
    try:
        lines: list[str] = []
        while not lines or not lines[-1].startswith("Ctrl-C stops it"):
            line = proc.stderr.readline()
            assert line, "".join(lines)
            lines.append(line)
        err = "".join(lines)
        assert notify.wait_for("READY=1", 5, proc)
        # After the daemon said it serves, never before.
        assert err.index("serving cpu0 on") < err.index("attach from another shell with:"), err
        commands = [line.strip() for line in lines if line.startswith("  ")]
        assert len(commands) == 2, err
        new_shell = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
        for cmd in commands:
            r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=new_shell, timeout=60)
            assert r.returncode == 0, (cmd, r.stdout, r.stderr)
        attached = subprocess.run(["bash", "-c", commands[0]], capture_output=True, text=True, env=new_shell)
        assert attached.stdout.strip() == f"{len(llama_shapes(LLAMA_TINY))} tensors"
        # The README's snippet as printed, from the repository in a new shell;
        # only the socket directory is this test's, not build/demo/run.
        readme = (REPO / "README.md").read_text()
        section = readme[readme.index("## Attaching from Python") :]
        snippet = section[section.index("```sh\n") + 6 : section.index("\n```", section.index("```sh\n"))]
        assert "build/demo/run" in snippet and snippet.startswith(".venv/bin/python"), snippet
        snippet = snippet.replace("build/demo/run", str(tmp_path / "demo" / "run"))
        r = subprocess.run(["bash", "-c", snippet], capture_output=True, text=True, env=new_shell, cwd=REPO)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert f" {len(llama_shapes(LLAMA_TINY))}" in r.stdout, r.stdout
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 0
        assert "received SIGINT" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
        notify.close()


def test_the_readmes_configuration_is_a_valid_config() -> None:
    """The README's short configuration parses as the daemon parses a file
    (each of its keys exists and has the type it shows)."""
    import tomllib

    from wcached.config import parse_config

    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Configure") :]
    start = section.index("```toml\n") + len("```toml\n")
    block = section[start : section.index("\n```", start)]
    cfg = parse_config(tomllib.loads(block), "README.md")
    assert [m.name for m in cfg.model] == ["default"]
    assert cfg.daemon.socket_dir == "/run/wcache" and "0" in cfg.instance
