"""``make mutation-score``: every mutant mutmut makes of a safety module, run
against the tests that execute its function, in any process.

    python -m tests.mutations.score [MODULE ...] [--changed] [--jobs N]

Why not ``mutmut run`` itself: mutmut chooses a mutant's tests from the calls
its trampolines see inside the pytest process, and wcached's tests run the
daemon, its loader worker and clients as real processes. Tried on
wcached/daemon/peers.py with tests/daemon/test_peers.py, mutmut 3.8.1 found
no test for any of its mutants ("Stopping early, because we could not find any
test case for any mutant"): the peer check runs only in the daemon. So mutmut
makes the mutants (its operators and trampolines: one mutated copy of the
tree, each mutant switched on by ``MUTANT_UNDER_TEST``, which a daemon started
by a test inherits), and coverage.py, measuring subprocesses with each test's
node id as their context, says which tests ran each statement: a mutant is
run against the tests that ran the statement it changes (its function's,
where the change is outside the body), the quickest first. Chosen by
function, the quickest tests of a much-called function (attach) were ones
that never reach its rarely-run lines (a lease that ends): 65 of lease.py's
first 129 mutants "survived" tests that could not tell them apart.

The result is tests/mutations/report.json: per module, its functions' hashes
(mutmut's, so a changed function is found) and every mutant with its status
and diff. ``--changed`` runs only the functions whose hash differs from the
report's (a change's own functions), and merges. tests/mutations/
test_ratchet.py holds the report to the tree and the scores to their floors.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import difflib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.mutations.run import REPO, _copy_tree, run_tests

REPORT = REPO / "tests/mutations/report.json"
PYTHON = "{}.{}".format(*sys.version_info[:2])

# The safety modules (issue 23): what the guarantees rest on. Measured here:
# those whose code runs on a CPU host without vLLM. The others say why not.
_IN_VLLM = "runs in the vLLM virtualenvs, where mutmut's trampolines are not importable"
SAFETY_MODULES: dict[str, str] = {
    "wcached/protocol/wire.py": "",
    "wcached/protocol/messages.py": "declarations only (msgspec structs): mutmut makes no mutant of them",
    "wcached/protocol/runs.py": "",
    "wcached/accounts.py": "",
    "wcached/daemon/peers.py": "",
    "wcached/daemon/socket_dir.py": "",
    "wcached/daemon/lock.py": "",
    "wcached/daemon/holdings.py": "",
    "wcached/daemon/fdstore.py": "",
    "wcached/daemon/filler.py": "",
    "wcached/daemon/server.py": "",
    "wcached/daemon/service.py": "",
    "wcached/daemon/systemd.py": "",
    "wcached/daemon/metrics.py": "",
    "wcached/daemon/liveness.py": "",
    "wcached/client/attach.py": "",
    "wcached/client/connection.py": "",
    "wcached/client/lease.py": "",
    "wcached/memory/base.py": "",
    "wcached/memory/host.py": "",
    "wcached/memory/arena.py": "",
    "wcached/cli/verify.py": "",
    "wcached/cli/status.py": "",
    "wcached/errors.py": "",
    "wcached/exits.py": "",
    "wcached/config.py": "",
    "wcached/loaders/checkpoint.py": "",
    "wcached/loaders/safetensors.py": "",
    "wcached/loaders/layout.py": "",
    "wcached/loaders/base.py": "",
    "wcached/memory/kernel_cache.py": "",
    "wcached/memory/cuda.py": "runs only on the GPU machine, whose tests CI cannot run",
    "wcached/memory/cuda_digest.py": "runs only on the GPU machine, whose tests CI cannot run",
    "wcached/loaders/vllm/fill.py": _IN_VLLM,
    "wcached/loaders/vllm/key.py": _IN_VLLM,
    "wcached/integrations/vllm_bind.py": _IN_VLLM,
}

# The tests a mutant may be checked by: the suite without the booted
# container (minutes a test), the vLLM engines and the GPU.
TEST_PATHS = ("tests",)
TEST_IGNORES = ("tests/packaging", "tests/integrations", "tests/mutations")

COVERAGE_RC = """\
[run]
branch = false
parallel = true
data_file = {data}/.coverage
source = wcached
context = ${{PYTEST_CURRENT_TEST-}}
"""


# What --survivors runs again besides changed functions.
RERUN = ("survived", "no tests", "not run")


@dataclass
class Mutant:
    name: str  # mutmut's key: module.x_function__mutmut_N / module.xǁClassǁmethod__mutmut_N
    function: str  # Class.method or function
    diff: str
    status: str = "not run"  # killed, survived, no tests, timeout
    tests: list[str] = field(default_factory=list)  # quickest first
    reach: int = 0  # how many tests execute its function (tests holds at most --max-tests)


def qualname_of(mutant: str) -> str:
    """``module.xǁClassǁmethod__mutmut_3`` -> ``Class.method``."""
    base = mutant.rpartition(".")[2].rsplit("__mutmut_", 1)[0]
    if base.startswith("xǁ"):
        return ".".join(base[2:].split("ǁ"))
    return base[2:] if base.startswith("x_") else base


def function_hashes(mutated) -> dict[str, str]:
    """qualname -> mutmut's hash of each function it mutated (a MutatedFile's)."""
    return {qualname_of(k + "__mutmut_0"): v for k, v in mutated.hash_by_function_name.items()}


def function_lines(source: str) -> dict[str, tuple[int, int]]:
    """qualname -> (first line, last line) of every function's and method's
    body: what runs when it is called. Its decorators and ``def`` line run
    when the module is imported, by every test that imports it."""
    spans: dict[str, tuple[int, int]] = {}
    tree = ast.parse(source)

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = child.body
                docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                if docstring and len(body) > 1:
                    body = body[1:]
                spans[prefix + child.name] = (body[0].lineno, child.end_lineno or child.lineno)
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return spans


def statement_lines(source: str) -> dict[int, tuple[int, int]]:
    """line -> (first, last) line of the innermost statement holding it: of
    a compound statement its header (``while (`` ... ``):``) without its
    body. The tracer records a statement of several lines at whichever of
    its lines the interpreter reports, not always the first."""
    own: dict[int, tuple[int, int]] = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.stmt):
            continue
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
            last = max(node.lineno, body[0].lineno - 1)
        else:
            last = node.end_lineno or node.lineno
        for line in range(node.lineno, last + 1):
            if line not in own or last - node.lineno < own[line][1] - own[line][0]:
                own[line] = (node.lineno, last)
    return own


def mutated_lines(diff: str, source_lines: list[str], span: tuple[int, int]) -> set[int]:
    """The lines of the function (``span``, its body) that a mutant's diff
    removes; empty where one is not in the body (a default argument)."""
    removed = [line[1:] for line in diff.splitlines() if line.startswith("-")]
    found: set[int] = set()
    for text in removed:
        for n in range(span[0], span[1] + 1):
            if source_lines[n - 1].rstrip() == text.rstrip():
                found.add(n)
    return found


def make_mutants(tree: Path, modules: list[str]) -> tuple[dict[str, list[Mutant]], dict[str, dict[str, str]]]:
    """Writes each module's mutated copy (trampolines) into ``tree``; returns
    its mutants and its functions' hashes."""
    from mutmut.mutation.file_mutation import mutate_file_contents

    mutants: dict[str, list[Mutant]] = {}
    hashes: dict[str, dict[str, str]] = {}
    for module in modules:
        code = (REPO / module).read_text()
        mutated = mutate_file_contents(module, code)
        (tree / module).write_text(mutated.code)
        lines = mutated.code.splitlines()
        spans = mutated.line_span_by_function_name.items()
        text = {name: lines[span.start - 1 : span.end] for name, span in spans}
        prefix = module.removesuffix(".py").replace("/", ".") + "."
        mutants[module] = [
            Mutant(
                name=prefix + name,
                function=qualname_of(name),
                diff=_changed_lines(text[name.rsplit("__mutmut_", 1)[0] + "__mutmut_orig"], text[name]),
            )
            for name in mutated.mutant_names
        ]
        # The same change on two lines alike (two ``break``) is told apart by
        # its order in the function.
        seen: dict[tuple[str, str], int] = {}
        for m in mutants[module]:
            n = seen[(m.function, m.diff)] = seen.get((m.function, m.diff), 0) + 1
            if n > 1:
                m.diff += f"\n# the same change, occurrence {n}"
        hashes[module] = function_hashes(mutated)
    return mutants, hashes


