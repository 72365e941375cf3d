"""What ``wcached serve`` would trip over after a long fill, found before it.

``wcached check-config`` runs these as the daemon's user (``--user``, by
re-running itself as that user when started as root) so that "cannot read the
model" or "the lock file belongs to root" shows up before a unit restarts in a
loop: allowed users and groups resolved as ``serve`` resolves them, every
instance's socket path length, the socket directory's owner and mode, the
lock files, and every model path's readability.
"""

from __future__ import annotations

import os
import pwd
import stat
import subprocess

import msgspec

from wcached.config import (
    AccessLists,
    Config,
    ModelConfig,
    access_lists,
    check_socket_path,
    instance_settings,
)
from wcached.daemon.fdstore import UNIT_FDSTORE_MAX, fds_needed
from wcached.daemon.lock import left_by_another_user
from wcached.errors import CheckpointMissing, ConfigError, WcacheError


def problems(cfg: Config) -> list[str]:
    """Every problem found, as the current user; empty if none."""
    found: list[str] = []

    def check(fn, *args):
        try:
            return fn(*args)
        except WcacheError as e:
            if str(e) not in found:  # a [daemon] list that instances inherit: told once
                found.append(str(e))
            return None

    from wcached.daemon.peers import AccessPolicy

    d = cfg.daemon

    def check_names(lists: AccessLists) -> None:
        # Each list on its own: a bad user does not hide a bad group.
        check(AccessPolicy.from_lists, msgspec.structs.replace(lists, groups=()), cfg.source)
        check(AccessPolicy.from_lists, msgspec.structs.replace(lists, users=()), cfg.source)

    # The lists as each instance's daemon resolves them, under the keys it
    # would name; an instance table whose other keys are wrong is no reason
    # to leave its lists unchecked.
    for table_name in ("", *cfg.instance):
        check_names(access_lists(cfg, table_name))
    for name in cfg.instance:
        check(instance_settings, cfg, name)  # its port, its socket path's length
    check(check_socket_path, cfg)
    if os.path.isdir(d.socket_dir):
        from wcached.daemon.service import check_socket_dir
        from wcached.daemon.socket_dir import daemon_uid

        before = len(found)
        check(check_socket_dir, d.socket_dir, cfg.source, daemon_uid())
        # Files in it the daemon could not take over; one it cannot even list
        # is a problem already said when the directory's rule failed.
        found += _foreign_files(d.socket_dir, unlistable_said=len(found) > before)
    elif os.path.exists(d.socket_dir):
        found.append(f"daemon.socket_dir {d.socket_dir} exists and is not a directory")
    found += _unreadable(cfg)
    found += _store_budget(cfg)
    if d.metrics_dir:
        # (Ports are not tried: the instances running now hold their own.)
        from wcached.daemon.metrics import check_metrics_dir

        check(check_metrics_dir, d.metrics_dir, cfg.source)
    return found


def _store_budget(cfg: Config, limit: int | None = None) -> list[str]:
    """Models whose segments could not all be kept in the unit's fd store
    (a restart would refill them): each model alone, and each instance
    table's models together. Counted from the checkpoint's headers by loaders
    that can tell (safetensors: exactly); a model its loader cannot count
    before filling (vLLM) is judged when it fills, where the daemon says so."""
    limit = unit_fdstore_max() if limit is None else limit
    need = {m.name: _fds_of(m) for m in cfg.model}
    where = f"the unit keeps {limit} (FileDescriptorStoreMax=)"
    out = []
    for i, m in enumerate(cfg.model):
        if need[m.name] > limit:
            out.append(
                f"{cfg.source}: key 'model[{i}].segment_size': {m.name!r} needs {need[m.name]} fds in "
                f"systemd's fd store with segment_size = {m.segment_bytes} bytes and {where}: a restart "
                "would refill it; raise segment_size, or FileDescriptorStoreMax= in a drop-in"
            )
    for name, table in cfg.instance.items():
        if table.models is None:
            continue
        total = sum(need.get(n, 0) for n in table.models)
        if total > limit and not any(need.get(n, 0) > limit for n in table.models):
            out.append(
                f"{cfg.source}: key 'instance.{name}.models': together they need {total} fds in "
                f"systemd's fd store and {where}: raise their segment_size"
            )
    return out


def _fds_of(model: ModelConfig) -> int:
    """Store entries a fill of ``model`` takes; 0 if its loader cannot tell yet."""
    from wcached.loaders.base import get_loader

    planned = getattr(get_loader(model.loader), "planned_segments", None)
    if planned is None or not os.path.exists(model.path):
        return 0
    try:
        return fds_needed(planned(model))
    except (WcacheError, OSError):
        return 0  # an unreadable or corrupt checkpoint: reported on its own


def unit_fdstore_max() -> int:
    """The packaged unit's FileDescriptorStoreMax= as systemd loads it here
    (a drop-in for wcached@.service included); the unit file's own value
    where systemd cannot be asked."""
    try:
        r = subprocess.run(
            ["systemctl", "show", "-p", "FileDescriptorStoreMax", "--value", "wcached@check-config.service"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        value = int(r.stdout.strip())
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return UNIT_FDSTORE_MAX
    # 0 would mean no unit file is installed here (systemd's default).
    return value if r.returncode == 0 and value > 0 else UNIT_FDSTORE_MAX


def _foreign_files(socket_dir: str, unlistable_said: bool = False) -> list[str]:
    """Lock files and sockets this user could not take over."""
    me = os.geteuid()
    out = []
    try:
        names = sorted(os.listdir(socket_dir))
    except OSError as e:
        return [] if unlistable_said else [f"socket directory {socket_dir} cannot be listed ({e.strerror})"]
    for name in names:
        path = os.path.join(socket_dir, name)
        if not name.endswith((".lock", ".sock")):
            continue
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            out.append(f"{path} is a symlink; fix with: rm {path}")
        elif me != 0 and st.st_uid != me:
            out.append(left_by_another_user(path, st.st_uid, f"instance {name.rsplit('.', 1)[0]}"))
    return out


def _unreadable(cfg: Config) -> list[str]:
    """What serve's own check before a fill says of each model's path, in its
    words (:func:`~wcached.daemon.filler.check_checkpoint_path`)."""
    from wcached.daemon.filler import check_checkpoint_path

    found = []
    for m in cfg.model:
        try:
            check_checkpoint_path(m, cfg.source)
        except CheckpointMissing as e:
            found.append(f"{e} (the daemon waits for it: exit 69)")
        except WcacheError as e:
            found.append(str(e))
    return found


def as_user(user: str) -> tuple[int, int, list[int]]:
    """uid, gid and supplementary groups of ``user`` (for re-running as it)."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        raise ConfigError(None, "--user", f"no such user {user!r}") from None
    return pw.pw_uid, pw.pw_gid, os.getgrouplist(user, pw.pw_gid)
