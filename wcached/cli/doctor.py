"""``wcached doctor [INSTANCE]``: what this host lacks to run wcached, and how to fix it.

Every check prints one line, ``ok``, ``warn``, ``FAIL`` or ``info``; each
problem is followed by the command that fixes it, chosen for that problem (a
truncated file is not fixed by putting a checkpoint in place, a custom socket
directory not by the package's tmpfiles line). Exit status 1 if anything failed.
"""

from __future__ import annotations

import errno
import glob
import grp
import importlib
import os
import pwd
import re
import shlex
import socket
import stat
import subprocess
import sys
from dataclasses import dataclass, field

from wcached import defaults, exits
from wcached.daemon import socket_dir
from wcached.device import nvml_text
from wcached.errors import (
    CheckpointCorrupt,
    CheckpointMissing,
    CheckpointUnreadable,
    ConfigError,
    FillMisconfigured,
    WcacheError,
)

DAEMON_USER = defaults.DAEMON_USER


@dataclass
class Report:
    lines: list[str] = field(default_factory=list)
    failed: int = 0

    def ok(self, what: str) -> None:
        self.lines.append(f"ok    {what}")

    def info(self, what: str) -> None:
        self.lines.append(f"info  {what}")

    def warn(self, what: str, fix: str = "") -> None:
        self.lines.append(f"warn  {what}" + (f"\n      fix: {fix}" if fix else ""))

    def fail(self, what: str, fix: str) -> None:
        self.failed += 1
        self.lines.append(f"FAIL  {what}\n      fix: {fix}")


def _module(name: str) -> tuple[object | None, str]:
    try:
        mod = importlib.import_module(name)
    except Exception as e:  # any import failure is worth reporting as is
        return None, f"{type(e).__name__}: {e}"
    return mod, getattr(mod, "__version__", getattr(mod, "VERSION", ""))


def _pip(pkg: str) -> str:
    return f"{sys.executable} -m pip install '{pkg}'"


# What the daemon imports: module, Debian package, PyPI requirement.
REQUIRED = (
    ("msgspec", "python3-msgspec", "msgspec"),
    ("xxhash", "python3-xxhash", "xxhash"),
    ("tqdm", "python3-tqdm", "tqdm"),
    ("prometheus_client", "python3-prometheus-client", "prometheus-client"),
)


def check_python(r: Report) -> None:
    r.ok(f"python {sys.version.split()[0]} at {sys.executable}")
    for mod, deb, pip in REQUIRED:
        m, detail = _module(mod)
        if m is None:
            in_package = sys.executable.startswith("/usr/bin/")
            r.fail(
                f"{mod} cannot be imported ({detail})",
                f"apt install {deb}" if in_package else f"{_pip(pip)} (or apt install {deb})",
            )
        else:
            # The installed distribution's version (what pip or apt put
            # there); a module's own attribute can lag behind it (xxhash's
            # VERSION named 3.0.0 with 3.2.0 installed).
            r.ok(f"{mod} {_distribution_version(pip) or detail}")


def _distribution_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return ""


def check_config(r: Report, path: str | None):
    from wcached.config import load_config

    try:
        cfg = load_config(path)
    except WcacheError as e:
        r.fail(f"config: {e}", f"edit {path or defaults.config_path()}, then: wcached check-config")
        return None
    r.ok(f"config {cfg.source}: {len(cfg.model)} model(s)")
    return cfg


def _models_of(r: Report, cfg, instance: str | None) -> list:
    if instance is None:
        return list(cfg.model)
    from wcached.config import instance_settings
    from wcached.device import resolve_instance

    try:
        device = resolve_instance(instance)
        return list(instance_settings(cfg, device.instance_id, (instance, *device.aliases)).models)
    except WcacheError as e:
        r.fail(
            f"instance {instance}: {e}",
            "name an instance as its unit does: 0 (a GPU index), GPU-<uuid>, cpuN",
        )
        return list(cfg.model)