def _unnamed(line: str) -> str:
    """A generated ``def x_f__mutmut_3(`` line as ``def f(``, so that only a
    mutated default argument makes it differ."""
    return re.sub(r"def x(?:ǁ\w+ǁ|_)(\w+?)__mutmut_\w+\(", r"def \1(", line)


def _changed_lines(orig: list[str], mutant: list[str]) -> str:
    """The lines a mutant changes, ``-old`` then ``+new``: stable while the
    function's other lines move."""
    orig, mutant = ([_unnamed(line) for line in f] for f in (orig, mutant))
    diff = difflib.unified_diff(orig, mutant, lineterm="", n=0)
    return "\n".join(line.rstrip() for line in diff if line[:1] in "+-" and line[:3] not in ("---", "+++"))


@dataclass
class Reach:
    """Which tests (node ids, quickest first) executed each function's body
    and each of its statements, in any process."""

    by_function: dict[str, list[str]]
    by_line: dict[int, list[str]]  # line -> the tests it was recorded for
    spans: dict[str, tuple[int, int]]
    statements: dict[int, tuple[int, int]]  # any line -> its statement's lines

    def tests_of(self, mutant: Mutant, source_lines: list[str]) -> list[str]:
        """The tests that ran the statement a mutant changes (they are the
        ones that can tell it apart); its function's where that statement is
        not known (a default argument, a line the diff cannot be found at)."""
        span = self.spans.get(mutant.function)
        lines = mutated_lines(mutant.diff, source_lines, span) if span else set()
        if not lines:
            return self.by_function.get(mutant.function, [])
        found: set[str] = set()
        for line in lines:
            first, last = self.statements.get(line, (line, line))
            for n in range(first, last + 1):
                found.update(self.by_line.get(n, ()))
        order = self.by_function.get(mutant.function, [])
        return [t for t in order if t in found]


