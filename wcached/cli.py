"""Command line: serve | status | release | verify | check-config | doctor."""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys

import msgspec

from wcached import __version__
from wcached.config import default_config_path, instance_settings, load_config
from wcached.errors import EX_CONFIG, WcacheError

# systemctl's convention: 3 = not running.
EXIT_DOWN = 3


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    return args.func(args)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wcached", description="GPU weight cache daemon")
    p.add_argument("--version", action="version", version=f"wcached {__version__}")
    sub = p.add_subparsers(dest="command")

    def add(name: str, help: str, func) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help, description=help)
        sp.add_argument(
            "--config",
            default=None,
            help=f"config file (default: $WCACHED_CONFIG or {default_config_path()})",
        )
        sp.set_defaults(func=func)
        return sp

    sp = add("serve", "run the daemon of one instance in the foreground", _serve)
    sp.add_argument("instance", help="cpuN, a GPU index, or GPU-<uuid>")

    sp = add("status", "show what the running daemons hold and who is attached", _status)
    sp.add_argument("instance", nargs="?", help="one instance (default: every socket found)")
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.add_argument("--timeout", type=float, default=5.0)

    sp = add("release", "drop a model from a daemon (attached clients keep their mappings)", _release)
    sp.add_argument("instance")
    sp.add_argument("--model", required=True)
    sp.add_argument("--timeout", type=float, default=5.0)

    sp = add("verify", "check that what a daemon serves is what it filled and what is on disk", _verify)
    sp.add_argument("instance")
    sp.add_argument("--model", default=None, help="one model (default: every model it serves)")

    sp = add("check-config", "validate the config file and what serve would trip over", _check_config)
    sp.add_argument("--user", default=None, help="check as this user, the daemon's (needs root); e.g. wcache")
    add("doctor", "say what this host lacks to run wcached, and how to fix it", _doctor)
    return p


def _serve(args: argparse.Namespace) -> int:
    from wcached.daemon.service import serve

    return serve(args.instance, args.config)


def _verify(args: argparse.Namespace) -> int:
    from wcached.verify import run

    return run(args.instance, args.model, args.config, None)


def _doctor(args: argparse.Namespace) -> int:
    from wcached.doctor import run

    return run(args.config)


def _check_config(args: argparse.Namespace) -> int:
    from wcached.preflight import as_user, problems

    if args.user and args.user != _me():
        # Checked as the daemon's user: what it can read and open is what counts.
        try:
            uid, gid, groups = as_user(args.user)
        except WcacheError as e:
            print(f"wcached: {e}", file=sys.stderr)
            return EX_CONFIG
        if os.geteuid() != 0:
            print(f"wcached: checking as user {args.user} needs root", file=sys.stderr)
            return EX_CONFIG
        argv = [sys.executable, "-m", "wcached", "check-config"]
        argv += ["--config", os.path.abspath(args.config or default_config_path())]
        r = subprocess.run(argv, user=uid, group=gid, extra_groups=groups, cwd="/")
        return r.returncode
    try:
        cfg = load_config(args.config)
    except WcacheError as e:
        print(f"wcached: {e}", file=sys.stderr)
        return EX_CONFIG
    found = problems(cfg)
    if found:
        print(f"{cfg.source}: {len(found)} problem(s), checked as user {_me()}:", file=sys.stderr)
        for p in found:
            print(f"  {p}", file=sys.stderr)
        return EX_CONFIG
    print(f"{cfg.source}: OK (checked as user {_me()})")
    print(f"  socket_dir: {cfg.daemon.socket_dir}")
    for m in cfg.model:
        print(f"  model {m.name}: loader={m.loader} dtype={m.dtype} path={m.path}")
    for name in cfg.instance:
        s = instance_settings(cfg, name)
        print(f"  instance {name}: {', '.join(m.name for m in s.models) or 'no models'}")
    return 0


def _me() -> str:
    from wcached.daemon.lock import user_name

    return user_name(os.geteuid())


def _socket_dir(args: argparse.Namespace) -> str:
    from wcached.client.connection import find_socket_dir

    return find_socket_dir(None, args.config)


