"""Command line: serve | status | release | verify | check-config | doctor."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import msgspec

from wcached import __version__, defaults
from wcached.config import instance_settings, load_config
from wcached.errors import EX_CONFIG, WcacheError

# systemctl's convention: 3 = not running.
EXIT_DOWN = 3
# status: every instance serves or could not be asked by this user (no access).
EXIT_UNKNOWN = 4


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
            help=f"config file (default: ${defaults.CONFIG_ENV} or {defaults.CONFIG_PATH})",
        )
        sp.set_defaults(func=func)
        return sp

    sp = add("serve", "run the daemon of one instance in the foreground", _serve)
    sp.add_argument("instance", help="cpuN, a GPU index, or GPU-<uuid>")

    sp = add("status", "show what the running daemons hold and who is attached", _status)
    sp.add_argument("instance", nargs="?", help="one instance (default: every socket found)")
    sp.add_argument("--json", action="store_true", help="machine-readable output (see --json-schema)")
    sp.add_argument("--json-schema", action="store_true", help="print the JSON Schema of --json and exit")
    sp.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each daemon's answer")

    sp = add("release", "drop a model from a daemon (attached clients keep their mappings)", _release)
    sp.add_argument("instance", help="the instance serving it")
    sp.add_argument("--model", required=True, help="the model to drop (root or the daemon's user only)")
    sp.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the daemon's answer")

    sp = add("verify", "check that what a daemon serves is what it filled and what is on disk", _verify)
    sp.add_argument("instance", help="the instance to check")
    sp.add_argument("--model", default=None, help="one model (default: every model it serves)")

    sp = add("check-config", "validate the config file and what serve would trip over", _check_config)
    sp.add_argument("--user", default=None, help="check as this user, the daemon's (needs root); e.g. wcache")
    sp = add(
        "doctor", "say what this host lacks to run wcached, and the command that fixes each problem", _doctor
    )
    sp.add_argument("instance", nargs="?", help="check this instance's models and unit only")
    sp.add_argument(
        "--user", default=defaults.DAEMON_USER, help="the daemon's user, whose access is checked (as root)"
    )
    return p


def _serve(args: argparse.Namespace) -> int:
    from wcached.daemon.service import serve

    return serve(args.instance, args.config)


def _verify(args: argparse.Namespace) -> int:
    from wcached.cli.verify import run

    return run(args.instance, args.model, args.config, None)


def _doctor(args: argparse.Namespace) -> int:
    from wcached.cli.doctor import run

    return run(args.config, args.instance, args.user)


def _check_config(args: argparse.Namespace) -> int:
    from wcached.cli.check_config import as_user, problems

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
        argv += ["--config", os.path.abspath(args.config or defaults.config_path())]
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
    """The operator's commands validate the whole file (a typo is said),
    where a client reads only the one key it needs."""
    path = args.config or defaults.config_path()
    if args.config or os.path.exists(path):
        return load_config(path).daemon.socket_dir
    return defaults.SOCKET_DIR


def _status(args: argparse.Namespace) -> int:
    from wcached.cli import status as status_view

    if args.json_schema:
        print(json.dumps(status_view.json_schema(), indent=2))
        return 0
    config_error: WcacheError | None = None
    try:
        sdir = _socket_dir(args)
    except WcacheError as e:
        # Said, and the instances still shown: the sockets of the default
        # directory and what systemd knows.

        print(f"wcached: {e}", file=sys.stderr)
        config_error, sdir = e, defaults.SOCKET_DIR
    try:
        unreadable = _unreadable_dir(sdir)
        if unreadable:
            # Said, and what systemd knows (readable by anyone) still shown.
            print(f"wcached: {unreadable}", file=sys.stderr)
        views = status_view.gather(sdir, args.instance, args.timeout, list_sockets=not unreadable)
    except WcacheError as e:
        print(f"wcached: {e}", file=sys.stderr)
        return e.exit_status
    if args.json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(views), indent=2).decode() + "\n")
    elif not views:
        if not unreadable:
            print(f"no daemon sockets in {sdir} and no wcached@ units")
    else:
        print(status_view.table(views))
    if config_error is not None:
        return config_error.exit_status
    if status_view.all_serving(views) and not unreadable:
        return 0
    # (Running units behind a directory this user cannot list are unknown too.)
    return EXIT_UNKNOWN if status_view.any_unknown(views) else EXIT_DOWN


def _unreadable_dir(sdir: str) -> str:
    """Why this user cannot see the sockets in ``sdir`` ("" if it can): a
    listing it may not read would look like no daemon at all."""
    if not os.path.isdir(sdir) or os.access(sdir, os.R_OK | os.X_OK):
        return ""
    from wcached.daemon.lock import group_name, user_name

    st = os.stat(sdir)
    group = group_name(st.st_gid)
    user = user_name(os.geteuid()) if os.geteuid() != st.st_uid else "its owner"
    return (
        f"user {user} cannot list the socket directory {sdir} (mode {st.st_mode & 0o777:04o}, "
        f"group {group}): add the user to group {group} (usermod -aG {group} {user}, then log in "
        "again) or run this as root"
    )


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