def check_models(r: Report, cfg, models: list) -> None:
    """Each model's checkpoint as this user sees it: readable (serve's own
    check, in its words), and for the safetensors loader its headers."""
    from wcached.daemon.filler import check_checkpoint_path
    from wcached.loaders.checkpoint import Checkpoint

    for i, m in enumerate(models):
        key = f"model[{cfg.model.index(m) if m in cfg.model else i}].path in {cfg.source}"
        try:
            check_checkpoint_path(m, cfg.source)
            if m.loader != "safetensors":
                where = "from its hub cache" if Checkpoint.of(m).is_hub_id else f"from {m.path}"
                r.info(f"model {m.name}: {m.loader} loads it {where} (its tensors are checked when filling)")
                continue
            ckpt = Checkpoint(m.path).headers()
        except WcacheError as e:
            r.fail(f"model {m.name}: {e}", _checkpoint_fix(e, m.path, key))
            continue
        size = sum(t.nbytes for t in ckpt.tensors)
        files = len(ckpt.files)
        r.ok(f"model {m.name}: {len(ckpt.tensors)} tensors, {size / 2**30:.2f} GiB in {files} file(s)")


def _checkpoint_fix(e: WcacheError, path: str, key: str) -> str:
    """The fix that fits what is wrong with a checkpoint (by the error's kind)."""
    if isinstance(e, CheckpointMissing):
        return f"put the checkpoint at {path}, or fix {key} (is its filesystem mounted? findmnt -T {path})"
    # serve's path check says "unreadable" as a ConfigError naming the key.
    if isinstance(e, CheckpointUnreadable | ConfigError):
        return f"let the daemon's user read it: {read_fix(DAEMON_USER, path)}"
    damaged = re.match(r"(\S+): (truncated|corrupt|tensor)", str(e))
    if isinstance(e, CheckpointCorrupt) and damaged:
        file = damaged.group(1)
        return (
            f"{file} is incomplete or damaged: copy it again from its source and compare sizes "
            f"(ls -l {shlex.quote(file)}; sha256sum against the publisher's)"
        )
    if isinstance(e, CheckpointCorrupt | FillMisconfigured):
        return f"the checkpoint at {path} is incomplete: download it again, or fix {key}"
    return f"repair the checkpoint at {path}, or fix {key}"


def read_fix(user: str, path: str) -> str:
    """Commands that let ``user`` read the checkpoint at ``path``: its group
    first (chgrp and chmod are on every host; setfacl is not on a minimal
    Debian), an ACL as the alternative where setfacl is installed."""
    import shutil

    try:
        group = grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name
    except KeyError:
        group = user
    q = shlex.quote(path)
    fix = f"chgrp -R {group} {q} && chmod -R g+rX {q}"
    if shutil.which("setfacl"):
        fix += f"  (or, keeping its group: setfacl -R -m u:{user}:rX {q})"
    return fix