def _status(args: argparse.Namespace) -> int:
    from wcached.client.connection import DaemonConnection, socket_path

    try:
        sdir = _socket_dir(args)
        unreadable = _unreadable_dir(sdir)
        if unreadable:
            print(f"wcached: {unreadable}", file=sys.stderr)
            return EXIT_DOWN
        if args.instance:
            targets = [(args.instance, socket_path(args.instance, sdir))]
        else:
            paths = sorted(glob.glob(os.path.join(sdir, "*.sock")))
            targets = [(os.path.basename(p)[: -len(".sock")], p) for p in paths]
    except WcacheError as e:
        print(f"wcached: {e}", file=sys.stderr)
        return e.exit_status
    results: list[dict] = []
    for name, path in targets:
        try:
            with DaemonConnection(path, timeout=args.timeout, client="wcached status") as conn:
                results.append(msgspec.to_builtins(conn.status()))
        except (WcacheError, OSError) as e:
            results.append({"instance": name, "state": "down", "error": str(e)})
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
    elif not results:
        print(f"no daemon sockets in {sdir}")
    else:
        print(_status_table(results))
    down = not results or any(r["state"] == "down" for r in results)
    return EXIT_DOWN if down else 0


def _unreadable_dir(sdir: str) -> str:
    """Why this user cannot see the sockets in ``sdir`` ("" if it can): a
    listing it may not read would look like no daemon at all."""
    if not os.path.isdir(sdir) or os.access(sdir, os.R_OK | os.X_OK):
        return ""
    import grp

    from wcached.daemon.lock import user_name

    st = os.stat(sdir)
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    user = user_name(os.geteuid()) if os.geteuid() != st.st_uid else "its owner"
    return (
        f"user {user} cannot list the socket directory {sdir} (mode {st.st_mode & 0o777:04o}, "
        f"group {group}): add the user to group {group} (usermod -aG {group} {user}, then log in "
        "again) or run this as root"
    )


def _status_table(results: list[dict]) -> str:
    rows = [("INSTANCE", "STATE", "MODEL", "SIZE", "TENSORS", "CLIENTS", "UPTIME", "PID")]
    notes: list[str] = []
    for r in results:
        if r["state"] == "down":
            rows.append((r["instance"], "down", "-", "-", "-", "-", "-", "-"))
            notes.append(f"{r['instance']}: {r['error']}")
            continue
        models = r["models"] or [None]
        for i, m in enumerate(models):
            first = i == 0
            rows.append(
                (
                    r["instance"] if first else "",
                    (r["state"] if first else "") if m is None or m["state"] == "ready" else m["state"],
                    m["name"] if m else "-",
                    _size(m["bytes"]) if m else "-",
                    str(m["tensors"]) if m else "-",
                    str(sum(1 for c in r["clients"] if m and m["name"] in c["models"])),
                    _duration(r["uptime_s"]) if first else "",
                    str(r["pid"]) if first else "",
                )
            )
        note = memory_note(r)
        if note:
            notes.append(note)
        for c in r["clients"]:
            what = ", ".join(c["models"]) or "nothing yet"
            notes.append(
                f"{r['instance']}: pid {c['pid']} uid {c['uid']} ({c['client'] or 'client'}) "
                f"attached to {what} for {_duration(c['connected_s'])}"
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines + (["", *notes] if notes else []))


def memory_note(r: dict) -> str:
    """What the weights take of the GPU, and what that means for engines whose
    vLLM cannot count memory it maps from another process."""
    total = r.get("device_memory_bytes") or 0
    held = sum(m["bytes"] for m in r["models"] if m["state"] == "ready")
    if not total or not held:
        return ""
    share = held / total
    return (
        f"{r['instance']}: weights take {_size(held)} = {100 * share:.1f}% of the GPU's {_size(total)}; "
        f"vLLM engines without the external-weight hook (0.26, 0.27) should lower "
        f"gpu_memory_utilization by {share:.3f}"
    )


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _duration(s: float) -> str:
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _release(args: argparse.Namespace) -> int:
    from wcached.client.connection import DaemonConnection, socket_path

    try:
        path = socket_path(args.instance, _socket_dir(args))
        with DaemonConnection(path, timeout=args.timeout, client="wcached release") as conn:
            r = conn.release(args.model)
    except WcacheError as e:
        print(f"wcached: {e}", file=sys.stderr)
        return e.exit_status
    print(
        f"released {r.model} on {args.instance}; {r.attached_clients} attached client(s) keep their mappings"
    )
    return 0
