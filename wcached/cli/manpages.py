"""The manual pages, generated from what they describe.

``wcached.toml(5)`` comes from the config schema itself: every table's msgspec
struct gives each key's type and default, and the comment written right above
the key in the struct gives its meaning (the same structs parse the file and
``check-config`` reports against). ``wcached(8)`` comes from the command
line's own parser and the exit statuses ``wcached status`` explains. A test
regenerates both and compares them with ``docs/``, so the pages cannot drift
from the code: after changing either, run ``make docs``.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgspec

from wcached import __version__, defaults

# -- where each key's meaning is written -------------------------------------


def field_comments(cls: type) -> dict[str, str]:
    """The comment lines right above each field in ``cls``'s own body."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    (node,) = ast.parse(source).body
    assert isinstance(node, ast.ClassDef)
    out: dict[str, str] = {}
    for stmt in node.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        comment: list[str] = []
        i = stmt.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#"):
            comment.insert(0, lines[i].strip().lstrip("#").strip())
            i -= 1
        out[stmt.target.id] = " ".join(comment)
    return out


def own_fields(cls: type) -> list[msgspec.inspect.Field]:
    """``cls``'s fields that its msgspec base classes do not declare."""
    inherited: set[str] = set()
    for base in cls.__mro__[1:]:
        fields = getattr(base, "__struct_fields__", ())
        if isinstance(fields, tuple):  # msgspec.Struct itself has a descriptor here
            inherited |= set(fields)
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    return [f for f in info.fields if f.name not in inherited]


def sections() -> list[tuple[str, str, type]]:
    """(heading, introduction, struct) for each part of the file."""
    from wcached.config import DaemonConfig, InstanceConfig
    from wcached.loaders.base import ModelConfig
    from wcached.loaders.safetensors import SafetensorsModel
    from wcached.loaders.vllm import VllmModel

    return [
        ("[daemon]", "Settings of every instance.", DaemonConfig),
        (
            "[instance.NAME]",
            "Overrides for one instance, NAME as systemd names it (0, cpu0, GPU-<uuid>); "
            "a key left out takes the [daemon] value.",
            InstanceConfig,
        ),
        (
            "[[model]]",
            'One table per model, whichever loader fills it; loader ("safetensors" by default, '
            'or "vllm") picks which further keys the table may have.',
            ModelConfig,
        ),
        ('[[model]] with loader = "safetensors"', "The checkpoint's tensors as stored.", SafetensorsModel),
        (
            '[[model]] with loader = "vllm"',
            "The weights as a vLLM engine worker holds them after loading.",
            VllmModel,
        ),
    ]


def undocumented() -> list[str]:
    """Keys that have no comment to become their description."""
    missing = []
    for heading, _, cls in sections():
        comments = field_comments(cls)
        missing += [f"{heading} {f.name}" for f in own_fields(cls) if not comments.get(f.name)]
    return missing


def type_text(t: Any) -> str:
    mi = msgspec.inspect
    if isinstance(t, mi.StrType):
        return "string"
    if isinstance(t, mi.BoolType):
        return "boolean"
    if isinstance(t, mi.IntType):
        return "integer"
    if isinstance(t, mi.FloatType):
        return "number"
    if isinstance(t, mi.LiteralType):
        return "one of " + ", ".join(toml_value(v) for v in t.values)
    if isinstance(t, mi.ListType):
        return f"list of {type_text(t.item_type)}s"
    if isinstance(t, mi.DictType):
        return f"table of {type_text(t.value_type)}s"
    if isinstance(t, mi.UnionType):
        parts = [type_text(x) for x in t.types if not isinstance(x, mi.NoneType)]
        return " or ".join(parts)
    if isinstance(t, mi.AnyType):
        return "any value"
    return type(t).__name__


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list | tuple):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def default_text(f: msgspec.inspect.Field) -> str:
    if f.required:
        return "required"
    if f.default_factory is not msgspec.NODEFAULT:
        return "default " + toml_value(f.default_factory())
    if f.default is None:
        return "default unset"
    return "default " + toml_value(f.default)


# -- roff -------------------------------------------------------------------------


def esc(text: str) -> str:
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text.startswith((".", "'")) else text


def _header(name: str, section: int, title: str) -> list[str]:
    return [f'.TH {name.upper()} {section} "" "wcached {__version__}" "{title}"']


