"""Every way the cache can be unusable, through vLLM's own loader calls.

With ``fallback`` on (the default) each loads from disk and the plugin logs
the reason in one line; with it off, the typed error reaches the engine. A
daemon of the previous protocol (version 1) and one of a later release (that
adds fields) are attached, not fallen back from. All cases run in one vLLM
process per release (vllm_loader_cases.py): the loader is what an engine
worker calls, without an engine start per case.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import require_other_users, run_daemon, write_config
from tests.integrations.fake_daemons import Garbage, Proxy, RefusesVersions, Silent
from tests.integrations.test_vllm import vllm_python  # noqa: F401  (fixture)
from tests.integrations.vllm_engine import vllm_daemon_config
from wcached.cli.demo import generate_llama
from wcached.client.connection import DaemonConnection

pytestmark = pytest.mark.slow

CASES_SCRIPT = Path(__file__).with_name("vllm_loader_cases.py")


def _squatter() -> tuple[subprocess.Popen, Path]:
    """A socket served by another user (nobody): a client must not trust it.
    In a directory of its own under /tmp (pytest's are root's, mode 0700)."""
    socket_dir = Path(tempfile.mkdtemp(prefix="wcached-squat-"))
    os.chmod(socket_dir, 0o777)
    code = (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.bind({str(socket_dir / 'cpu0.sock')!r}); s.listen(4)\n"
        "print('ready', flush=True)\n"
        "while True:\n    c, _ = s.accept()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], user="nobody", group="nogroup", stdout=subprocess.PIPE, cwd="/"
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc, socket_dir


@pytest.fixture(scope="module")
def outcomes(vllm_python: str, tmp_path_factory) -> dict[str, dict]:  # noqa: F811
    require_other_users()  # the squatter runs as nobody
    work = tmp_path_factory.mktemp("fallback")
    model_dir = generate_llama(work / "model")
    cfg = vllm_daemon_config(vllm_python, work, model_dir)
    # A safetensors daemon is enough where the attach fails before any key
    # is compared (a released model, a full daemon).
    small = write_config(
        work / "small.toml",
        models=[{"name": "default", "path": str(model_dir)}],
        daemon={"socket_dir": str(work / "small"), "max_clients": 1},
    )
    servers = []
    with run_daemon(cfg, timeout=300) as real, run_daemon(small, "cpu0", timeout=60) as full:
        upstream = real.socket_path
        servers += [
            Silent(work / "silent"),
            Garbage(work / "garbage"),
            RefusesVersions(work / "v9"),
            Proxy(work / "v1", upstream, "v1"),
            Proxy(work / "next", upstream, "next"),
            Proxy(work / "corrupt", upstream, "corrupt"),
        ]
        squatter, squat_dir = _squatter()
        # The one connection the full daemon allows; released later.
        holder = DaemonConnection(full.socket_path, timeout=10, client="holder")
        names = ("silent", "garbage", "v9", "v1", "next", "corrupt")
        d = {name: str(work / name) for name in names} | {"squatted": str(squat_dir)}
        real_dir, off, f16 = real.socket_dir, {"fallback": False}, {"dtype": "float16"}
        cases = [
            {"name": "cache", "extra": {"socket_dir": real_dir}, "write": True},
            {"name": "unavailable", "extra": {"socket_dir": str(work / "nowhere")}},
            {"name": "mismatch", "extra": {"socket_dir": real_dir}, "engine": f16},
            {"name": "unknown_model", "extra": {"socket_dir": real_dir, "model": "nope"}},
            {"name": "permission", "extra": {"socket_dir": d["squatted"]}},
            {"name": "busy", "extra": {"socket_dir": str(work / "small"), "timeout_s": 1}},
            {"name": "timeout", "extra": {"socket_dir": d["silent"], "timeout_s": 1}},
            {"name": "protocol", "extra": {"socket_dir": d["garbage"]}},
            {"name": "version", "extra": {"socket_dir": d["v9"]}},
            {"name": "bind", "extra": {"socket_dir": d["corrupt"]}},
            {"name": "previous_protocol", "extra": {"socket_dir": d["v1"]}},
            {"name": "next_protocol", "extra": {"socket_dir": d["next"]}},
            {"name": "copy", "extra": {"socket_dir": real_dir, "copy": True}, "write": True},
            {"name": "unavailable_off", "extra": {"socket_dir": str(work / "nowhere"), **off}},
            {"name": "mismatch_off", "extra": {"socket_dir": real_dir, **off}, "engine": f16},
            {"name": "busy_off", "extra": {"socket_dir": str(work / "small"), "timeout_s": 1, **off}},
            {"name": "version_off", "extra": {"socket_dir": d["v9"], **off}},
            {"name": "bind_off", "extra": {"socket_dir": d["corrupt"], **off}},
            {"name": "permission_off", "extra": {"socket_dir": d["squatted"], **off}},
        ]
        try:
            r = subprocess.run(
                [vllm_python, str(CASES_SCRIPT), str(model_dir), json.dumps(cases)],
                capture_output=True,
                text=True,
                timeout=900,
                env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1"),
            )
            # Released after the busy cases: a released model answers as one.
            holder.close()
            released = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "wcached",
                    "release",
                    "cpu0",
                    "--model",
                    "default",
                    "--config",
                    str(small),
                ],
                capture_output=True,
                text=True,
            )
            assert released.returncode == 0, released.stdout + released.stderr
            rel = subprocess.run(
                [
                    vllm_python,
                    str(CASES_SCRIPT),
                    str(model_dir),
                    json.dumps([{"name": "released", "extra": {"socket_dir": str(work / "small")}}]),
                ],
                capture_output=True,
                text=True,
                timeout=600,
                env=dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1"),
            )
        finally:
            squatter.kill()
            shutil.rmtree(squat_dir, ignore_errors=True)
            for s in servers:
                s.close()
        hellos = {name: s.hellos for name, s in zip(("v1", "next"), servers[3:5], strict=True)}
    found = {}
    for line in (r.stdout + rel.stdout).splitlines():
        if line.startswith("CASE "):
            case = json.loads(line[5:])
            found[case["name"]] = case
    assert len(found) == len(cases) + 1, r.stdout[-3000:] + r.stderr[-6000:] + rel.stderr[-3000:]
    found["_hellos"] = hellos  # type: ignore[assignment]
    return found


FALLS_BACK = [
    ("unavailable", "DaemonUnavailable: no daemon socket"),
    ("mismatch", "KeyMismatch: dtype: daemon holds 'bfloat16', client expects 'float16'"),
    ("unknown_model", "UnknownModel"),
    ("released", "ModelReleased"),
    ("permission", "PermissionRefused"),
    ("busy", "Busy"),
    ("timeout", "TimeoutExpired"),
    ("protocol", "ProtocolError: malformed message"),
    ("version", "VersionMismatch: daemon speaks protocol 9..9"),
    ("bind", "WcacheError: attached tensor"),
]


@pytest.mark.parametrize(("name", "reason"), FALLS_BACK, ids=[c[0] for c in FALLS_BACK])
def test_every_failure_loads_from_disk_and_says_why_once(outcomes: dict, name: str, reason: str) -> None:
    case = outcomes[name]
    assert case["outcome"] == "disk", case
    why = [line for line in case["log"] if "from disk instead" in line]
    assert len(why) == 1 and reason in why[0], case["log"]


OFF = [
    ("unavailable_off", "DaemonUnavailable"),
    ("mismatch_off", "KeyMismatch"),
    ("busy_off", "Busy"),
    ("version_off", "VersionMismatch"),
    ("bind_off", "WcacheError"),
    ("permission_off", "PermissionRefused"),
]


@pytest.mark.parametrize(("name", "error"), OFF, ids=[c[0] for c in OFF])
def test_without_fallback_the_typed_error_reaches_the_engine(outcomes: dict, name: str, error: str) -> None:
    case = outcomes[name]
    assert case["outcome"] == "error" and case["error"].startswith(error + ":"), case


def test_a_corrupted_manifest_shape_is_refused_at_bind_naming_the_tensor(outcomes: dict) -> None:
    error = outcomes["bind_off"]["error"]
    assert re.search(r"attached tensor \S+ is bfloat16 \(\d+, \d+\), the model's is bfloat16", error), error


def test_daemons_of_the_previous_and_next_protocol_are_attached(outcomes: dict) -> None:
    assert outcomes["previous_protocol"]["outcome"] == "cache", outcomes["previous_protocol"]
    assert outcomes["next_protocol"]["outcome"] == "cache", outcomes["next_protocol"]
    from wcached.protocol.messages import PROTOCOL_VERSION

    # To the version-1 daemon: refused at this release's version, attached at exactly 1, no range.
    v1 = outcomes["_hellos"]["v1"]
    assert [h["version"] for h in v1[:2]] == [PROTOCOL_VERSION, 1] and "min_version" not in v1[1], v1
    # To the later one: this release's highest version.
    assert outcomes["_hellos"]["next"][0]["version"] == PROTOCOL_VERSION


def test_zero_copy_refuses_weight_writes_and_copy_mode_owns_its_weights(outcomes: dict) -> None:
    cache, copy = outcomes["cache"], outcomes["copy"]
    assert cache["outcome"] == "cache" and cache["zero_copy"], cache
    # Refused, and the model is whole (vLLM's reload left no layer on meta).
    assert cache["write"].startswith("ReadOnlyWeights:") and "copy" in cache["write"], cache
    assert "left on meta" not in cache["write"], cache["write"]
    assert copy["outcome"] == "cache" and not copy["zero_copy"], copy
    assert copy["write"] == "ok", copy
    assert any("copied" in line for line in copy["log"]), copy["log"]