def tests_by_function(modules: list[str], workdir: Path, test_paths: list[str]) -> dict[str, Reach]:
    """Runs the tests once under coverage: per module, the tests that
    executed each function and each statement, in any process."""
    import coverage

    data_dir = workdir / "coverage"
    data_dir.mkdir()
    data_dir.chmod(0o1777)  # daemons of other users write their data here
    rc = workdir / "coveragerc"
    rc.write_text(COVERAGE_RC.format(data=data_dir))
    # COVERAGE_PROCESS_START, not coverage run: coverage's .pth starts it in
    # this pytest and in every Python process it starts, each reading the rc
    # file itself, so a subprocess's context is the test current when it
    # started (``patch = subprocess`` would hand on the parent's, empty).
    argv = [sys.executable, "-m", "pytest", "-q"]
    argv += ["-p", "tests.mutations.cov_context", "-p", "no:cacheprovider", "-m", "not gpu and not vllm"]
    argv += [*test_paths, *(f"--ignore={p}" for p in TEST_IGNORES)]
    argv += [f"--junitxml={workdir / 'junit.xml'}"]
    print(f"coverage of the tests: {' '.join(argv[1:])}", flush=True)
    started = time.monotonic()
    r = subprocess.run(argv, cwd=REPO, env=dict(os.environ, COVERAGE_PROCESS_START=str(rc)), text=True)
    print(f"  {time.monotonic() - started:.0f} s, exit {r.returncode}", flush=True)
    seconds = _durations(workdir / "junit.xml")
    cov = coverage.Coverage(config_file=str(rc), data_file=str(data_dir / ".coverage"))
    cov.combine(data_paths=[str(data_dir)], keep=False)
    data = cov.get_data()
    result: dict[str, Reach] = {}

    for module in modules:
        mirror = mirrored_tests(module)

        def quickest_first(names: set[str], mirror: str = mirror) -> list[str]:
            # Only tests that passed; the module's own test file first (its
            # tests state its rules), then the others, each quickest first:
            # most mutants die in the first test that runs them.
            ids = {_node_id(c) for c in names} & seconds.keys()
            return sorted(ids, key=lambda t: (not t.startswith(mirror + "::"), seconds[t], t))

        path = str(REPO / module)
        contexts = data.contexts_by_lineno(path) if path in data.measured_files() else {}
        source = (REPO / module).read_text()
        spans = function_lines(source)
        per_function: dict[str, list[str]] = {}
        for fn, (first, last) in spans.items():
            names: set[str] = set()
            for line in range(first, last + 1):
                names.update(contexts.get(line, ()))
            per_function[fn] = quickest_first(names)
        per_line = {line: quickest_first(set(names)) for line, names in contexts.items()}
        result[module] = Reach(per_function, per_line, spans, statement_lines(source))
    return result


