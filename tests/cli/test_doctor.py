"""``wcached doctor``: planted problems are found, each with the fix that fits it."""

from __future__ import annotations

import grp
import os
import pwd
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, require_other_users, write_config
from wcached.cli.doctor import Report, check_device_nodes, check_parallel_fill, check_units


def _doctor(cfg: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "wcached", "doctor", "--config", str(cfg), *args]
    full = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(argv, capture_output=True, text=True, env=full, timeout=120, cwd="/")


def _problem(out: str, what: str) -> tuple[str, str]:
    """The FAIL/warn line containing ``what`` and the fix under it."""
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if what in line and line.startswith(("FAIL", "warn")):
            fix = lines[i + 1].strip() if i + 1 < len(lines) else ""
            return line, fix.removeprefix("fix: ")
    raise AssertionError(f"no problem mentioning {what!r} in:\n{out}")


def test_planted_problems_are_reported_with_their_fixes(work: Path, sharded_ckpt: Path) -> None:
    import shutil

    require_other_users()
    ckpt = Path(shutil.copytree(sharded_ckpt, work / "private"))
    ckpt.chmod(0o700)  # the daemon's user cannot list it
    truncated = Path(shutil.copytree(sharded_ckpt, work / "truncated"))
    shard = sorted(truncated.glob("*.safetensors"))[0]
    shard.write_bytes(shard.read_bytes()[:20])
    run = work / "run"
    run.mkdir()
    run.chmod(0o777)  # anyone could plant a socket there
    # A required package that does not import.
    shadow = work / "shadow" / "tqdm"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('planted by the test')\n")
    cfg = write_config(
        work / "wcached.toml",
        models=[{"name": "private", "path": str(ckpt)}, {"name": "cut", "path": str(truncated)}],
        daemon={"socket_dir": str(run)},
    )
    r = _doctor(cfg, "--user", "nobody", env={"PYTHONPATH": f"{shadow.parent}:{REPO}"})
    assert r.returncode == 1, r.stdout + r.stderr
    out = r.stdout

    line, fix = _problem(out, "tqdm cannot be imported")
    assert "planted by the test" in line
    assert "pip install 'tqdm'" in fix and "python3-tqdm" in fix

    line, fix = _problem(out, f"checkpoint directory {ckpt} cannot be read by user 'nobody'")
    assert str(ckpt) in line and "path of model 'private'" in line
    group = grp.getgrgid(pwd.getpwnam("nobody").pw_gid).gr_name
    # chgrp first: setfacl is not installed on a minimal Debian.
    assert fix.startswith(f"chgrp -R {group} {ckpt} && chmod -R g+rX {ckpt}"), fix
    # The fix, applied as printed, lets the daemon's user read the checkpoint.
    subprocess.run(fix.split("  (or")[0], shell=True, check=True)
    again = _doctor(cfg, "--user", "nobody", env={"PYTHONPATH": f"{shadow.parent}:{REPO}"}).stdout
    assert f"checkpoint directory {ckpt} cannot be read" not in again, again
    assert "path of model 'private'" not in again, again

    line, fix = _problem(out, "model cut:")
    assert shard.name in line and "truncated" in line
    # A truncated file is copied again, not "put in place".
    assert fix.startswith(f"{shard} is incomplete or damaged: copy it again"), fix
    assert "put the checkpoint" not in fix

    line, fix = _problem(out, f"socket directory {run}")
    # The rule serve applies, for the daemon's user (here: nobody).
    assert "belongs to root, not to the daemon's user nobody" in line, line
    group = grp.getgrgid(pwd.getpwnam("nobody").pw_gid).gr_name
    assert fix == f"chown nobody:{group} {run} && chmod 0750 {run}"
    # Said once: check-config as nobody applies the same rule.
    assert sum(str(run) in line for line in out.splitlines() if line.startswith("FAIL")) == 1, out
    assert out.rstrip().endswith(f"{r.stdout.count('FAIL')} problem(s)")