def check_user_access(r: Report, cfg, models: list, user: str) -> None:
    """What the daemon's user can read and open, checked as that user."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        r.info(f"no {user} user: the package's unit runs as it (fine when not installed as a package)")
        return
    if os.geteuid() != 0:
        r.info(f"run as root to check what user {user} can read (wcached doctor, or check-config --user)")
        return
    source = os.path.abspath(cfg.source)
    argv = [sys.executable, "-m", "wcached", "check-config", "--user", user, "--config", source]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd="/")
    except subprocess.TimeoutExpired:
        r.fail(
            f"checking the model paths as user {user} took over 120 s (a hung network filesystem?)",
            "findmnt; then ls each model path to see which one hangs",
        )
        return
    if out.returncode == 0:
        r.ok(f"user {user} can read every model path and use the socket directory")
        return
    paths = {m.name: m.path for m in models}
    # The socket directory's rule is the same on both sides (daemon.socket_dir):
    # check_socket_dir reports it once, for this user, with its fix.
    sdir = cfg.daemon.socket_dir
    try:
        said = f"{sdir} {socket_dir.problem(sdir, pwd.getpwnam(user).pw_uid)}"
    except OSError:
        said = ""
    said = "" if said == f"{sdir} " else said
    for line in out.stderr.splitlines():
        line = line.strip()
        # serve's own path check, as check-config reports it (key "path of model 'x'").
        m = re.search(r"key \"path of model '(.+?)'\"", line)
        if m and m.group(1) in paths:
            r.fail(line, read_fix(user, paths[m.group(1)]))
        elif said and said in line:
            continue  # check_socket_dir says this, with its fix
        elif line and not line.endswith("checked as user " + user + ":") and "problem(s)" not in line:
            r.fail(f"as user {user}: {line}", "see the line above; wcached check-config --user " + user)


def check_socket_dir(r: Report, cfg, user: str = DAEMON_USER) -> None:
    from wcached.daemon.lock import group_name, user_name

    sdir = cfg.daemon.socket_dir
    quoted = shlex.quote(sdir)
    # Made for the daemon's user (the one checked), as serve requires it.
    try:
        owner, group = user, grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name
    except KeyError:
        owner = group = user
    create = (
        "systemd-tmpfiles --create wcached.conf"
        if sdir == defaults.SOCKET_DIR
        else (
            f"install -d -o {owner} -g {group} -m 0750 {quoted} && "
            f"echo 'd {sdir} 0750 {owner} {group} -' > /etc/tmpfiles.d/wcached-socket-dir.conf "
            "  # the package's tmpfiles line creates /run/wcache only; this one survives a reboot"
        )
    )
    try:
        st = os.lstat(sdir)
    except FileNotFoundError:
        parent = os.path.dirname(sdir.rstrip("/")) or "/"
        if not _has_user(DAEMON_USER) and os.access(parent, os.W_OK | os.X_OK):
            # Not the package: `wcached serve` creates it (0750) as whoever
            # runs it, and this user may.
            r.info(f"socket directory {sdir} does not exist yet; wcached serve creates it")
        else:
            r.fail(f"socket directory {sdir} is missing", create)
        return
    except PermissionError:
        r.warn(f"socket directory {sdir} cannot be examined by this user", "run wcached doctor as root")
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        r.fail(
            f"socket directory {sdir} is not a directory (a symlink or a file)", f"rm {quoted} && {create}"
        )
        return
    mode = stat.S_IMODE(st.st_mode)
    owner = user_name(st.st_uid)
    group = group_name(st.st_gid)
    # The rule serve applies (wcached.daemon.socket_dir), for the daemon's
    # user (or, where there is none, whoever runs wcached serve: this user).
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        uid = os.geteuid()
    wrong = socket_dir.problem(sdir, uid)
    if wrong:
        r.fail(f"socket directory {sdir} {wrong} (the daemon refuses it)", socket_dir.fix(quoted, uid))
    elif mode & 0o007:
        r.warn(
            f"socket directory {sdir} is {owner}:{group} {mode:04o}: everyone may list it",
            socket_dir.fix(quoted, uid),
        )
    else:
        r.ok(f"socket directory {sdir} {owner}:{group} {mode:04o}")


def check_access_lists(r: Report, cfg) -> None:
    """Every user and group an instance's daemon would let attach, as it
    resolves them (a name, or a numeric id as it is), under the key that set
    it: [daemon]'s lists and each instance table's own."""
    from wcached.accounts import group_id, user_id
    from wcached.config import access_lists

    said: set[str] = set()
    for table_name in ("", *cfg.instance):
        lists = access_lists(cfg, table_name)
        for what, names, list_key, resolve, add in (
            ("user", lists.users, lists.users_key, user_id, "useradd"),
            ("group", lists.groups, lists.groups_key, group_id, "groupadd"),
        ):
            if list_key in said:  # [daemon]'s list, inherited by this table
                continue
            said.add(list_key)
            if not names and table_name:
                r.info(f"{list_key} is empty: no other {what} may attach to instance {table_name}")
            for i, name in enumerate(names):
                key = f"{list_key}[{i}]"
                found = resolve(name)
                if found is None:
                    r.fail(
                        f"allowed {what} {name!r} ({key}) does not exist",
                        f"{add} --system {shlex.quote(name)}, or fix {key} in {cfg.source}",
                    )
                else:
                    r.ok(f"allowed {what} {name} ({key}): {_id_entry(what, found)}")


def _id_entry(what: str, found: int) -> str:
    """What the host's user or group database says of an allowed id."""
    try:
        if what == "user":
            return f"uid {found} ({pwd.getpwuid(found).pw_name})"
        members = ", ".join(grp.getgrgid(found).gr_mem) or "no extra members yet"
        return f"gid {found}; {members}"
    except KeyError:  # a numeric id no entry of this host has: allowed as it is
        return f"id {found}, which no {what} of this host has (allowed as it is)"


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