def mirrored_tests(module: str) -> str:
    """wcached/client/attach.py -> tests/client/test_attach.py (the suite
    mirrors the package)."""
    parent, _, name = module.removeprefix("wcached/").rpartition("/")
    return "/".join(p for p in ("tests", parent, f"test_{name}") if p)


def _durations(junit: Path) -> dict[str, float]:
    """node id -> seconds of each test that passed, from pytest's JUnit XML
    (module tests only; a test in a class is not named back). A test that
    fails on the code as it is would "kill" every mutant: it is left out."""
    import xml.etree.ElementTree as ET

    if not junit.exists():
        return {}
    seconds: dict[str, float] = {}
    for case in ET.parse(junit).iter("testcase"):
        if any(case.find(tag) is not None for tag in ("failure", "error", "skipped")):
            continue
        path = case.get("classname", "").replace(".", "/") + ".py"
        seconds[f"{path}::{case.get('name')}"] = float(case.get("time") or 0)
    return seconds


def _node_id(context: str) -> str:
    """``tests/x.py::test_y (call)`` (a subprocess's) or ``tests/x.py::test_y``."""
    return context.rsplit(" (", 1)[0] if context.endswith(")") else context


def run_mutant(tree: Path, mutant: Mutant, basetemp: Path, timeout: float, stop_at: float) -> str:
    if not mutant.tests:
        return "no tests"
    if time.monotonic() > stop_at:
        return "not run"
    env = dict(
        os.environ,
        PYTHONPATH=str(tree),
        PYTHONDONTWRITEBYTECODE="1",
        MUTANT_UNDER_TEST=mutant.name,
    )
    argv = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", f"--basetemp={basetemp}"]
    r = run_tests([*argv, *mutant.tests], tree, env, timeout)
    if r is None:
        return "timeout"
    if r.returncode == 0:
        return "survived"
    if r.returncode in (1, 3):  # tests failed, or an error inside a test run
        return "killed"
    if r.returncode < 0:  # pytest itself killed (the kernel's OOM killer): the mutant broke it
        return "killed"
    return f"error {r.returncode}: {(r.stdout + r.stderr)[-300:]}"


def file_sha(module: str) -> str:
    return hashlib.sha256((REPO / module).read_bytes()).hexdigest()


def load_report() -> dict:
    return json.loads(REPORT.read_text()) if REPORT.exists() else {"modules": {}}