def test_a_socket_directory_the_daemons_user_cannot_list_is_one_problem(
    work: Path, sharded_ckpt: Path
) -> None:
    """root's 0700 directory: check-config as the daemon's user cannot list
    it; doctor says what is wrong once, with its fix, and no traceback."""
    require_other_users()
    run = work / "run"
    run.mkdir()
    run.chmod(0o700)
    cfg = write_config(
        work / "wcached.toml",
        models=[{"name": "m", "path": str(sharded_ckpt)}],
        daemon={"socket_dir": str(run)},
    )
    r = _doctor(cfg, "--user", "nobody")
    assert r.returncode == 1 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    fails = [line for line in r.stdout.splitlines() if line.startswith("FAIL") and str(run) in line]
    assert len(fails) == 1 and "belongs to root, not to the daemon's user nobody" in fails[0], r.stdout


def test_missing_checkpoint_and_custom_socket_dir_get_their_own_fixes(tmp_path: Path) -> None:
    from wcached.cli.doctor import check_socket_dir

    cfg = write_config(
        tmp_path / "w.toml",
        models=[{"name": "m", "path": str(tmp_path / "none")}],
        daemon={"socket_dir": str(tmp_path / "sockets")},
    )
    r = _doctor(cfg)
    _, fix = _problem(r.stdout, "model m:")
    assert fix.startswith(f"put the checkpoint at {tmp_path / 'none'}, or fix model[0].path in {cfg}"), fix

    class Cfg:
        class daemon:
            socket_dir = "/srv/wcache-sockets"

    report = Report()
    import wcached.cli.doctor as doctor

    has_user = doctor._has_user
    doctor._has_user = lambda name: True  # as on a host with the package
    try:
        check_socket_dir(report, Cfg)
    finally:
        doctor._has_user = has_user
    text = "\n".join(report.lines)
    # Not the package's tmpfiles line, which makes /run/wcache only.
    assert "install -d -o wcache -g wcache -m 0750 /srv/wcache-sockets" in text, text
    assert "/etc/tmpfiles.d/wcached-socket-dir.conf" in text and "wcached.conf" not in text.replace(
        "wcached-socket-dir.conf", ""
    )


def test_failed_unit_gets_the_fix_for_its_exit_status() -> None:
    from tests.cli.test_status import LIST_UNITS, SHOW
    from wcached.cli.status import systemd_units

    units = systemd_units(lambda args: LIST_UNITS if args[0] == "list-units" else SHOW)
    report = Report()
    check_units(report, None, units)
    text = "\n".join(report.lines)
    assert "ok    wcached@0.service: activating/start (filling llama (1 of 2)" in text
    line, fix = _problem(text, "wcached@1.service")
    assert "last exit status 78: a configuration mistake" in line
    assert (
        fix.startswith("wcached check-config --user wcache") and "systemctl restart wcached@1.service" in fix
    )
    line, fix = _problem(text, "wcached@cpu2.service")
    assert "exit status 75" in line and "nvidia-smi" in fix
    assert report.failed == 2
    # One instance: only its unit.
    one = Report()
    check_units(one, "1", units)
    assert len(one.lines) == 1 and "wcached@1.service" in one.lines[0]


def test_nvidia_device_nodes_and_uvm_module(tmp_path: Path) -> None:
    dev, mods = tmp_path / "dev", tmp_path / "module"
    dev.mkdir()
    mods.mkdir()
    (dev / "nvidiactl").touch()
    (dev / "nvidia0").touch()
    report = Report()
    check_device_nodes(report, str(dev), str(mods))
    text = "\n".join(report.lines)
    line, fix = _problem(text, "nvidia-uvm is not loaded")
    assert fix == "modprobe nvidia-uvm && nvidia-modprobe -u -c=0"
    line, fix = _problem(text, "device nodes missing")
    assert f"{dev}/nvidia-uvm" in line and f"{dev}/nvidia-uvm-tools" in line and "nvidia0" not in line
    assert fix.startswith("nvidia-modprobe -u -c=0")
    # All there: one ok line.
    (mods / "nvidia_uvm").mkdir()
    (dev / "nvidia-uvm").touch()
    (dev / "nvidia-uvm-tools").touch()
    ok = Report()
    check_device_nodes(ok, str(dev), str(mods))
    assert ok.failed == 0 and ok.lines == ["ok    NVIDIA device nodes: nvidiactl, nvidia-uvm, 1 GPU node(s)"]


