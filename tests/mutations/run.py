"""``make mutate``: apply each mutation of tests/mutations/table.py to a copy of
the tree, run the tests meant to catch it, and fail listing the survivors.

    python -m tests.mutations.run [-k SUBSTRING]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.mutations.table import MUTATIONS, Mutation

REPO = Path(__file__).resolve().parents[2]
# What the tests need of the tree (no build outputs, no virtualenvs).
COPIED = ("wcached", "tests", "etc", "packaging", "docs", "pyproject.toml", "README.md")
# The vLLM virtualenvs, linked into the copy: their interpreters run the
# mutant's code through PYTHONPATH, which comes before their own install.
LINKED = ("build/vllm-venv", "build/vllm-venv-0.27")


def _copy_tree(dest: Path) -> None:
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, dest / name)
    for name in LINKED:
        if (REPO / name).exists():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(REPO / name, dest / name)


def function_span(source: str, qualname: str) -> tuple[int, int]:
    """Character offsets of ``qualname`` (``f`` or ``Class.method``) in ``source``."""
    tree = ast.parse(source)
    scope: list[ast.AST] = [tree]
    node = None
    for part in qualname.split("."):
        found = [
            n
            for s in scope
            for n in ast.iter_child_nodes(s)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part
        ]
        if len(found) != 1:
            raise LookupError(f"{qualname}: {len(found)} definitions of {part!r}")
        node = found[0]
        scope = [node]
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return starts[first - 1], starts[node.end_lineno]


def mutate(m: Mutation, text: str) -> str:
    """``text`` with ``m`` applied; LookupError when a line is not found once
    (in its function, where the entry names one)."""
    start, end = function_span(text, m.function) if m.function else (0, len(text))
    body = text[start:end]
    where = f"{m.file}:{m.function}" if m.function else m.file
    if body.count(m.old) != 1:
        raise LookupError(f"the line to mutate occurs {body.count(m.old)} times in {where}: {m.old!r}")
    text = text[:start] + body.replace(m.old, m.new) + text[end:]
    # The further lines, anywhere in the file (a constant, a second function).
    for old, new in m.more:
        if text.count(old) != 1:
            raise LookupError(f"a further line occurs {text.count(old)} times in {m.file}: {old!r}")
        text = text.replace(old, new)
    if m.file.endswith(".py"):
        try:
            ast.parse(text)
        except SyntaxError as e:
            # A mutant that does not compile fails every test: it proves nothing.
            raise LookupError(f"the mutant of {m.file} does not compile: {e}") from None
    return text


def run_tests(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess | None:
    """A mutant's tests, in a process group of their own that is killed
    once they end: a daemon that a test failing under the mutant started and
    never stopped dies with them instead of outliving the mutant's copy.
    Their output (stdout and stderr together) goes to a file, not a pipe,
    which such a daemon would hold open. None when they ran past
    ``timeout`` (killed as well)."""
    with tempfile.TemporaryFile("w+") as out:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, process_group=0
        )
        timed_out = False
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if timed_out:
            return None
        out.seek(0)
        return subprocess.CompletedProcess(argv, proc.returncode, out.read(), "")


def run_one(m: Mutation, timeout: float = 300) -> tuple[bool, float, str]:
    """(caught, seconds, tail of the output)."""
    with tempfile.TemporaryDirectory(prefix="wcached-mutant-") as tmp:
        root = Path(tmp)
        os.chmod(root, 0o755)  # tests run clients as other users from this copy
        _copy_tree(root)
        target = root / m.file
        try:
            target.write_text(mutate(m, target.read_text()))
        except LookupError as e:
            return False, 0.0, str(e)
        env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
        started = time.monotonic()
        argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *m.tests]
        r = run_tests(argv, root, env, timeout)
        if r is None:
            caught, out = True, "timed out (counted as caught: the mutant hangs its tests)"
        else:
            caught, out = r.returncode not in (0, 5), r.stdout + r.stderr
        return caught, time.monotonic() - started, out[-1500:]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("-k", default="", help="only mutations whose name contains this")
    args = p.parse_args()
    chosen = [m for m in MUTATIONS if args.k in m.name]
    survivors = []
    for m in chosen:
        caught, seconds, out = run_one(m)
        print(f"{'caught  ' if caught else 'SURVIVED'} {seconds:5.1f} s  {m.name}", flush=True)
        if not caught:
            survivors.append((m, out))
    print(f"{len(chosen) - len(survivors)} of {len(chosen)} mutations caught")
    for m, out in survivors:
        print(f"\n--- survived: {m.name} ({m.file}); tests: {', '.join(m.tests)}\n{out}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
