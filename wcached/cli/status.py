"""``wcached status``: every instance in one view, from its socket and its unit.

A serving daemon answers a status request over its socket. An instance that
has no socket yet (filling) or no more (failed, restarting) is known only to
systemd: its ``wcached@N.service`` unit says what it is doing (the status text
the daemon sent, e.g. fill progress) or how it ended (the exit status, whose
meaning is the table below). The two are merged per instance into
:class:`InstanceView`, which is also what ``--json`` prints; its JSON Schema
(``wcached status --json-schema``) is the documented format.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence
from typing import Annotated, Literal

import msgspec

from wcached import exits
from wcached.errors import PermissionRefused, WcacheError
from wcached.loaders.layout import reading_rate
from wcached.protocol.messages import ClientStatus, ModelStatus

UNIT_PATTERN = "wcached@*.service"

# How a unit's last run ended (its Result=), where that says more than the
# exit status: systemd killed it, or will not start it again.
RESULT_MEANINGS = {
    "timeout": "did not become ready within its start timeout (a fill that stopped progressing?)",
    "watchdog": "killed by the watchdog: its main loop stalled",
    "start-limit-hit": "started too often in 10 minutes, systemd gave up: systemctl reset-failed {unit}",
    "oom-kill": "killed by the kernel's out-of-memory killer",
    "resources": "systemd could not set up its sandbox (a ReadWritePaths= directory that does not exist?)",
    "core-dump": "crashed (core dumped)",
}


State = Literal[
    "serving", "stopping", "filling", "starting", "restarting", "failed", "stopped", "down", "unknown"
]


def _doc(text: str) -> msgspec.Meta:
    return msgspec.Meta(description=text)


class InstanceView(msgspec.Struct, kw_only=True):
    """One instance as ``wcached status --json`` prints it."""

    instance: Annotated[
        str, _doc('as its unit names it ("0", "cpu0"), else the GPU index or the host-memory instance')
    ]
    instance_id: Annotated[str, _doc('canonical: "cpu0" or "GPU-<uuid>"; the socket is <instance_id>.sock')]
    state: Annotated[
        State,
        _doc(
            "serving or stopping (the daemon answered); filling, starting, restarting, failed or "
            "stopped (from its systemd unit); down (a socket or running unit that did not answer); "
            "unknown (this user may not ask the daemon: its socket or its peer check refused)"
        ),
    ]
    device: Annotated[str, _doc('"NVIDIA H200", "host memory"; empty when the daemon did not answer')] = ""
    gpu_uuid: Annotated[str, _doc('"GPU-<uuid>" for a GPU instance, empty for host memory')] = ""
    pid: Annotated[int, _doc("the daemon's pid; 0 when it did not answer")] = 0
    daemon_version: str = ""
    uptime_s: Annotated[float, _doc("seconds since the daemon started")] = 0.0
    device_memory_bytes: Annotated[int, _doc("the GPU's memory; 0 for host memory")] = 0
    models: Annotated[
        list[ModelStatus],
        _doc(
            "what it holds: bytes, tensors, segments, key, fill_seconds (of the fill that made the "
            'segments), origin ("filled" from the checkpoint by this daemon process, or "restored" '
            "from systemd's fd store), phases (the fill's seconds per phase; \"read\" is its reading "
            "of the checkpoint) and read_bytes (the checkpoint bytes read, which the LAST FILL rate "
            "is over)"
        ),
    ] = []
    clients: Annotated[list[ClientStatus], _doc("attached clients (leases); a status query is not one")] = []
    unit: Annotated[str, _doc('"wcached@0.service"; empty without a loaded unit')] = ""
    unit_state: Annotated[str, _doc('systemd\'s ActiveState/SubState, e.g. "active/running"')] = ""
    unit_status: Annotated[str, _doc("the daemon's last STATUS= (fill progress while filling)")] = ""
    exit_status: Annotated[int | None, _doc("the last run's exit status (or signal), when it failed")] = None
    exit_meaning: Annotated[str, _doc("what that exit status means, and whether systemd retries it")] = ""
    error: Annotated[str, _doc("why the socket did not answer")] = ""


StatusList = list[InstanceView]


def json_schema() -> dict:
    """The JSON Schema of ``wcached status --json``."""
    return msgspec.json.schema(StatusList)


# -- systemd ----------------------------------------------------------------

_SHOW = ("Id", "ActiveState", "SubState", "Result", "StatusText", "ExecMainCode", "ExecMainStatus")


class UnitInfo(msgspec.Struct, kw_only=True):
    unit: str
    instance: str  # what follows "wcached@"
    active_state: str
    sub_state: str
    result: str
    status_text: str
    exit_code: str  # ExecMainCode: exited, killed, dumped
    exit_status: int | None


Runner = Callable[[Sequence[str]], str]


def _systemctl(args: Sequence[str]) -> str:
    r = subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=10)
    return r.stdout if r.returncode == 0 else ""


def systemd_units(run: Runner | None = None) -> list[UnitInfo]:
    """The loaded ``wcached@`` units; none where there is no systemd."""
    if run is None:
        if shutil.which("systemctl") is None or not os.path.isdir("/run/systemd/system"):
            return []
        run = _systemctl
    try:
        listed = run(["list-units", "--all", "--plain", "--no-legend", "--no-pager", UNIT_PATTERN])
        names = sorted({line.split()[0] for line in listed.splitlines() if line.strip()})
        if not names:
            return []
        shown = run(["show", "--no-pager", "--property=" + ",".join(_SHOW), *names])
    except (OSError, subprocess.SubprocessError):
        return []
    return [u for block in shown.split("\n\n") if (u := _unit(block)) is not None]


def _unit(block: str) -> UnitInfo | None:
    props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
    unit = props.get("Id", "")
    if not unit.startswith("wcached@") or not unit.endswith(".service"):
        return None
    code = props.get("ExecMainCode", "")
    status = props.get("ExecMainStatus", "")
    return UnitInfo(
        unit=unit,
        instance=unit[len("wcached@") : -len(".service")],
        active_state=props.get("ActiveState", ""),
        sub_state=props.get("SubState", ""),
        result=props.get("Result", ""),
        status_text=props.get("StatusText", ""),
        # ExecMainCode is CLD_EXITED (1), CLD_KILLED (2) or CLD_DUMPED (3).
        exit_code={"1": "exited", "2": "killed", "3": "dumped"}.get(code, code),
        exit_status=int(status) if status.isdigit() else None,
    )


def exit_meaning(code: str, status: int | None, result: str = "", unit: str = "") -> str:
    """What the way a run ended means: systemd's Result= where it says more,
    else the exit status or the signal."""
    if result in RESULT_MEANINGS:
        return RESULT_MEANINGS[result].format(unit=unit or "the unit")
    if status is None:
        return ""
    if code in ("killed", "dumped"):
        import signal

        try:
            name = signal.Signals(status).name
        except ValueError:
            name = f"signal {status}"
        return f"killed by {name}" + (" (out of memory?)" if name == "SIGKILL" else "")
    return exits.meaning(status)


def _unit_view(u: UnitInfo, instance_id: str, sockets_seen: bool = True) -> InstanceView:
    """``sockets_seen``: False when this user cannot list the socket
    directory, so a running unit's daemon could not be asked at all."""
    state = {"failed": "failed", "inactive": "stopped", "deactivating": "stopping"}.get(u.active_state, "")
    if u.active_state == "activating":
        if u.sub_state == "auto-restart":
            state = "restarting"
        elif u.status_text.startswith("filling"):
            state = "filling"
        else:
            state = "starting"
    elif u.active_state == "active":
        # Running, yet its socket did not answer; or never asked: unknown.
        state = "down" if sockets_seen else "unknown"
    view = InstanceView(
        instance=u.instance,
        instance_id=instance_id,
        state=state or "down",  # a state this release does not know (maintenance, ...)
        gpu_uuid=instance_id if instance_id.startswith("GPU-") else "",
        unit=u.unit,
        unit_state=f"{u.active_state}/{u.sub_state}",
        unit_status=u.status_text,
    )
    # A run that ended badly: what it means (also while the unit waits to
    # restart it).
    if u.result not in ("", "success"):
        view.exit_status = u.exit_status
        view.exit_meaning = exit_meaning(u.exit_code, u.exit_status, u.result, u.unit)
    return view


