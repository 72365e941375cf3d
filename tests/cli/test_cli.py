from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path

from wcached.cli import main
from wcached.errors import EX_CONFIG

REPO = Path(__file__).resolve().parents[2]


def test_check_config_ok(cpu_config: Path, capsys) -> None:
    assert main(["check-config", "--config", str(cpu_config)]) == 0
    out = capsys.readouterr().out
    assert f"{cpu_config}: OK" in out and "model default: loader=safetensors" in out


def test_check_config_error_names_file_and_key(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "w.toml"
    bad.write_text('[[model]]\nname = "a"\npath = "p"\nalignment = "big"\n')
    assert main(["check-config", "--config", str(bad)]) == EX_CONFIG
    err = capsys.readouterr().err
    assert str(bad) in err and "model[0].alignment" in err


def test_unknown_instance_name_exits_78(cpu_config: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "wcached", "serve", "gpu-zero", "--config", str(cpu_config)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == EX_CONFIG
    assert "'gpu-zero' is not a device" in r.stderr


def test_status_without_daemons(cpu_config: Path, capsys) -> None:
    assert main(["status", "--config", str(cpu_config)]) == 3
    assert "no daemon sockets" in capsys.readouterr().out
    assert main(["status", "cpu3", "--config", str(cpu_config), "--json"]) == 3
    assert '"state": "down"' in capsys.readouterr().out


def test_doctor_reports_a_good_config_and_a_missing_checkpoint(
    cpu_config: Path, tmp_path: Path, capsys
) -> None:
    assert main(["doctor", "--config", str(cpu_config)]) == 0
    out = capsys.readouterr().out
    assert "ok    msgspec" in out and "ok    model default: 16 tensors" in out
    assert "no problems found" in out
    missing = tmp_path / "w.toml"
    missing.write_text(f'[[model]]\nname = "m"\npath = "{tmp_path / "none"}"\n')
    assert main(["doctor", "--config", str(missing)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  model m:" in out and "fix: put the checkpoint at" in out


def test_check_config_as_the_daemons_user_finds_what_serve_would_trip_over(work: Path, sharded_ckpt) -> None:
    """An unreadable model directory, a lock file of root's and a metrics
    directory it cannot write: found before a long fill, named, with the user
    they were checked for."""
    from tests.helpers import require_other_users, write_config

    require_other_users()
    import shutil

    ckpt = Path(shutil.copytree(sharded_ckpt, work / "ckpt"))
    ckpt.chmod(0o700)
    run = work / "run"
    run.mkdir(mode=0o755)
    (run / "cpu0.lock").write_text("1\n")
    (run / "cpu0.lock").chmod(0o600)
    metrics = work / "metrics"
    metrics.mkdir(mode=0o755)  # root's: the daemon's user cannot write its textfile there
    metrics.chmod(0o755)
    cfg = write_config(
        work / "wcached.toml",
        models=[{"name": "default", "path": str(ckpt)}],
        daemon={"socket_dir": str(run), "allowed_users": ["nobody"], "metrics_dir": str(metrics)},
    )
    argv = [sys.executable, "-m", "wcached", "check-config", "--config", str(cfg)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    ok = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and "checked as user root" in ok.stdout, ok.stderr
    r = subprocess.run([*argv, "--user", "nobody"], capture_output=True, text=True, env=env)
    assert r.returncode == 78, r.stdout + r.stderr
    assert "checked as user nobody" in r.stderr
    assert f"checkpoint directory {ckpt} cannot be read by user 'nobody'" in r.stderr
    assert f"{run / 'cpu0.lock'} belongs to user root, not to nobody" in r.stderr
    assert f"key 'daemon.metrics_dir': {metrics} is not writable by uid" in r.stderr


def test_status_says_when_the_socket_directory_cannot_be_read(work: Path) -> None:
    """Not "no daemon sockets": the user is told why it sees none."""
    from tests.helpers import require_other_users, run_as, write_config

    require_other_users()
    sdir = work / "private"
    sdir.mkdir(mode=0o750)
    sdir.chmod(0o750)
    work.chmod(0o755)
    cfg = write_config(work / "wcached.toml", models=[], daemon={"socket_dir": str(sdir)})
    cfg.chmod(0o644)
    r = run_as("nobody", [sys.executable, "-m", "wcached", "status", "--config", str(cfg)])
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"user nobody cannot list the socket directory {sdir} (mode 0750, group root)" in r.stderr
    assert "usermod -aG root nobody" in r.stderr
    assert "no daemon sockets" not in r.stdout  # it could not look
    # --json still prints JSON (what systemd knows; here, nothing).
    r = run_as("nobody", [sys.executable, "-m", "wcached", "status", "--json", "--config", str(cfg)])
    assert r.returncode == 3 and json.loads(r.stdout) == [], r.stdout + r.stderr


def test_status_of_a_daemon_this_user_may_not_ask_is_unknown_not_down(work: Path, sharded_ckpt) -> None:
    """An outsider (not in the socket's group) cannot connect: the daemon is
    serving for all it knows, so "unknown (no access)", exit 4, not "down"."""
    from tests.helpers import require_other_users, run_as, run_daemon, tied_model_config

    require_other_users()
    work.chmod(0o755)
    cfg = tied_model_config(work, sharded_ckpt, "64KiB")
    cfg.chmod(0o644)
    with run_daemon(cfg) as d:
        os.chmod(d.socket_dir, 0o755)  # the directory listable, the socket 0660 root:root
        argv = [sys.executable, "-m", "wcached", "status", "--config", str(cfg)]
        r = run_as("nobody", [*argv, "--json"])
        assert r.returncode == 4, r.stdout + r.stderr
        (view,) = json.loads(r.stdout)
        assert view["instance"] == "cpu0" and view["state"] == "unknown", view
        r = run_as("nobody", argv)
        assert "unknown (no access)" in r.stdout and " down " not in r.stdout, r.stdout


def test_status_with_a_config_mistake_still_lists_the_instances(work: Path, sharded_ckpt, capsys) -> None:
    from tests.helpers import run_daemon, tied_model_config

    cfg = tied_model_config(work, sharded_ckpt, "64KiB")
    with run_daemon(cfg) as d:
        broken = work / "broken.toml"
        broken.write_text(f'[daemon]\nsocket_dir = "{d.socket_dir}"\nsocket_dri = "typo"\n')
        # The mistake is said; the sockets of the default directory and the
        # units are still listed (here: the default directory holds none).
        rc = main(["status", "--config", str(broken)])
        out = capsys.readouterr()
        assert rc == EX_CONFIG
        assert "daemon.socket_dri" in out.err and "unknown key" in out.err


def _many_small_tensors(path: Path, count: int) -> Path:
    """One shard of ``count`` 16-byte tensors: with segment_size 256 (and
    256-byte alignment) each fills a segment of its own."""
    import torch
    from safetensors.torch import save_file

    path.mkdir()
    save_file({f"t{i}": torch.ones(4) for i in range(count)}, str(path / "model.safetensors"))
    return path


def test_check_config_refuses_a_segment_size_the_fd_store_cannot_keep(work: Path, capsys) -> None:
    from tests.helpers import write_config
    from wcached.daemon.fdstore import UNIT_FDSTORE_MAX

    many = _many_small_tensors(work / "many", UNIT_FDSTORE_MAX + 10)
    cfg = write_config(
        work / "tiny.toml",
        models=[{"name": "default", "path": str(many), "segment_size": 256}],
        daemon={"socket_dir": str(work / "run")},
    )
    assert main(["check-config", "--config", str(cfg)]) == EX_CONFIG
    err = capsys.readouterr().err
    assert "model[0].segment_size" in err and f"needs {UNIT_FDSTORE_MAX + 11} fds" in err, err
    assert f"the unit keeps {UNIT_FDSTORE_MAX}" in err
    # The same tensors in 1 MiB segments: two of them.
    cfg = write_config(
        work / "fits.toml",
        models=[{"name": "default", "path": str(many), "segment_size": "1MiB"}],
        daemon={"socket_dir": str(work / "run")},
    )
    assert main(["check-config", "--config", str(cfg)]) == 0, capsys.readouterr().err
    # Each fits alone; an instance serving both needs more than the store keeps.
    half = _many_small_tensors(work / "half", UNIT_FDSTORE_MAX * 2 // 3)
    cfg = write_config(
        work / "two.toml",
        models=[
            {"name": "a", "path": str(half), "segment_size": 256},
            {"name": "b", "path": str(half), "segment_size": 256},
        ],
        daemon={"socket_dir": str(work / "run")},
        instances={"cpu0": {"models": ["a", "b"]}},
    )
    assert main(["check-config", "--config", str(cfg)]) == EX_CONFIG
    err = capsys.readouterr().err
    assert "instance.cpu0.models" in err and "model[0].segment_size" not in err, err


def test_big_tensors_each_take_one_segment_and_are_not_refused(work: Path, sharded_ckpt, capsys) -> None:
    """A tensor larger than segment_size gets a segment of its own size: the
    count is the layout's, not the checkpoint's bytes over segment_size."""
    from tests.helpers import write_config

    cfg = write_config(
        work / "w.toml",
        models=[{"name": "default", "path": str(sharded_ckpt), "segment_size": 16}],
        daemon={"socket_dir": str(work / "run")},
    )
    assert main(["check-config", "--config", str(cfg)]) == 0, capsys.readouterr().err


def test_an_unreadable_shard_in_a_readable_directory_is_78_in_the_words_check_config_uses(
    work: Path, sharded_ckpt
) -> None:
    """serve as the daemon's user refuses before any worker starts (not 65:
    the bytes are not wrong; not retried: a retry cannot fix it), and
    check-config --user names the same file in the same sentence; the fix
    it leads to (letting the user read the file) makes serve start."""
    import shutil

    from tests.helpers import require_other_users, run_as, write_config

    require_other_users()
    ckpt = Path(shutil.copytree(sharded_ckpt, work / "ckpt"))
    for p in (work, ckpt):
        p.chmod(0o755)
    shards = sorted(ckpt.glob("*.safetensors"))
    for s in shards:
        s.chmod(0o644)
    shards[1].chmod(0o600)  # root's; the directory stays readable
    run = work / "run"
    run.mkdir()
    nobody = pwd.getpwnam("nobody")
    os.chown(run, nobody.pw_uid, nobody.pw_gid)
    run.chmod(0o750)
    cfg = write_config(
        work / "wcached.toml",
        models=[{"name": "default", "path": str(ckpt)}],
        daemon={"socket_dir": str(run), "allowed_users": ["nobody"]},
    )
    cfg.chmod(0o644)
    said = f"checkpoint file {shards[1]} cannot be read by user 'nobody' (Permission denied)"
    serve = run_as(
        "nobody", [sys.executable, "-m", "wcached", "serve", "cpu0", "--config", str(cfg)], timeout=60
    )
    assert serve.returncode == 78, serve.stdout + serve.stderr
    assert said in serve.stderr, serve.stderr
    assert not (run / "cpu0.sock").exists()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    argv = [sys.executable, "-m", "wcached", "check-config", "--config", str(cfg), "--user", "nobody"]
    check = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert check.returncode == 78, check.stdout + check.stderr
    # The same sentence, under the same key.
    line = next(x for x in serve.stderr.splitlines() if said in x)
    assert line[line.index(str(cfg)) :] in check.stderr, (line, check.stderr)
    # What doctor and check-config lead to: the user may read it; serve then fills.
    shards[1].chmod(0o644)
    assert subprocess.run(argv, capture_output=True, text=True, env=env).returncode == 0
    daemon = subprocess.Popen(
        [sys.executable, "-m", "wcached", "serve", "cpu0", "--config", str(cfg)],
        user=nobody.pw_uid,
        group=nobody.pw_gid,
        extra_groups=[],
        env={**env, "HOME": "/tmp"},
        cwd="/",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while not (run / "cpu0.sock").exists() and daemon.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert (run / "cpu0.sock").exists(), f"serve exited {daemon.poll()} after the fix"
    finally:
        daemon.terminate()
        assert daemon.wait(15) == 0