# -- GPUs ---------------------------------------------------------------------


def check_gpu(r: Report, dev: str = "/dev", sys_module: str = "/sys/module") -> None:
    if not os.path.exists(os.path.join(dev, "nvidiactl")):
        r.info(f"no NVIDIA driver ({dev}/nvidiactl): GPU instances unavailable, cpuN instances work")
        return
    check_device_nodes(r, dev, sys_module)
    nvml, detail = _module("pynvml")
    if nvml is None:
        r.fail(f"nvidia-ml-py cannot be imported ({detail})", _pip("nvidia-ml-py"))
    else:
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            for i in range(count):
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                r.ok(
                    f"GPU {i}: {nvml_text(nvml.nvmlDeviceGetName(h))} {nvml_text(nvml.nvmlDeviceGetUUID(h))}"
                )
            nvml.nvmlShutdown()
        except Exception as e:
            r.fail(f"NVML does not start: {e}", "check the NVIDIA driver: nvidia-smi")
    cb, detail = _module("cuda.bindings.driver")
    if cb is None:
        r.fail(
            f"cuda-bindings cannot be imported ({detail}): the loader worker needs it", _pip("wcached[cuda]")
        )
    else:
        check_vmm(r)
    torch, detail = _module("torch")
    if torch is None:
        r.warn(f"torch cannot be imported ({detail}): needed by clients and dtype casts", _pip("torch"))
    else:
        r.ok(f"torch {detail}")