def canonical_instance(name: str) -> str:
    """The instance id a unit's instance name stands for ("0" -> "GPU-...")."""
    from wcached.device import instance_id_for

    try:
        return instance_id_for(name)
    except (WcacheError, OSError, ValueError):
        return name


# -- gathering ---------------------------------------------------------------


def gather(
    socket_dir: str,
    only: str | None,
    timeout: float,
    units: list[UnitInfo] | None = None,
    list_sockets: bool = True,
) -> list[InstanceView]:
    """Every instance with a socket in ``socket_dir`` (unless
    ``list_sockets`` is off: a directory this user cannot list) or a loaded
    unit, or just ``only``; each asked over its socket where it has one."""
    from wcached.client.connection import DaemonConnection
    from wcached.device import instance_id_for

    units = systemd_units() if units is None else units
    resolve_error = ""
    if only:
        try:
            wanted = instance_id_for(only)
        except WcacheError as e:
            wanted, resolve_error = only, str(e)
        targets = [(wanted, os.path.join(socket_dir, f"{wanted}.sock"))]
    elif list_sockets:
        paths = sorted(glob.glob(os.path.join(socket_dir, "*.sock")))
        targets = [(os.path.basename(p)[: -len(".sock")], p) for p in paths]
    else:
        targets = []
    views: list[InstanceView] = []
    for instance_id, path in targets:
        try:
            with DaemonConnection(path, timeout=timeout, client="wcached status") as conn:
                reply = conn.status()
        except (WcacheError, OSError) as e:
            # Refused is not down: the daemon may serve others all the same.
            state = "unknown" if isinstance(e, (PermissionRefused, PermissionError)) else "down"
            view = InstanceView(instance=only or instance_id, instance_id=instance_id, state=state)
            view.error = resolve_error or str(e)
            views.append(view)
            continue
        cuda = reply.backend == "cuda"
        views.append(
            InstanceView(
                instance=str(reply.device_index) if cuda and reply.device_index >= 0 else reply.instance,
                instance_id=reply.instance,
                state=reply.state,
                device=reply.device,
                gpu_uuid=reply.instance if cuda else "",
                pid=reply.pid,
                daemon_version=reply.daemon_version,
                uptime_s=reply.uptime_s,
                device_memory_bytes=reply.device_memory_bytes,
                models=reply.models,
                clients=reply.clients,
            )
        )
    return _with_units(views, units, only, sockets_seen=list_sockets or bool(only))


