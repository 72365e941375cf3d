"""``wcached doctor``: what this host lacks to run wcached, and how to fix it.

Every check prints one line, ``ok``, ``warn``, ``FAIL`` or ``info``; each
failure is followed by the exact fix. Exit status 1 if anything failed.
"""

from __future__ import annotations

import grp
import importlib
import os
import pwd
import stat
import sys
from dataclasses import dataclass, field

from wcached.errors import WcacheError


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


def check_python(r: Report) -> None:
    r.ok(f"python {sys.version.split()[0]} at {sys.executable}")
    for mod, deb, pip in (("msgspec", "python3-msgspec", "msgspec"), ("xxhash", "python3-xxhash", "xxhash")):
        m, detail = _module(mod)
        if m is None:
            r.fail(
                f"{mod} cannot be imported ({detail})",
                f"apt install {deb}, or {_pip(pip)} (or set WCACHED_PYTHON in /etc/default/wcached "
                "to an interpreter that has it)",
            )
        else:
            r.ok(f"{mod} {detail}")


def check_config(r: Report, path: str | None):
    from wcached.config import default_config_path, load_config

    try:
        cfg = load_config(path)
    except WcacheError as e:
        r.fail(f"config: {e}", f"edit {path or default_config_path()}, then run wcached check-config")
        return None
    r.ok(f"config {cfg.source}: {len(cfg.model)} model(s)")
    return cfg


def check_models(r: Report, cfg) -> None:
    from wcached.loaders.safetensors import read_checkpoint

    for m in cfg.model:
        if m.loader != "safetensors":
            r.info(f"model {m.name}: loader {m.loader} (checked when filling)")
            continue
        try:
            ckpt = read_checkpoint(m.path)
        except WcacheError as e:
            r.fail(f"model {m.name}: {e}", f"put the checkpoint at {m.path} or fix model.path")
            continue
        size = sum(t.nbytes for t in ckpt.tensors)
        files = len(ckpt.files)
        r.ok(f"model {m.name}: {len(ckpt.tensors)} tensors, {size / 2**30:.2f} GiB in {files} file(s)")


def check_service_user(r: Report, cfg) -> None:
    try:
        pw = pwd.getpwnam("wcache")
    except KeyError:
        r.info("no wcache user (fine when not installed as a package)")
        return
    r.ok(f"service user wcache (uid {pw.pw_uid})")
    if cfg is None:
        return
    sdir = cfg.daemon.socket_dir
    try:
        st = os.stat(sdir)
    except FileNotFoundError:
        r.fail(f"socket directory {sdir} is missing", "systemd-tmpfiles --create wcached.conf")
        return
    mode = stat.S_IMODE(st.st_mode)
    owner = pwd.getpwuid(st.st_uid).pw_name if _has_uid(st.st_uid) else str(st.st_uid)
    group = grp.getgrgid(st.st_gid).gr_name if _has_gid(st.st_gid) else str(st.st_gid)
    if owner != "wcache" or mode & 0o007:
        r.warn(
            f"socket directory {sdir} is {owner}:{group} {mode:04o}",
            "expected wcache:wcache 0750: systemd-tmpfiles --create wcached.conf",
        )
    else:
        r.ok(f"socket directory {sdir} {owner}:{group} {mode:04o}")
    for g in cfg.daemon.allowed_groups:
        try:
            members = grp.getgrnam(g).gr_mem
            r.ok(f"allowed group {g}: {', '.join(members) or 'no extra members yet'}")
        except KeyError:
            r.fail(
                f"allowed group {g} does not exist", f"groupadd --system {g}, or fix daemon.allowed_groups"
            )


def _has_uid(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def _has_gid(gid: int) -> bool:
    try:
        grp.getgrgid(gid)
        return True
    except KeyError:
        return False


def check_gpu(r: Report) -> None:
    if not os.path.exists("/dev/nvidiactl"):
        r.info("no NVIDIA driver (/dev/nvidiactl): GPU instances unavailable, cpuN instances work")
        return
    nvml, detail = _module("pynvml")
    if nvml is None:
        r.fail(f"nvidia-ml-py cannot be imported ({detail})", _pip("nvidia-ml-py"))
    else:
        try:
            nvml.nvmlInit()
            count = nvml.nvmlDeviceGetCount()
            for i in range(count):
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                r.ok(f"GPU {i}: {_text(nvml.nvmlDeviceGetName(h))} {_text(nvml.nvmlDeviceGetUUID(h))}")
            nvml.nvmlShutdown()
        except Exception as e:
            r.fail(f"NVML does not start: {e}", "check the NVIDIA driver (nvidia-smi)")
    cb, detail = _module("cuda.bindings.driver")
    if cb is None:
        r.fail(
            f"cuda-bindings cannot be imported ({detail}): the loader worker needs it", _pip("wcached[cuda]")
        )
    else:
        r.ok("cuda-bindings")
    torch, detail = _module("torch")
    if torch is None:
        r.warn(f"torch cannot be imported ({detail}): needed by clients and dtype casts", _pip("torch"))
    else:
        r.ok(f"torch {detail}")


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v


def run(config: str | None) -> int:
    r = Report()
    check_python(r)
    if r.failed:
        print("\n".join(r.lines))
        return 1
    cfg = check_config(r, config)
    if cfg is not None:
        check_models(r, cfg)
        if cfg.daemon.worker_python and not os.access(cfg.daemon.worker_python, os.X_OK):
            r.fail(
                f"daemon.worker_python {cfg.daemon.worker_python} is not executable",
                "point it at an interpreter, or leave it empty",
            )
    check_service_user(r, cfg)
    check_gpu(r)
    print("\n".join(r.lines))
    print(f"\n{r.failed} problem(s)" if r.failed else "\nno problems found")
    return 1 if r.failed else 0