def test_tensor_parallel_rendezvous_port_held_by_another_process() -> None:
    from wcached.loaders.vllm import VllmModel

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    model = VllmModel(name="big", path="/m", tensor_parallel_size=2, rendezvous=f"tcp://127.0.0.1:{port}")
    try:
        report = Report()
        check_parallel_fill(report, [model])
    finally:
        held.close()
    text = "\n".join(report.lines)
    assert "ok    loopback interface lo is up" in text, text
    _, fix = _problem(text, f"rendezvous port {port} is in use")
    assert fix.startswith(f"ss -ltnp 'sport = :{port}'")
    free = Report()
    check_parallel_fill(free, [model])
    assert f"ok    model big: 2 ranks can meet at tcp://127.0.0.1:{port}" in free.lines


@pytest.mark.gpu
def test_gpu_host_passes_the_device_checks() -> None:
    """On the GPU machine: device nodes, nvidia-uvm, NVML and the driver's
    VMM fd export all pass, one line per GPU."""
    from wcached.cli.doctor import check_gpu

    report = Report()
    check_gpu(report)
    text = "\n".join(report.lines)
    assert report.failed == 0, text
    assert "ok    NVIDIA device nodes" in text
    assert "VMM with POSIX fd export" in text and "ok    GPU 0:" in text


def test_a_unit_systemd_gave_up_on_gets_reset_failed() -> None:
    from tests.cli.test_status import _unit

    report = Report()
    check_units(report, None, [_unit("cpu1", "failed", "failed", "start-limit-hit", None)])
    line, fix = _problem("\n".join(report.lines), "wcached@cpu1.service")
    assert "started too often in 10 minutes" in line
    assert fix.endswith("systemctl reset-failed wcached@cpu1.service && systemctl start wcached@cpu1.service")


def test_versions_are_the_installed_distributions(monkeypatch) -> None:
    """A module's own version attribute can lag behind what is installed:
    doctor names the distribution's version."""
    import types

    from wcached.cli import doctor

    stale = types.SimpleNamespace(VERSION="3.0.0")
    monkeypatch.setattr(doctor, "_module", lambda name: (stale, "3.0.0"))
    monkeypatch.setattr(doctor, "_distribution_version", lambda name: {"xxhash": "3.2.0"}.get(name, ""))
    r = doctor.Report()
    doctor.check_python(r)
    text = "\n".join(r.lines)
    assert "xxhash 3.2.0" in text and "xxhash 3.0.0" not in text, text
    # Where no distribution is found (a source checkout), the module's own.
    assert "msgspec 3.0.0" in text


@pytest.mark.parametrize(
    "case", ["symlink", "dangling-symlink", "writable-by-another-group", "world-writable", "foreign-owner"]
)
def test_an_untrusted_socket_directory_is_reported_once_and_its_fix_lets_the_daemon_start(
    work: Path, sharded_ckpt: Path, case: str
) -> None:
    """A socket directory serve would refuse: doctor says so once, naming
    the directory, with a fix that, pasted into a shell as root, makes it
    one the daemon starts with (and doctor no longer complains)."""
    from tests.daemon.test_socket_dir import plant
    from tests.helpers import one_model_config, run_daemon

    if os.geteuid() != 0:
        pytest.skip("runs the fix as root")
    if subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare -m to keep the fix's tmpfiles.d line off this host")
    run = work / "run"
    plant(case, run)
    cfg = one_model_config(work, sharded_ckpt, run)
    out = _doctor(cfg, "--user", "root").stdout
    fails = [line for line in out.splitlines() if line.startswith("FAIL") and str(run) in line]
    assert len(fails) == 1 and f"socket directory {run} " in fails[0], out
    _, fix = _problem(out, f"socket directory {run} ")
    # As printed; a private /etc/tmpfiles.d takes the line that survives reboots.
    subprocess.run(
        ["unshare", "-m", "sh", "-ec", f"mount -t tmpfs tmpfs /etc/tmpfiles.d\n{fix}"],
        check=True,
        capture_output=True,
    )
    again = _doctor(cfg, "--user", "root").stdout
    assert not [line for line in again.splitlines() if line.startswith("FAIL") and str(run) in line], again
    with run_daemon(cfg) as d:
        assert d.proc.poll() is None


