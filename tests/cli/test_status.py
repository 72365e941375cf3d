"""``wcached status``: every instance from its socket and its unit, as a
table and as JSON, against real daemons and systemd's own output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_daemon, write_config
from wcached.cli import main
from wcached.client import attach

REPO = Path(__file__).resolve().parents[2]


def test_two_instances_with_clients_as_json_and_table(work: Path, sharded_ckpt: Path) -> None:
    """Two daemons of one config; two clients on cpu0, one on cpu1: the
    numbers are the ones this test made."""
    import torch
    from safetensors.torch import save_file

    small = work / "small"
    small.mkdir()
    save_file({"w": torch.ones(256, 256)}, str(small / "model.safetensors"))
    cfg = write_config(
        work / "two.toml",
        models=[{"name": "big", "path": str(sharded_ckpt)}, {"name": "small", "path": str(small)}],
        daemon={"socket_dir": str(work / "run2")},
        instances={"cpu0": {"models": ["big", "small"]}, "cpu1": {"models": ["small"]}},
    )
    with run_daemon(cfg, "cpu0") as d0, run_daemon(cfg, "cpu1"):
        a = attach("big", "cpu0", socket_dir=d0.socket_dir, client="engine-a")
        b = attach("small", "cpu0", socket_dir=d0.socket_dir, client="engine-b")
        c = attach("small", "cpu1", socket_dir=d0.socket_dir, client="engine-c")
        try:
            argv = [sys.executable, "-m", "wcached", "status", "--config", str(cfg)]
            r = subprocess.run([*argv, "--json"], capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            views = {v["instance"]: v for v in json.loads(r.stdout)}
            assert sorted(views) == ["cpu0", "cpu1"]
            cpu0, cpu1 = views["cpu0"], views["cpu1"]
            assert cpu0["state"] == cpu1["state"] == "serving"
            assert cpu0["device"] == "host memory" and cpu0["gpu_uuid"] == ""
            sizes = {m["name"]: m["bytes"] for m in cpu0["models"]}
            assert sizes == {"big": a.manifest.total_bytes, "small": b.manifest.total_bytes}
            assert [m["bytes"] for m in cpu1["models"]] == [256 * 256 * 4]
            for m in cpu0["models"] + cpu1["models"]:
                assert m["origin"] == "filled" and m["fill_seconds"] > 0
            pids = sorted((c["client"], c["models"]) for c in cpu0["clients"])
            assert pids == [("engine-a", ["big"]), ("engine-b", ["small"])]
            assert [(c["client"], c["pid"]) for c in cpu1["clients"]] == [("engine-c", os.getpid())]

            r = subprocess.run(argv, capture_output=True, text=True)
            assert r.returncode == 0, r.stderr
            lines = r.stdout.splitlines()
            assert lines[0].split() == [
                *("INSTANCE", "STATE", "DEVICE", "GPU", "UUID", "MODEL", "SIZE", "TENSORS", "CLIENTS"),
                *("LAST", "FILL", "UPTIME", "PID"),
            ]
            # cpu0: big (1 client), then small (1 client); cpu1: small (1 client).
            n = len(a.manifest.tensors)
            # The fill's rate is over its reading of the checkpoint.
            fill = r"[\d.]+ s, reading [\d.]+ s at [\d.]+ GB/s"
            row = rf"cpu0 +serving +host memory +- +big +[\d.]+ KiB +{n} +1 +{fill} +\d+s +\d+"
            assert re.fullmatch(row, lines[1]), lines
            assert re.fullmatch(rf" +small +256\.0 KiB +1 +1 +{fill}", lines[2]), lines
            assert re.match(r"cpu1 +serving +host memory +- +small +256\.0 KiB +1 +1 ", lines[3]), lines
            assert f"pid {os.getpid()} uid {os.getuid()} (engine-c) attached to small" in r.stdout
        finally:
            for x in (a, b, c):
                x.close()


def _model(name: str, nbytes: int, state: str = "ready", origin: str = "filled", seconds: float = 8.0, **kw):
    from wcached.keys import CacheKey
    from wcached.protocol.messages import ModelStatus

    key = CacheKey(model=name, loader="safetensors", fingerprint="f", dtype="auto")
    return ModelStatus(
        name=name,
        state=state,
        loader="safetensors",
        bytes=nbytes,
        tensors=3,
        segments=1,
        key=key,
        filled_at=0.0,
        fill_seconds=seconds,
        origin=origin,
        **kw,
    )


def test_status_says_what_the_weights_take_of_the_gpu() -> None:
    from wcached.cli.status import InstanceView, memory_note

    v = InstanceView(
        instance="0",
        instance_id="GPU-1",
        state="serving",
        device_memory_bytes=140 << 30,
        models=[_model("m", 15 << 30)],
    )
    note = memory_note(v)
    assert "15.0 GiB = 10.7% of the GPU's 140.0 GiB" in note
    assert "lower gpu_memory_utilization by 0.107" in note
    # Host memory, or nothing held: nothing to say.
    v.device_memory_bytes = 0
    assert memory_note(v) == ""
    v.device_memory_bytes, v.models = 140 << 30, [_model("m", 1, state="released")]
    assert memory_note(v) == ""


def test_last_fill_says_seconds_rate_or_restored() -> None:
    from wcached.cli.status import last_fill

    assert last_fill(_model("m", 16_000_000_000, seconds=8.0)) == "8.0 s, 2.00 GB/s"
    # A vLLM fill: 20 s of it vLLM's import and set-up, the rate over the
    # reading of the checkpoint's 18 GB alone (more than it serves: fp8).
    vllm = _model(
        "m",
        8_000_000_000,
        seconds=26.0,
        phases={"vllm_setup": 20.0, "vllm_construct": 0.5, "read": 4.0, "vllm_post": 1.5},
        read_bytes=18_000_000_000,
    )
    assert last_fill(vllm) == "26.0 s, reading 4.0 s at 4.50 GB/s"
    # A fill too quick to time (0 s) has no rate, not a division by zero.
    assert last_fill(_model("m", 1000, seconds=0.0)) == "0.0 s, 0.00 GB/s"
    # No reading phase (a fill that did not time it): the whole fill's rate.
    assert last_fill(_model("m", 16_000_000_000, seconds=8.0, phases={"copy": 4.0})) == "8.0 s, 2.00 GB/s"
    assert last_fill(_model("m", 16_000_000_000, origin="restored", seconds=8.0)) == "restored (8.0 s fill)"


# What `systemctl list-units` and `systemctl show` print for three instances:
# one filling (no socket yet), one whose config is wrong, one waiting to be
# restarted after running out of memory.
LIST_UNITS = """\
wcached@0.service    loaded activating start   start wcached weight cache for device 0
wcached@1.service    loaded failed     failed  failed wcached weight cache for device 1
wcached@cpu2.service loaded activating auto-restart auto-restart wcached weight cache for device cpu2
"""
SHOW = """\
Id=wcached@0.service
ActiveState=activating
SubState=start
Result=success
StatusText=filling llama (1 of 2): 6.4 of 16.1 GB, 2.10 GB/s, 5 s left
ExecMainCode=0
ExecMainStatus=0

