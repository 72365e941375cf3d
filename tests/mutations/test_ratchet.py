"""The mutation score's ratchet (tests/mutations/score.py writes report.json).

For every safety module in the report: the report is of the code in the tree
(each function's hash as mutmut computes it: a changed or new function needs
``make mutation-score ARGS='--changed <module>'``). For every module scored
whole (no mutant left unrun by a time budget): its score is not below its
floor in triage.py, and its survivors not triaged there (each a missing test
until shown otherwise) are no more than the ceiling beside it, so a change
can neither lose a catch nor add a survivor unseen; a triage entry whose
mutant no longer survives fails too. The modules not scored whole are one
skip, naming them.
"""

from __future__ import annotations

import functools
import json

import pytest

from tests.mutations.run import REPO
from tests.mutations.score import PYTHON, REPORT, SAFETY_MODULES, function_hashes, score_of
from tests.mutations.triage import FLOORS, TRIAGE

MEASURED = [m for m, why in SAFETY_MODULES.items() if not why]
# A mutant no test runs survives as surely as one the tests run and miss.
SURVIVED = ("survived", "no tests")


@functools.cache  # one read of the report for every test of the session
def _report() -> dict:
    return json.loads(REPORT.read_text()) if REPORT.exists() else {"modules": {}}


def _whole(entry: dict) -> bool:
    return not any(m["status"] == "not run" for m in entry["mutants"])


REPORTED = [m for m in MEASURED if m in _report()["modules"]]
SCORED = [m for m in REPORTED if _whole(_report()["modules"][m])]


def _open_survivors(module: str, entry: dict) -> list[tuple[str, str]]:
    """Survivors without a triage entry: missing tests until shown otherwise."""
    triaged = {(f, d) for (mod, f, d) in TRIAGE if mod == module}
    survivors = [(m["function"], m["diff"]) for m in entry["mutants"] if m["status"] in SURVIVED]
    return [s for s in survivors if s not in triaged]


def test_the_report_is_there_and_every_floor_is_of_a_whole_scored_module() -> None:
    assert REPORT.exists(), f"{REPORT} is missing: make mutation-score"
    unknown = sorted(set(_report()["modules"]) - set(MEASURED))
    assert not unknown, f"report.json scores modules score.py does not measure: {unknown}"
    unheld = sorted(set(FLOORS) - set(SCORED))
    assert not unheld, f"floors of modules not scored whole (mutants not run?): {unheld}"


def test_safety_modules_not_scored_whole_yet() -> None:
    missing = [m for m in MEASURED if m not in SCORED]
    if missing:
        pytest.skip(f"{len(missing)} safety modules not scored whole yet: {', '.join(missing)}")


@pytest.mark.parametrize("module", REPORTED)
def test_the_report_is_of_the_code_in_the_tree(module: str, monkeypatch) -> None:
    from mutmut.mutation.file_mutation import mutate_file_contents

    if _report().get("python") != PYTHON:
        # mutmut hashes ast.dump(), whose text differs between Python versions.
        pytest.skip(f"report.json's hashes are of Python {_report().get('python')}, this is {PYTHON}")
    monkeypatch.chdir(REPO)  # mutmut reads its [tool.mutmut] from ./pyproject.toml
    entry = _report()["modules"][module]
    mutated = mutate_file_contents(module, (REPO / module).read_text())
    now = function_hashes(mutated)
    then = entry["functions"]
    changed = sorted(f for f in now.keys() | then.keys() if now.get(f) != then.get(f))
    assert not changed, (
        f"{module}: {', '.join(changed)} changed since its mutation score; "
        f"run make mutation-score ARGS='--changed {module}' and commit tests/mutations/report.json"
    )


@pytest.mark.parametrize("module", SCORED)
def test_the_score_holds_its_floor_and_survivors_their_ceiling(module: str) -> None:
    entry = _report()["modules"][module]
    assert module in FLOORS, f"{module}: scored {entry['score']}, no floor in tests/mutations/triage.py"
    floor, ceiling = FLOORS[module]
    assert entry["score"] == score_of(entry["mutants"]), f"{module}: its score is not its mutants'"
    assert entry["score"] >= floor, (
        f"{module}: mutation score {entry['score']} fell below its floor {floor}: "
        "a change let mutants survive that the tests caught before"
    )
    survivors = _open_survivors(module, entry)
    assert len(survivors) <= ceiling, (
        f"{module}: {len(survivors)} survivors without a triage entry, more than the {ceiling} before:\n"
        + "\n".join(f"  {f}:\n    " + d.replace("\n", "\n    ") for f, d in survivors)
    )


@pytest.mark.parametrize("module", SCORED)
def test_every_triage_entry_is_of_a_survivor(module: str) -> None:
    entry = _report()["modules"][module]
    survivors = {(m["function"], m["diff"]) for m in entry["mutants"] if m["status"] in SURVIVED}
    stale = sorted((f, d) for (mod, f, d) in TRIAGE if mod == module and (f, d) not in survivors)
    assert not stale, f"{module}: triage entries whose mutant no longer survives (remove them): {stale}"


def test_triage_reasons_say_why() -> None:
    for key, reason in TRIAGE.items():
        kind, _, why = reason.partition(":")
        assert kind in ("equivalent", "accepted", "caught"), (key, reason)
        assert len(why.strip()) > 10, (key, reason)
        if kind == "caught":  # names a test that is there
            test_file = why.strip().split("::", 1)[0]
            assert (REPO / test_file).is_file(), (key, reason)
            name = why.strip().split("::", 1)[1].split(",", 1)[0]
            assert f"def {name}(" in (REPO / test_file).read_text(), (key, reason)