def _with_units(
    views: list[InstanceView], units: list[UnitInfo], only: str | None, sockets_seen: bool = True
) -> list[InstanceView]:
    """Each unit joined to its instance's view, matched by name first (a
    daemon says its index and id, so no NVML is needed for those); a unit
    without one gets a view of its own, as does a second unit of a device
    (two daemons for one GPU: one of them cannot take its lock)."""
    merged: set[int] = set()
    extra: list[InstanceView] = []
    wanted = {only, canonical_instance(only)} if only else set()
    for u in units:
        names = {u.instance}
        match = next((i for i, v in enumerate(views) if {v.instance, v.instance_id} & names), None)
        if match is None:
            names.add(canonical_instance(u.instance))
            match = next((i for i, v in enumerate(views) if {v.instance, v.instance_id} & names), None)
        if only and match is None and not (wanted & names):
            continue
        if match is None or match in merged:
            if not only and u.active_state == "inactive" and u.result == "success":
                continue  # stopped on purpose: not news, unless asked for by name
            extra.append(_unit_view(u, canonical_instance(u.instance), sockets_seen))
            continue
        merged.add(match)
        v = views[match]
        v.instance = u.instance
        v.unit, v.unit_state, v.unit_status = u.unit, f"{u.active_state}/{u.sub_state}", u.status_text
        if v.error and u.active_state != "active":
            # A socket left by a run that ended: the unit says what happens now.
            unit_view = _unit_view(u, v.instance_id)
            unit_view.error = v.error
            views[match] = unit_view
    return views + sorted(extra, key=lambda v: v.instance)