Id=wcached@1.service
ActiveState=failed
SubState=failed
Result=exit-code
StatusText=failed: /etc/wcache/wcached.toml: model[0].dtype: ...
ExecMainCode=1
ExecMainStatus=78

Id=wcached@cpu2.service
ActiveState=activating
SubState=auto-restart
Result=exit-code
StatusText=failed: out of memory: loader worker was killed by the kernel's out-of-memory killer (SIGKILL)
ExecMainCode=1
ExecMainStatus=75
"""


def test_status_shows_instances_without_a_socket_from_their_units(tmp_path: Path) -> None:
    import msgspec

    from wcached.cli.status import InstanceView, gather, systemd_units, table

    calls: list[list[str]] = []

    def systemctl(args):
        calls.append(list(args))
        return LIST_UNITS if args[0] == "list-units" else SHOW

    units = systemd_units(systemctl)
    assert calls[1][-3:] == ["wcached@0.service", "wcached@1.service", "wcached@cpu2.service"]
    views = gather(str(tmp_path), None, 1.0, units)
    by = {v.instance: v for v in views}
    assert by["0"].state == "filling" and by["0"].exit_status is None
    assert by["1"].state == "failed" and by["1"].exit_status == 78
    meaning = by["1"].exit_meaning
    assert meaning.startswith("a configuration mistake") and meaning.endswith("(not retried)")
    assert by["cpu2"].state == "restarting" and by["cpu2"].exit_status == 75
    assert by["cpu2"].instance_id == "cpu2"
    text = table(views)
    assert "0: filling llama (1 of 2): 6.4 of 16.1 GB, 2.10 GB/s, 5 s left" in text
    assert "1: exit status 78: a configuration mistake" in text
    # What the daemon itself said last.
    assert "1: failed: /etc/wcache/wcached.toml: model[0].dtype: ..." in text
    assert "journalctl -u wcached@1.service -e" in text
    assert "cpu2: last run exit status 75: out of device or host memory while filling" in text
    # The daemon's last word once, under the meaning of its exit status.
    assert text.count("cpu2: failed: out of memory: loader worker was killed") == 1, text
    # An instance stopped cleanly is left out, unless asked for by name.
    stopped = msgspec.structs.replace(units[1], active_state="inactive", sub_state="dead", result="success")
    assert [v.instance for v in gather(str(tmp_path), None, 1.0, [units[0], stopped])] == ["0"]
    (asked,) = gather(str(tmp_path), "1", 1.0, [units[0], stopped])
    assert asked.state == "stopped" and asked.exit_status is None
    # The JSON round-trips through its own schema's types.
    again = msgspec.json.decode(msgspec.json.encode(views), type=list[InstanceView])
    assert again == views


def test_status_json_schema_is_the_documented_one(capsys) -> None:
    """docs/status.schema.json is what `wcached status --json-schema` prints:
    regenerate it with that command when the format changes."""
    import json

    assert main(["status", "--json-schema"]) == 0
    printed = json.loads(capsys.readouterr().out)
    documented = json.loads((REPO / "docs" / "status.schema.json").read_text())
    assert printed == documented


@pytest.mark.gpu
def test_gpu_instance_shows_its_device_uuid_and_metrics_labels(work: Path, sharded_ckpt: Path) -> None:
    """On a GPU: the table names the GPU and its UUID, the instance by its
    index, and the metrics carry the UUID."""
    import urllib.request

    import pynvml
    from prometheus_client.parser import text_string_to_metric_families

    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name, uuid = pynvml.nvmlDeviceGetName(handle), pynvml.nvmlDeviceGetUUID(handle)
    finally:
        pynvml.nvmlShutdown()
    name = name.decode() if isinstance(name, bytes) else name
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    port = _free_port()
    cfg = write_config(
        work / "gpu.toml",
        models=[{"name": "default", "path": str(sharded_ckpt)}],
        daemon={"socket_dir": str(work / "run"), "metrics_port": port},
    )
    with run_daemon(cfg, "0"), attach("default", "0", socket_dir=str(work / "run")) as a:
        r = subprocess.run(
            [sys.executable, "-m", "wcached", "status", "--config", str(cfg), "--json"],
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, r.stderr
        (view,) = json.loads(r.stdout)
        assert view["instance"] == "0" and view["instance_id"] == uuid and view["gpu_uuid"] == uuid
        assert view["device"] == name and view["device_memory_bytes"] > 0
        assert view["models"][0]["bytes"] == a.manifest.total_bytes
        table = subprocess.run(
            [sys.executable, "-m", "wcached", "status", "--config", str(cfg)], capture_output=True, text=True
        ).stdout
        assert re.match(rf"0 +serving +{re.escape(name)} +{uuid} +default ", table.splitlines()[1]), table
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        (resident,) = families["wcached_model_resident_bytes"].samples
        assert resident.labels == {"instance": uuid, "gpu_uuid": uuid, "model": "default"}
        assert resident.value == a.manifest.total_bytes


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _unit(
    instance: str, active: str, sub: str, result: str = "success", status: int | None = 0, text: str = ""
):
    from wcached.cli.status import UnitInfo

    return UnitInfo(
        unit=f"wcached@{instance}.service",
        instance=instance,
        active_state=active,
        sub_state=sub,
        result=result,
        status_text=text,
        exit_code="exited",
        exit_status=status,
    )


def test_units_join_daemons_by_the_index_they_report_without_nvml() -> None:
    """A GPU daemon reports its index: wcached@0 joins it with no NVML in this
    process; a second unit of the same GPU (which cannot take its lock) is
    shown on its own, not hidden."""
    from wcached.cli.status import InstanceView, _with_units

    serving = InstanceView(instance="0", instance_id="GPU-abc", state="serving", gpu_uuid="GPU-abc")
    units = [
        _unit("0", "active", "running", text="serving 1 model(s)"),
        _unit("GPU-abc", "activating", "auto-restart", "exit-code", 75),
    ]
    views = _with_units([serving], units, None)
    assert [(v.instance, v.state, v.unit) for v in views] == [
        ("0", "serving", "wcached@0.service"),
        ("GPU-abc", "restarting", "wcached@GPU-abc.service"),
    ]
    assert views[1].exit_status == 75 and "another daemon serving this device" in views[1].exit_meaning


def test_a_stale_socket_shows_what_the_unit_is_doing() -> None:
    """SIGKILLed: its socket stays, nobody answers; the unit is restarting."""
    from wcached.cli.status import InstanceView, _with_units

    stale = InstanceView(instance="cpu3", instance_id="cpu3", state="down", error="connection refused")
    (view,) = _with_units([stale], [_unit("cpu3", "activating", "auto-restart", "signal", 9)], None)
    assert view.state == "restarting" and view.error == "connection refused"


def test_systemds_result_says_more_than_the_exit_status() -> None:
    from wcached.cli.status import _unit_view, table

    gave_up = _unit_view(_unit("cpu1", "failed", "failed", "start-limit-hit", None), "cpu1")
    assert gave_up.exit_meaning == (
        "started too often in 10 minutes, systemd gave up: systemctl reset-failed wcached@cpu1.service"
    )
    assert "cpu1: started too often" in table([gave_up])
    stalled = _unit_view(_unit("cpu2", "activating", "auto-restart", "watchdog", 6), "cpu2")
    assert stalled.exit_meaning == "killed by the watchdog: its main loop stalled"


def _status_of(sdir: Path, *args: str, timeout: float = 30) -> tuple[int, list[dict], float]:
    """``wcached status --json`` for the sockets in ``sdir``: its exit
    status, the instances it printed and how long it took."""
    import time

    cfg = sdir / "wcached.toml"
    cfg.write_text(f'[daemon]\nsocket_dir = "{sdir}"\n')
    started = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "wcached", "status", "--config", str(cfg), "--json", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return r.returncode, json.loads(r.stdout or "[]"), time.monotonic() - started


def test_a_socket_nobody_listens_on_is_down_and_status_exits_3(tmp_path: Path) -> None:
    """A daemon killed without cleanup leaves its socket file: status says
    down (exit 3), and that the socket refuses connections."""
    import socket

    from wcached.cli import EXIT_DOWN

    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(tmp_path / "cpu3.sock"))
    dead.close()
    rc, views, took = _status_of(tmp_path, "--timeout", "5")
    assert rc == EXIT_DOWN == 3, views
    (view,) = views
    assert (view["instance"], view["state"]) == ("cpu3", "down")
    assert "refuses connections" in view["error"] and str(tmp_path / "cpu3.sock") in view["error"]
    assert took < 5, "a refused connection needs no waiting"


def test_a_daemon_that_accepts_but_never_answers_does_not_hang_status(tmp_path: Path) -> None:
    """A daemon whose main loop is stuck still has connections accepted by
    the kernel: status gives up after --timeout, says down (exit 3) with
    "timed out" (not "refuses connections"), and still reports the rest."""
    import socket

    from wcached.cli import EXIT_DOWN

    stuck = socket.socket(socket.AF_UNIX)
    stuck.bind(str(tmp_path / "cpu4.sock"))
    stuck.listen(8)
    dead = socket.socket(socket.AF_UNIX)
    dead.bind(str(tmp_path / "cpu5.sock"))
    dead.close()
    try:
        rc, views, took = _status_of(tmp_path, "--timeout", "1", timeout=20)
    finally:
        stuck.close()
    assert rc == EXIT_DOWN == 3, views
    by = {v["instance"]: v for v in views}
    assert by["cpu4"]["state"] == "down" and "timed out" in by["cpu4"]["error"], by
    assert "refuses connections" not in by["cpu4"]["error"]
    assert by["cpu5"]["state"] == "down" and "refuses connections" in by["cpu5"]["error"], by
    assert took < 10, f"status took {took:.1f} s with --timeout 1"


def test_a_running_unit_whose_socket_does_not_answer_is_down_not_unknown(tmp_path: Path) -> None:
    """systemd says the unit runs, yet its socket did not answer (or is not
    there): down (the operator must look), not unknown (which means "not
    allowed to ask")."""
    from wcached.cli.status import InstanceView, _with_units, all_serving, any_unknown, gather

    running = _unit("cpu6", "active", "running", text="serving 1 model(s)")
    (gone,) = gather(str(tmp_path), None, 1.0, [running])
    assert (gone.instance, gone.state, gone.unit) == ("cpu6", "down", "wcached@cpu6.service")
    assert not all_serving([gone]) and not any_unknown([gone])

    hung = InstanceView(
        instance="cpu4", instance_id="cpu4", state="down", error="timed out waiting for a frame"
    )
    (view,) = _with_units([hung], [_unit("cpu4", "active", "running", text="serving 1 model(s)")], None)
    assert view.state == "down" and view.error == "timed out waiting for a frame"
    assert view.unit == "wcached@cpu4.service"
    assert not all_serving([view]) and not any_unknown([view])


# -- the pieces, each rule at its edges ------------------------------------------


@pytest.mark.parametrize(
    ("n", "said"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (1024**2 - 1, "1024.0 KiB"),
        (1024**2, "1.0 MiB"),
        (1024**3, "1.0 GiB"),
        (1024**4, "1.0 TiB"),
        (1024**5, "1024.0 TiB"),
    ],
)
def test_sizes_in_binary_units(n: int, said: str) -> None:
    from wcached.cli.status import size

    assert size(n) == said


@pytest.mark.parametrize(
    ("s", "said"),
    [
        (0, "0s"),
        (59.9, "59s"),
        (60, "1m00s"),
        (61, "1m01s"),
        (3599, "59m59s"),
        (3600, "1h00m"),
        (3720, "1h02m"),
        (90061, "25h01m"),
    ],
)
def test_durations_at_their_unit_edges(s: float, said: str) -> None:
    from wcached.cli.status import duration

    assert duration(s) == said


def test_how_a_run_ended_is_said_by_systemds_result_first_then_status_or_signal() -> None:
    from wcached import exits
    from wcached.cli.status import RESULT_MEANINGS, exit_meaning

    for result, text in RESULT_MEANINGS.items():
        assert exit_meaning("exited", 1, result, "wcached@cpu0.service") == text.format(
            unit="wcached@cpu0.service"
        )
    assert exit_meaning("exited", None, "start-limit-hit").endswith("systemctl reset-failed the unit")
    assert exit_meaning("exited", None, "exit-code") == ""
    assert exit_meaning("killed", 9, "signal") == "killed by SIGKILL (out of memory?)"
    assert exit_meaning("dumped", 11, "core") == "killed by SIGSEGV"
    assert exit_meaning("killed", 15) == "killed by SIGTERM"
    assert exit_meaning("killed", 200) == "killed by signal 200"
    assert exit_meaning("exited", 78, "exit-code") == exits.meaning(78)
    assert exit_meaning("exited", 9, "exit-code") == exits.meaning(9)  # a status, not a signal


def test_a_units_properties_are_read_as_systemctl_show_prints_them() -> None:
    from wcached.cli.status import UnitInfo, _unit

    block = (
        "Id=wcached@GPU-1.service\nActiveState=activating\nSubState=auto-restart\nResult=exit-code\n"
        "StatusText=failed: key=value in the journal\nExecMainCode=1\nExecMainStatus=75\n"
    )
    assert _unit(block) == UnitInfo(
        unit="wcached@GPU-1.service",
        instance="GPU-1",
        active_state="activating",
        sub_state="auto-restart",
        result="exit-code",
        status_text="failed: key=value in the journal",
        exit_code="exited",
        exit_status=75,
    )
    for code, said in (("2", "killed"), ("3", "dumped"), ("0", "0"), ("", "")):
        u = _unit(f"Id=wcached@0.service\nExecMainCode={code}\nExecMainStatus=9")
        assert u is not None and (u.exit_code, u.exit_status) == (said, 9), code
    bare = _unit("Id=wcached@0.service")
    assert bare == UnitInfo(
        unit="wcached@0.service",
        instance="0",
        active_state="",
        sub_state="",
        result="",
        status_text="",
        exit_code="",
        exit_status=None,
    )
    assert _unit("Id=wcached@0.service\nExecMainStatus=-1").exit_status is None
    assert _unit("Id=other@0.service") is None
    assert _unit("Id=wcached@0.socket") is None
    assert _unit("ActiveState=active") is None


def test_units_are_listed_then_shown_in_one_call_each() -> None:
    from wcached.cli.status import UNIT_PATTERN, systemd_units

    calls: list[list[str]] = []

    def systemctl(args):
        calls.append(list(args))
        if args[0] == "list-units":
            return "wcached@1.service loaded active running x\n\nwcached@0.service loaded failed failed y\n"
        return (
            "Id=wcached@0.service\nActiveState=failed\n\n"
            "Id=unrelated.service\nActiveState=active\n\n"
            "Id=wcached@1.service\nActiveState=active\n"
        )

    units = systemd_units(systemctl)
    assert [(u.unit, u.active_state) for u in units] == [
        ("wcached@0.service", "failed"),
        ("wcached@1.service", "active"),
    ]
    assert calls == [
        ["list-units", "--all", "--plain", "--no-legend", "--no-pager", UNIT_PATTERN],
        [
            "show",
            "--no-pager",
            "--property=Id,ActiveState,SubState,Result,StatusText,ExecMainCode,ExecMainStatus",
            "wcached@0.service",
            "wcached@1.service",
        ],
    ]
    calls.clear()
    assert systemd_units(lambda args: calls.append(list(args)) or " \n") == []
    assert len(calls) == 1  # nothing listed: nothing shown

    def broken(args):
        raise subprocess.TimeoutExpired(["systemctl"], 10)

    assert systemd_units(broken) == []

    def gone(args):
        raise FileNotFoundError("systemctl")

    assert systemd_units(gone) == []


def test_without_systemd_no_unit_is_asked_for(monkeypatch) -> None:
    import shutil

    from wcached.cli import status

    asked: list[list[str]] = []
    monkeypatch.setattr(status, "_systemctl", lambda args: asked.append(list(args)) or "")
    systemd_booted = {"/run/systemd/system": True}
    monkeypatch.setattr(os.path, "isdir", lambda p: systemd_booted.get(p, False))
    monkeypatch.setattr(shutil, "which", lambda name: None)  # no systemctl installed
    assert status.systemd_units() == [] and asked == []
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/systemctl" if name == "systemctl" else None)
    systemd_booted["/run/systemd/system"] = False  # installed, not booted with it (a container)
    assert status.systemd_units() == [] and asked == []
    systemd_booted["/run/systemd/system"] = True
    assert status.systemd_units() == [] and asked[0][0] == "list-units"


def test_systemctl_is_run_with_a_timeout_and_its_failure_is_no_output(monkeypatch) -> None:
    from wcached.cli import status

    runs = []

    def run(argv, **kwargs):
        runs.append((argv, kwargs))
        return subprocess.CompletedProcess(argv, 1 if "fail" in argv else 0, stdout="out\n", stderr="err")

    monkeypatch.setattr(subprocess, "run", run)
    assert status._systemctl(["show", "x"]) == "out\n"
    assert status._systemctl(["fail"]) == ""
    assert runs[0] == (["systemctl", "show", "x"], {"capture_output": True, "text": True, "timeout": 10})


@pytest.mark.parametrize(
    ("active", "sub", "text", "seen", "state"),
    [
        ("failed", "failed", "", True, "failed"),
        ("inactive", "dead", "", True, "stopped"),
        ("deactivating", "stop-sigterm", "", True, "stopping"),
        ("activating", "auto-restart", "filling default", True, "restarting"),
        ("activating", "start", "filling default: 40%", True, "filling"),
        ("activating", "start", "starting", True, "starting"),
        ("activating", "start", "", True, "starting"),
        ("active", "running", "serving 1 model(s)", True, "down"),
        ("active", "running", "serving 1 model(s)", False, "unknown"),
        ("maintenance", "x", "", True, "down"),
        ("reloading", "x", "", False, "down"),
    ],
)
def test_a_units_state_without_an_answering_daemon(
    active: str, sub: str, text: str, seen: bool, state: str
) -> None:
    from wcached.cli.status import _unit_view

    view = _unit_view(_unit("GPU-9", active, sub, text=text), "GPU-9", sockets_seen=seen)
    assert view.state == state
    assert (view.instance, view.instance_id, view.gpu_uuid) == ("GPU-9", "GPU-9", "GPU-9")
    assert (view.unit, view.unit_state, view.unit_status) == (
        "wcached@GPU-9.service",
        f"{active}/{sub}",
        text,
    )
    assert (view.exit_status, view.exit_meaning) == (None, "")


def test_a_unit_view_carries_how_its_last_run_ended_unless_it_succeeded() -> None:
    from wcached.cli.status import _unit_view

    cpu = _unit_view(_unit("cpu1", "activating", "auto-restart", "exit-code", 75), "cpu1")
    assert (cpu.gpu_uuid, cpu.exit_status) == ("", 75)
    assert cpu.exit_meaning.startswith("out of device or host memory") and cpu.exit_meaning.endswith(
        "(retried)"
    )
    for result in ("", "success"):
        ok = _unit_view(_unit("cpu1", "inactive", "dead", result, 0), "cpu1")
        assert (ok.exit_status, ok.exit_meaning) == (None, ""), result


@pytest.mark.parametrize(
    ("states", "unknown"),
    [
        ((), False),
        (("unknown",), True),
        (("unknown", "serving"), True),
        (("serving", "serving"), False),
        (("unknown", "down"), False),
        (("unknown", "failed"), False),
    ],
)
def test_unknown_only_where_nothing_known_is_wrong(states: tuple[str, ...], unknown: bool) -> None:
    from wcached.cli.status import InstanceView, any_unknown

    views = [InstanceView(instance=f"cpu{i}", instance_id=f"cpu{i}", state=s) for i, s in enumerate(states)]
    assert any_unknown(views) is unknown


def test_an_instances_notes_say_progress_failure_error_memory_and_clients() -> None:
    """Under the table: a starting, filling or restarting unit's progress
    (not a serving one's); a failed run's meaning with the unit to read in
    the journal (its name made from the instance where no unit was seen);
    why a socket did not answer; what the weights take of the GPU; and each
    client, named or not, with what it holds."""
    from wcached.cli.status import InstanceView, _notes, memory_note
    from wcached.protocol.messages import ClientStatus

    for state in ("starting", "filling", "restarting"):
        v = InstanceView(instance="cpu1", instance_id="cpu1", state=state, unit_status="filling a: 40%")
        assert _notes(v) == ["cpu1: filling a: 40%"], state
    assert (
        _notes(InstanceView(instance="cpu1", instance_id="cpu1", state="serving", unit_status="serving"))
        == []
    )
    failed = InstanceView(
        instance="cpu1", instance_id="cpu1", state="failed", exit_status=78, exit_meaning="a mistake"
    )
    assert _notes(failed) == ["cpu1: exit status 78: a mistake; journalctl -u wcached@cpu1 -e"]
    down = InstanceView(instance="cpu1", instance_id="cpu1", state="down", error="connection refused")
    assert _notes(down) == ["cpu1: connection refused"]
    gpu = InstanceView(
        instance="0",
        instance_id="GPU-1",
        state="serving",
        device_memory_bytes=100 << 30,
        models=[_model_status("a", 10 << 30)],
        clients=[
            ClientStatus(pid=5, uid=1000, gid=1000, client="", models=[], connected_s=5),
            ClientStatus(pid=6, uid=0, gid=0, client="vllm", models=["a", "b"], connected_s=61),
        ],
    )
    assert _notes(gpu) == [
        memory_note(gpu),
        "0: pid 5 uid 1000 (client) attached to nothing yet for 5s",
        "0: pid 6 uid 0 (vllm) attached to a, b for 1m01s",
    ]
    assert memory_note(gpu).startswith("0: weights take 10.0 GiB = 10.0% of the GPU's 100.0 GiB")


def _model_status(name: str, nbytes: int):
    from wcached.keys import CacheKey
    from wcached.protocol.messages import ModelStatus

    key = CacheKey(model=name, loader="safetensors", fingerprint="f", dtype="auto")
    return ModelStatus(
        name=name,
        state="ready",
        loader="safetensors",
        bytes=nbytes,
        tensors=1,
        segments=1,
        key=key,
        filled_at=0.0,
        fill_seconds=1.0,
    )


def test_a_unit_killed_by_a_signal_says_the_signal_and_running_units_are_down_by_default() -> None:
    import msgspec

    from wcached.cli.status import _unit_view

    killed = msgspec.structs.replace(
        _unit("cpu1", "activating", "auto-restart", "signal", 9), exit_code="killed"
    )
    view = _unit_view(killed, "cpu1")
    assert (view.exit_status, view.exit_meaning) == (9, "killed by SIGKILL (out of memory?)")
    assert _unit_view(_unit("cpu1", "active", "running"), "cpu1").state == "down"


def test_the_table_row_by_row() -> None:
    """One row per model (the instance's cells on its first), "-" where an
    instance has no model or did not answer, a released model's own state,
    "unknown (no access)" spelled out, clients counted per model, columns as
    wide as their widest cell, and notes after a blank line only if any."""
    import msgspec

    from wcached.cli.status import InstanceView, table
    from wcached.protocol.messages import ClientStatus

    released = msgspec.structs.replace(_model_status("old", 3 << 30), state="released")
    views = [
        InstanceView(
            instance="cpu0",
            instance_id="cpu0",
            state="serving",
            device="host memory",
            pid=42,
            uptime_s=3661,
            models=[_model_status("a", 2 << 30), released],
            clients=[ClientStatus(pid=7, uid=0, gid=0, client="vllm", models=["a"], connected_s=5)],
        ),
        InstanceView(instance="1", instance_id="GPU-1", gpu_uuid="GPU-1", state="unknown"),
        InstanceView(instance="cpu2", instance_id="cpu2", state="down"),
    ]
    assert table(views).split("\n") == [
        "INSTANCE  STATE                DEVICE       GPU UUID  MODEL  SIZE     TENSORS  CLIENTS  "
        "LAST FILL         UPTIME  PID",
        "cpu0      serving              host memory  -         a      2.0 GiB  1        1        "
        "1.0 s, 2.15 GB/s  1h01m   42",
        "          released                                    old    3.0 GiB  1        0        "
        "1.0 s, 3.22 GB/s",
        "1         unknown (no access)  -            GPU-1     -      -        -        -        "
        "-                 -       -",
        "cpu2      down                 -            -         -      -        -        -        "
        "-                 -       -",
        "",
        "cpu0: pid 7 uid 0 (vllm) attached to a for 5s",
    ]
    assert table(views[1:]).split("\n")[-1] == (
        "cpu2      down                 -       -         -      -     -        -        -          -       -"
    )


def _answering(reply):
    """A fake daemon's answer to status: ``reply`` as it is."""
    return lambda chan: chan.send(reply)


def _status_reply(**fields):
    from wcached.protocol.messages import StatusReply

    values = dict(
        instance="cpu0",
        device="host memory",
        backend="host",
        state="serving",
        pid=42,
        daemon_version="9.9",
        uptime_s=5.0,
        models=[],
        clients=[],
    )
    values.update(fields)
    return StatusReply(**values)


def test_a_gpu_daemons_answer_is_shown_by_its_index_and_uuid(work: Path) -> None:
    """What a daemon answers is what status shows: a GPU instance under the
    index it reports (GPU 0 included; its UUID where it reports none), its
    UUID as id and GPU UUID, its version and memory; host memory has no GPU
    UUID."""
    from tests.client.test_untrusted_daemon import _fake_daemon, _manifest
    from wcached.cli.status import gather

    nothing = _manifest(0, [])
    cases = [
        (dict(backend="cuda", instance="GPU-abc", device="NVIDIA H200", device_index=0), ("0", "GPU-abc")),
        (dict(backend="cuda", instance="GPU-abc", device="NVIDIA H200", device_index=1), ("1", "GPU-abc")),
        (dict(backend="cuda", instance="GPU-abc", device="NVIDIA H200"), ("GPU-abc", "GPU-abc")),
        (dict(backend="host", instance="cpu3", device_index=3), ("cpu3", "")),
    ]
    for i, (fields, (instance, uuid)) in enumerate(cases):
        sdir = work / f"d{i}"
        reply = _status_reply(device_memory_bytes=7 << 30, **fields)
        with _fake_daemon(sdir, lambda: -1, nothing, answer=_answering(reply)):
            (view,) = gather(str(sdir), None, 5.0, units=[])
        assert (view.instance, view.instance_id, view.gpu_uuid) == (instance, reply.instance, uuid), fields
        assert (view.state, view.device, view.pid, view.daemon_version) == (
            "serving",
            reply.device,
            42,
            "9.9",
        )
        assert (view.uptime_s, view.device_memory_bytes, view.error) == (5.0, 7 << 30, "")


def test_one_instance_asked_by_name_and_a_name_that_is_none(work: Path) -> None:
    """``wcached status cpu0`` asks that socket in the socket directory; a
    name that names no instance is down with why."""
    from tests.client.test_untrusted_daemon import _fake_daemon, _manifest
    from wcached.cli.status import gather

    with _fake_daemon(work / "d", lambda: -1, _manifest(0, []), answer=_answering(_status_reply())):
        (view,) = gather(str(work / "d"), "cpu0", 5.0, units=[])
    assert (view.instance, view.state, view.pid) == ("cpu0", "serving", 42)
    (bad,) = gather(str(work / "d"), "not-an-instance", 5.0, units=[])
    assert (bad.instance, bad.instance_id, bad.state) == ("not-an-instance", "not-an-instance", "down")
    assert bad.error.startswith("instance 'not-an-instance' is not a device: use cpuN"), bad.error


def test_a_daemon_that_refuses_this_user_is_unknown_not_down(work: Path) -> None:
    from tests.client.test_untrusted_daemon import _fake_daemon, _manifest
    from wcached.cli.status import gather
    from wcached.protocol.messages import ErrorReply

    refused = ErrorReply(code="permission_denied", message="uid 1000 may not ask")
    with _fake_daemon(work / "d", lambda: -1, _manifest(0, []), answer=_answering(refused)):
        (view,) = gather(str(work / "d"), None, 5.0, units=[])
    assert (view.instance, view.state, view.error) == ("cpu0", "unknown", "uid 1000 may not ask")


def test_units_without_a_daemon_stopped_ones_left_out_and_unasked_ones_unknown(monkeypatch) -> None:
    """Units whose daemon did not answer get views of their own, except one
    stopped on purpose (every other unit after it still shown); where the
    sockets could not be listed, a running unit is unknown, not down; a unit
    named by a GPU index joins the daemon that reports only its UUID."""
    from wcached.cli import status
    from wcached.cli.status import InstanceView, _with_units

    units = [
        _unit("cpu5", "inactive", "dead"),
        _unit("cpu6", "failed", "failed", "exit-code", 78),
        _unit("cpu7", "active", "running", text="serving 1 model(s)"),
    ]
    views = _with_units([], units, None, sockets_seen=False)
    assert [(v.instance, v.state) for v in views] == [("cpu6", "failed"), ("cpu7", "unknown")]
    monkeypatch.setattr(status, "canonical_instance", lambda name: {"0": "GPU-abc"}.get(name, name))
    daemon = InstanceView(instance="GPU-abc", instance_id="GPU-abc", state="serving", pid=9)
    (joined,) = _with_units([daemon], [_unit("0", "active", "running", text="serving")], None)
    assert (joined.instance, joined.instance_id, joined.pid, joined.unit) == (
        "0",
        "GPU-abc",
        9,
        "wcached@0.service",
    )


def test_a_daemon_that_answers_is_shown_as_it_answers_whatever_its_unit_does() -> None:
    """A unit stopping while its daemon still answers: the daemon's own state
    and models stay; only a daemon that did not answer is shown as its unit."""
    from wcached.cli.status import InstanceView, _with_units

    answering = InstanceView(instance="cpu1", instance_id="cpu1", state="serving", pid=9)
    (view,) = _with_units([answering], [_unit("cpu1", "deactivating", "stop-sigterm")], None)
    assert (view.state, view.pid, view.unit_state) == ("serving", 9, "deactivating/stop-sigterm")


def test_a_socket_directory_this_user_cannot_list_leaves_running_units_unknown(work: Path) -> None:
    from wcached.cli.status import gather

    units = [_unit("cpu7", "active", "running", text="serving 1 model(s)")]
    (view,) = gather(str(work), None, 1.0, units=units, list_sockets=False)
    assert (view.instance, view.state) == ("cpu7", "unknown")
    (view,) = gather(str(work), None, 1.0, units=units, list_sockets=True)
    assert (view.instance, view.state) == ("cpu7", "down")


def test_a_running_unit_whose_daemon_refuses_this_user_stays_unknown() -> None:
    """Refused is not down: a running unit does not turn a daemon that said
    "not you" into a dead one, and its error stays."""
    from wcached.cli.status import InstanceView, _with_units

    refused = InstanceView(instance="cpu1", instance_id="cpu1", state="unknown", error="uid 1000 may not ask")
    (view,) = _with_units([refused], [_unit("cpu1", "active", "running", text="serving")], None)
    assert (view.state, view.error, view.unit) == ("unknown", "uid 1000 may not ask", "wcached@cpu1.service")