def _access_config(tmp_path: Path, missing: str) -> Path:
    path = tmp_path / "w.toml"
    path.write_text(
        f"""
[daemon]
socket_dir = "{tmp_path / "run"}"
allowed_users = ["no-such-user-here", "4242"]
allowed_groups = ["4242"]

[instance."cpu1"]
allowed_groups = ["4242", "{missing}"]

[instance."cpu2"]
allowed_users = []

[[model]]
name = "m"
path = "{tmp_path / "none"}"
"""
    )
    return path


MISSING_GROUP = "wcached-doctor-test-grp"


def test_each_instance_tables_access_lists_are_checked_as_the_daemon_resolves_them(tmp_path: Path) -> None:
    """A group or user an instance table names is checked under its key, a
    numeric id is taken as the daemon takes it, an inherited list is said
    once and an empty one a table sets is said."""
    if os.geteuid() == 0:
        subprocess.run(["groupdel", MISSING_GROUP], capture_output=True, check=False)
    path = _access_config(tmp_path, MISSING_GROUP)
    out = _doctor(path).stdout
    line, fix = _problem(out, f"allowed group '{MISSING_GROUP}'")
    assert "(instance.cpu1.allowed_groups[1])" in line, line
    assert fix == f"groupadd --system {MISSING_GROUP}, or fix instance.cpu1.allowed_groups[1] in {path}"
    line, fix = _problem(out, "allowed user 'no-such-user-here'")
    assert "(daemon.allowed_users[0])" in line
    assert fix == f"useradd --system no-such-user-here, or fix daemon.allowed_users[0] in {path}"
    # The daemon allows a numeric id as it is: no problem, under each key.
    for key in ("daemon.allowed_users[1]", "daemon.allowed_groups[0]", "instance.cpu1.allowed_groups[0]"):
        assert f"4242 ({key}): " in out, out
    assert not any(line.startswith("FAIL") and "4242" in line for line in out.splitlines()), out
    # Inherited lists (cpu1's users, cpu2's groups) are said once, under [daemon]'s keys.
    assert out.count("(daemon.allowed_users[0])") == 1, out
    assert out.count("(daemon.allowed_groups[0])") == 1, out
    assert "instance.cpu2.allowed_users is empty: no other user may attach to instance cpu2" in out, out
    assert sum(line.startswith("FAIL") for line in out.splitlines() if "allowed" in line) == 2, out


def test_the_groupadd_doctor_prints_for_a_missing_allowed_group_makes_it_pass(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true":
            pytest.fail("CI runs as root")
        pytest.skip("groupadd needs root")
    subprocess.run(["groupdel", MISSING_GROUP], capture_output=True, check=False)
    path = _access_config(tmp_path, MISSING_GROUP)
    _, fix = _problem(_doctor(path).stdout, f"allowed group '{MISSING_GROUP}'")
    subprocess.run(fix.split(",")[0], shell=True, check=True)
    try:
        again = _doctor(path).stdout
        assert f"allowed group {MISSING_GROUP} (instance.cpu1.allowed_groups[1]): gid " in again, again
        fails = [line for line in again.splitlines() if line.startswith("FAIL")]
        assert not any(MISSING_GROUP in line for line in fails), again
    finally:
        subprocess.run(["groupdel", MISSING_GROUP], capture_output=True, check=False)