def summarize(mutants: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for m in mutants:
        counts[m["status"]] = counts.get(m["status"], 0) + 1
    return counts


def score_of(mutants: list[dict]) -> float:
    """Caught (killed or hung) over mutants that some test runs."""
    ran = [m for m in mutants if m["status"] != "no tests"]
    caught = [m for m in ran if m["status"] in ("killed", "timeout")]
    return round(100.0 * len(caught) / len(ran), 1) if ran else 0.0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("modules", nargs="*", help="modules to score (default: every measured safety module)")
    p.add_argument("--changed", action="store_true", help="only functions whose hash differs from the report")
    p.add_argument(
        "--survivors",
        action="store_true",
        help="also the report's survivors and mutants not run (after tests were added), with --changed",
    )
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=240, help="seconds one mutant's tests may take")
    p.add_argument("--budget-s", type=float, default=float("inf"), help="start no mutant after it (s)")
    p.add_argument(
        "--max-tests",
        type=int,
        default=40,
        help="run a mutant against at most this many of its tests, the quickest (the report says how many)",
    )
    p.add_argument("--tests", nargs="+", default=list(TEST_PATHS), help="where a mutant's tests come from")
    args = p.parse_args()
    # --tests takes every path after it: a module written there would leave
    # the positional list empty, and so score every module for an hour.
    stray = [t for t in args.tests if t.startswith("wcached/")]
    if stray:
        p.error(f"--tests {' '.join(stray)}: modules, not tests (name the modules before --tests)")
    os.chdir(REPO)  # mutmut reads its [tool.mutmut] from ./pyproject.toml
    report = load_report()
    if report["modules"] and report.get("python") != PYTHON:
        p.error(f"report.json is of Python {report.get('python')}, this is {PYTHON}: its hashes differ")
    modules = args.modules or [m for m, why in SAFETY_MODULES.items() if not why]
    for m in modules:
        if SAFETY_MODULES.get(m, "") or not (REPO / m).exists():
            p.error(f"{m}: not a measured safety module ({SAFETY_MODULES.get(m) or 'unknown'})")
    with tempfile.TemporaryDirectory(prefix="wcached-mutmut-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        tree = work / "tree"
        tree.mkdir()
        tree.chmod(0o755)
        _copy_tree(tree)
        mutants, hashes = make_mutants(tree, modules)
        chosen: list[Mutant] = []
        for module in modules:
            before = report["modules"].get(module, {})
            old = before.get("functions", {})
            again = {(e["function"], e["diff"]) for e in before.get("mutants", []) if e["status"] in RERUN}
            for m in mutants[module]:
                changed = old.get(m.function) != hashes[module].get(m.function)
                if args.survivors and (m.function, m.diff) in again:
                    chosen.append(m)
                elif (args.changed or args.survivors) and not changed:
                    continue
                else:
                    chosen.append(m)
        print(f"{len(chosen)} mutants in {len(modules)} modules", flush=True)
        if chosen:
            reach = tests_by_function(modules, work, args.tests)
            for module in modules:
                source_lines = (REPO / module).read_text().splitlines()
                for m in mutants[module]:
                    found = reach[module].tests_of(m, source_lines)
                    m.reach, m.tests = len(found), found[: args.max_tests]
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            futures = {}
            for i, m in enumerate(chosen):
                base = work / f"pytest-{i}"
                job = pool.submit(run_mutant, tree, m, base, args.timeout, started + args.budget_s)
                futures[job] = (m, base)
            for done, fut in enumerate(concurrent.futures.as_completed(futures), 1):
                m, base = futures[fut]
                m.status = fut.result()
                shutil.rmtree(base, ignore_errors=True)
                took = time.monotonic() - started
                print(f"[{done}/{len(chosen)} {took:.0f}s] {m.status:9} {m.name}", flush=True)
    chosen_names = {m.name for m in chosen}
    for module in modules:
        before = report["modules"].get(module, {}).get("mutants", [])
        old = {m["function"] + "\n" + m["diff"]: m for m in before}
        entries = []
        for m in mutants[module]:
            if m.name in chosen_names:
                entries.append(
                    {
                        "function": m.function,
                        "diff": m.diff,
                        "status": m.status,
                        "tests_run": len(m.tests),
                        "tests_reaching": m.reach,
                    }
                )
            else:  # an unchanged function: its mutants' results stand
                stale = {"function": m.function, "diff": m.diff, "status": "not run"}
                entries.append(old.get(m.function + "\n" + m.diff) or stale)
        report["modules"][module] = {
            "sha256": file_sha(module),
            "functions": hashes[module],
            "counts": summarize(entries),
            "score": score_of(entries),
            "mutants": entries,
        }
        print(f"{module}: score {report['modules'][module]['score']} {report['modules'][module]['counts']}")
    report["mutmut"] = _version("mutmut")
    report["coverage"] = _version("coverage")
    # mutmut hashes ast.dump(), whose text differs between Python versions.
    report["python"] = PYTHON
    REPORT.write_text(json.dumps(report, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    return 0


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    sys.exit(main())