def check_device_nodes(r: Report, dev: str = "/dev", sys_module: str = "/sys/module") -> None:
    """The character devices the unit's DeviceAllow= opens, and nvidia-uvm
    (CUDA's unified memory module: no CUDA context starts without it)."""
    if not os.path.isdir(os.path.join(sys_module, "nvidia_uvm")):
        r.fail("kernel module nvidia-uvm is not loaded", "modprobe nvidia-uvm && nvidia-modprobe -u -c=0")
    missing = [n for n in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools") if not os.path.exists(f"{dev}/{n}")]
    gpus = sorted(glob.glob(os.path.join(dev, "nvidia[0-9]*")))
    if not gpus:
        missing.append("nvidia0 ...")
    if missing:
        r.fail(
            f"NVIDIA device nodes missing: {', '.join(f'{dev}/{n}' for n in missing)}",
            "nvidia-modprobe -u -c=0 (creates them; or run nvidia-smi once as root), "
            "then restart the instances",
        )
    else:
        r.ok(f"NVIDIA device nodes: nvidiactl, nvidia-uvm, {len(gpus)} GPU node(s)")


def check_vmm(r: Report) -> None:
    """CUDA virtual memory management with POSIX fd export, per GPU: how a
    daemon hands its memory to engines."""
    from wcached.memory import cuda

    try:
        cu = cuda.driver()
        count = cuda.check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
    except Exception as e:
        r.fail(
            f"the CUDA driver does not start: {e}",
            "check the NVIDIA driver: nvidia-smi; dmesg | grep -i nvrm",
        )
        return
    for i in range(count):
        try:
            uuid = cuda.vmm_fd_export(i)
        except WcacheError as e:
            r.fail(str(e), "install a Linux NVIDIA driver >= 450 (nvidia-smi shows the version)")
        else:
            r.ok(f"GPU {i} ({uuid}): VMM with POSIX fd export")


# -- systemd ------------------------------------------------------------------

# By systemd's Result= of the last run, where it says more than the status.
RESULT_FIXES = {
    "start-limit-hit": "journalctl -u {unit} -e for why it kept failing; then: systemctl reset-failed {unit} "
    "&& systemctl start {unit}",
    "timeout": "journalctl -u {unit} -e: what the fill was doing (a stalled fill, a rank that never joined)",
    "watchdog": "journalctl -u {unit} -e around the kill; report it with the journal",
    "resources": "systemctl status {unit}: a ReadWritePaths= directory that does not exist? "
    "(create it, or prefix it with - in the drop-in)",
    "oom-kill": "the host ran out of memory: journalctl -k | grep -i oom",
}


def check_units(r: Report, instance: str | None, units=None) -> None:
    from wcached.cli.status import canonical_instance, exit_meaning, systemd_units

    units = systemd_units() if units is None else units
    if instance is not None:
        wanted = canonical_instance(instance)
        units = [u for u in units if u.instance == instance or canonical_instance(u.instance) == wanted]
        if not units:
            r.info(f"no loaded unit wcached@{instance}: start it with systemctl start wcached@{instance}")
            return
    for u in units:
        state = f"{u.active_state}/{u.sub_state}"
        failed = u.result not in ("", "success")
        if not failed:
            r.ok(f"{u.unit}: {state}" + (f" ({u.status_text})" if u.status_text else ""))
            continue
        meaning = exit_meaning(u.exit_code, u.exit_status, u.result, u.unit)
        if u.result in RESULT_FIXES:
            fix = RESULT_FIXES[u.result]
        elif u.exit_code == "exited" and u.exit_status is not None:
            fix = exits.fix(u.exit_status, "{unit}")
        else:
            fix = "journalctl -k | grep -i -e oom -e killed; journalctl -u {unit} -e"
        status = f", last exit status {u.exit_status}" if u.exit_status is not None else ""
        r.fail(f"{u.unit}: {state}{status}: {meaning}", fix.format(unit=u.unit))


# -- tensor-parallel fills -------------------------------------------------------


def check_parallel_fill(r: Report, models: list, net: str = "/sys/class/net") -> None:
    """A vLLM fill over several instances: their ranks meet over loopback
    TCP (the rendezvous, gloo, NCCL's bootstrap, all on ``lo``)."""
    parallel = [m for m in models if m.loader == "vllm" and getattr(m, "world_size", 1) > 1]
    if not parallel:
        return
    try:
        flags = int(open(os.path.join(net, "lo", "flags")).read(), 16)
    except (OSError, ValueError):
        flags = 0
    if not flags & 0x1:  # IFF_UP
        r.fail(
            "the loopback interface lo is down or missing: tensor-parallel ranks cannot meet",
            "ip link set lo up",
        )
    else:
        r.ok("loopback interface lo is up (tensor-parallel ranks meet there)")
    for m in parallel:
        host, port = m.rendezvous.removeprefix("tcp://").rsplit(":", 1)
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # As the rendezvous binds it (torch's store): a port in TIME_WAIT
        # after an earlier fill is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((socket.gethostbyname(host), int(port)))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                r.warn(
                    f"model {m.name}: rendezvous port {port} is in use (by a fill under way, or by another "
                    "service: the ranks would not meet)",
                    f"ss -ltnp 'sport = :{port}' shows who holds it; pick a free port for model.rendezvous",
                )
            else:
                r.fail(
                    f"model {m.name}: cannot bind the rendezvous {m.rendezvous}: {e}", "fix model.rendezvous"
                )
        else:
            r.ok(f"model {m.name}: {m.world_size} ranks can meet at {m.rendezvous}")
        finally:
            s.close()


def run(config: str | None, instance: str | None = None, user: str = DAEMON_USER) -> int:
    r = Report()
    check_python(r)
    cfg = check_config(r, config)
    if cfg is not None:
        models = _models_of(r, cfg, instance)
        check_models(r, cfg, models)
        if cfg.daemon.worker_python and not os.access(cfg.daemon.worker_python, os.X_OK):
            r.fail(
                f"daemon.worker_python {cfg.daemon.worker_python} is not executable",
                f"point daemon.worker_python in {cfg.source} at an interpreter, or leave it empty",
            )
        check_user_access(r, cfg, models, user)
        check_socket_dir(r, cfg, user)
        check_access_lists(r, cfg)
        check_parallel_fill(r, models)
    check_units(r, instance)
    check_gpu(r)
    print("\n".join(r.lines))
    print(f"\n{r.failed} problem(s)" if r.failed else "\nno problems found")
    return 1 if r.failed else 0