def all_serving(views: list[InstanceView]) -> bool:
    return bool(views) and all(v.state == "serving" for v in views)


def any_unknown(views: list[InstanceView]) -> bool:
    """Some instance this user may not ask, and none known to be down."""
    return any(v.state == "unknown" for v in views) and all(v.state in ("serving", "unknown") for v in views)


# -- the table -----------------------------------------------------------------


def table(views: list[InstanceView]) -> str:
    head = ("INSTANCE", "STATE", "DEVICE", "GPU UUID", "MODEL", "SIZE", "TENSORS", "CLIENTS")
    head += ("LAST FILL", "UPTIME", "PID")
    rows: list[tuple[str, ...]] = [head]
    notes: list[str] = []
    for v in views:
        uuid = v.gpu_uuid or "-"
        device = v.device or "-"
        models: list[ModelStatus | None] = list(v.models) or [None]
        for i, m in enumerate(models):
            first = i == 0
            state = ("unknown (no access)" if v.state == "unknown" else v.state) if first else ""
            if m is not None and m.state != "ready":
                state = m.state
            rows.append(
                (
                    v.instance if first else "",
                    state,
                    device if first else "",
                    uuid if first else "",
                    m.name if m else "-",
                    size(m.bytes) if m else "-",
                    str(m.tensors) if m else "-",
                    str(sum(1 for c in v.clients if m and m.name in c.models)) if m else "-",
                    last_fill(m) if m else "-",
                    duration(v.uptime_s) if first and v.pid else ("-" if first else ""),
                    str(v.pid) if first and v.pid else ("-" if first else ""),
                )
            )
        notes += _notes(v)
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines + (["", *notes] if notes else []))


def _notes(v: InstanceView) -> list[str]:
    notes = []
    # A failed run's last word is given under its exit status, below.
    if v.state in ("filling", "starting", "restarting") and v.unit_status and not v.exit_meaning:
        notes.append(f"{v.instance}: {v.unit_status}")
    if v.exit_meaning:
        ran = "last run " if v.state == "restarting" else ""
        how = f"exit status {v.exit_status}: " if v.exit_status is not None else ""
        notes.append(
            f"{v.instance}: {ran}{how}{v.exit_meaning}; journalctl -u {v.unit or 'wcached@' + v.instance} -e"
        )
        if v.unit_status.startswith("failed: "):
            notes.append(f"{v.instance}: {v.unit_status}")  # the daemon's own last word
    if v.error:
        notes.append(f"{v.instance}: {v.error}")
    note = memory_note(v)
    if note:
        notes.append(note)
    for c in v.clients:
        what = ", ".join(c.models) or "nothing yet"
        notes.append(
            f"{v.instance}: pid {c.pid} uid {c.uid} ({c.client or 'client'}) "
            f"attached to {what} for {duration(c.connected_s)}"
        )
    return notes


def last_fill(m: ModelStatus) -> str:
    """How long the fill took and how fast it went; restored: no checkpoint
    read this time, and the fill that made the segments."""
    took = f"{m.fill_seconds:.1f} s"
    if m.origin == "restored":
        return f"restored ({took} fill)"
    reading = reading_rate(m.phases, m.read_bytes)
    if reading is not None:
        return f"{took}, reading {reading[0]:.1f} s at {reading[1]:.2f} GB/s"
    rate = m.bytes / 1e9 / m.fill_seconds if m.fill_seconds > 0 else 0.0
    return f"{took}, {rate:.2f} GB/s"


def memory_note(v: InstanceView) -> str:
    """What the weights take of the GPU, and what that means for engines whose
    vLLM cannot count memory it maps from another process."""
    total = v.device_memory_bytes
    held = sum(m.bytes for m in v.models if m.state == "ready")
    if not total or not held:
        return ""
    share = held / total
    return (
        f"{v.instance}: weights take {size(held)} = {100 * share:.1f}% of the GPU's {size(total)}; "
        f"vLLM engines without the external-weight hook (0.26, 0.27) should lower "
        f"gpu_memory_utilization by {share:.3f}"
    )


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def duration(s: float) -> str:
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