def config_reference() -> str:
    out = _header("wcached.toml", 5, "File Formats")
    out += [
        ".SH NAME",
        "wcached.toml \\- configuration of the wcached weight cache daemons",
        ".SH SYNOPSIS",
        f".I {defaults.CONFIG_PATH}",
        "(or the file named by",
        ".B $WCACHED_CONFIG",
        "or",
        ".BR \\-\\-config )",
        ".SH DESCRIPTION",
        "A TOML file read by every instance",
        ".RB ( wcached@N.service )",
        "at start. An unknown key, a wrong type or an invalid value is an error naming the file and the "
        "key; the daemon then exits 78 and systemd does not restart it.",
        ".B wcached check\\-config",
        "checks a file without starting anything. Sizes are bytes or strings such as",
        '.BR "\\(dq4GiB\\(dq" .',
        "This page is generated from the structs that parse the file.",
    ]
    for heading, intro, cls in sections():
        comments = field_comments(cls)
        quoted = esc(heading).replace('"', "\\(dq")  # inside a quoted .SH argument
        out += [f'.SH "{quoted}"', esc(intro)]
        for f in own_fields(cls):
            out += [
                ".TP",
                f".B {esc(f.name)}",
                f"({esc(type_text(f.type))}; {esc(default_text(f))})",
                ".br",
                esc(comments.get(f.name, "")),
            ]
    out += [
        ".SH EXAMPLE",
        ".EX",
        *(esc(line) for line in EXAMPLE.splitlines()),
        ".EE",
        ".SH SEE ALSO",
        ".BR wcached (8),",
        ".BR systemd.service (5)",
    ]
    return "\n".join(out) + "\n"


EXAMPLE = """\
[daemon]
allowed_groups = ["wcache"]          # engines' users join this group

[[model]]
name = "llama-8b"
path = "/var/lib/wcache/models/llama-8b"
dtype = "bfloat16"

[instance.0]
models = ["llama-8b"]"""


def command_reference(parser: argparse.ArgumentParser | None = None) -> str:
    from wcached import exits
    from wcached.cli import EXIT_DOWN, EXIT_UNKNOWN, _parser
    from wcached.cli.verify import EXIT_NOT_VERIFIED

    parser = parser or _parser()
    out = _header("wcached", 8, "System Administration")
    out += [
        ".SH NAME",
        "wcached \\- keep inference model weights resident in device memory",
        ".SH SYNOPSIS",
    ]
    commands = _subcommands(parser)
    for name, sub in commands:
        usage = " ".join(sub.format_usage().removeprefix("usage:").split())
        prog = f"wcached {name}"
        out += [f".B {esc(prog)}", esc(usage.removeprefix(prog).strip()), ".br"]
    out += [
        ".SH DESCRIPTION",
        ".B wcached",
        "runs one daemon per device (a GPU index, a GPU UUID, or",
        ".B cpuN",
        "for host memory) that holds models' weights and hands them to inference engines as read\\-only "
        "mappings over a Unix socket. It is normally run by systemd as",
        ".BR wcached@INSTANCE.service ,",
        "which keeps the filled memory in its file descriptor store across restarts and package upgrades.",
        ".SH COMMANDS",
    ]
    for name, sub in commands:
        out += [".TP", f".B {esc(name)}", esc(sub.description or "")]
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            names = ", ".join(action.option_strings) or action.metavar or action.dest
            if action.option_strings and action.nargs != 0:
                names += f" {(action.metavar or action.dest).upper()}"
            out += [".RS", ".TP", f".B {esc(names)}", esc(_help(action)), ".RE"]
    out += [".SH EXIT STATUS", "Of", ".BR serve ,", "and of its unit as", ".B wcached status", "explains it:"]
    for status in exits.statuses():
        out += [".TP", f".B {status}", esc(exits.meaning(status))]
    out += [
        ".PP",
        ".B status",
        f"exits {EXIT_DOWN} unless every instance it finds is serving ({EXIT_UNKNOWN} when the rest "
        "could not be asked by this user: no access to their sockets);",
        ".B doctor",
        "and",
        ".B verify",
        "exit 1 when they find a problem;",
        ".B verify",
        f"exits {EXIT_NOT_VERIFIED} when a model had nothing it could compare (no digests recorded, no "
        "checkpoint to read), never 0; the other commands exit 78 on a configuration error.",
        ".SH FILES",
        ".TP",
        f".I {defaults.CONFIG_PATH}",
        "configuration, see",
        ".BR wcached.toml (5)",
        ".TP",
        ".I /etc/default/wcached",
        "the interpreter to run with (WCACHED_PYTHON)",
        ".TP",
        f".I {defaults.SOCKET_DIR}",
        "the instances' sockets and locks",
        ".SH SEE ALSO",
        ".BR wcached.toml (5),",
        ".BR systemctl (1),",
        ".BR journalctl (1)",
    ]
    return "\n".join(out) + "\n"


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices.items())
    return []


def _help(action: argparse.Action) -> str:
    text = action.help or ""
    if action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
        text += f" (default: {action.default})"
    return text


PAGES = {"wcached.toml.5": config_reference, "wcached.8": command_reference}


def main(argv: list[str] | None = None) -> int:
    """``python -m wcached.cli.manpages DIR``: write the pages into DIR."""
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "docs")
    out.mkdir(parents=True, exist_ok=True)
    for name, make in PAGES.items():
        (out / name).write_text(make())
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
