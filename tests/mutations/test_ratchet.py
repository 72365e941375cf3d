"""The mutation score's ratchet (tests/mutations/score.py writes report.json).

For every safety module in the report: the report is of the code in the tree
(each function's hash as mutmut computes it: a changed or new function needs
``make mutation-score ARGS='--changed <module>'``), its score is not below
its floor in triage.py, and every mutant that survived is triaged there, as
equivalent or as accepted with a reason (a survivor that gets a test is no
longer a survivor). The modules not scored yet are one skip, naming them.
"""

from __future__ import annotations

import json

import pytest

from tests.mutations.score import REPORT, SAFETY_MODULES, qualname_of
from tests.mutations.triage import FLOORS, TRIAGE

MEASURED = [m for m, why in SAFETY_MODULES.items() if not why]
# A mutant no test runs survives as surely as one the tests run and miss.
SURVIVED = ("survived", "no tests")


def _report() -> dict:
    return json.loads(REPORT.read_text()) if REPORT.exists() else {"modules": {}}


SCORED = [m for m in MEASURED if m in _report()["modules"]]


def test_every_scored_module_is_a_measured_safety_module() -> None:
    unknown = sorted(set(_report()["modules"]) - set(MEASURED))
    assert not unknown, f"report.json scores modules score.py does not measure: {unknown}"


def test_safety_modules_not_scored_yet() -> None:
    missing = [m for m in MEASURED if m not in SCORED]
    if missing:
        pytest.skip(
            f"{len(missing)} safety modules not scored yet: make mutation-score ARGS='{' '.join(missing)}'"
        )


@pytest.mark.parametrize("module", SCORED)
def test_the_report_is_of_the_code_in_the_tree(module: str) -> None:
    from mutmut.mutation.file_mutation import mutate_file_contents

    from tests.mutations.run import REPO

    entry = _report()["modules"][module]
    mutated = mutate_file_contents(module, (REPO / module).read_text())
    now = {qualname_of(k + "__mutmut_0"): v for k, v in mutated.hash_by_function_name.items()}
    then = entry["functions"]
    changed = sorted(f for f in now.keys() | then.keys() if now.get(f) != then.get(f))
    assert not changed, (
        f"{module}: {', '.join(changed)} changed since its mutation score; "
        f"run make mutation-score ARGS='--changed {module}' and commit tests/mutations/report.json"
    )
    assert not [m for m in entry["mutants"] if m["status"] == "not run"], (
        f"{module}: mutants not run (a budget ran out); run make mutation-score ARGS='--changed {module}'"
    )


@pytest.mark.parametrize("module", SCORED)
def test_the_score_does_not_drop_below_its_floor(module: str) -> None:
    entry = _report()["modules"][module]
    assert module in FLOORS, f"{module}: scored {entry['score']}, no floor in tests/mutations/triage.py"
    assert entry["score"] >= FLOORS[module], (
        f"{module}: mutation score {entry['score']} fell below its floor {FLOORS[module]}: "
        "a change let mutants survive that the tests caught before"
    )


@pytest.mark.parametrize("module", SCORED)
def test_every_survivor_is_triaged_and_every_triage_is_of_a_survivor(module: str) -> None:
    entry = _report()["modules"][module]
    survivors = {(m["function"], m["diff"]) for m in entry["mutants"] if m["status"] in SURVIVED}
    triaged = {(f, d) for (mod, f, d) in TRIAGE if mod == module}
    untriaged = sorted(survivors - triaged)
    assert not untriaged, f"{module}: survivors without a test or a triage entry:\n" + "\n".join(
        f"  {f}:\n    " + d.replace("\n", "\n    ") for f, d in untriaged
    )
    stale = sorted(triaged - survivors)
    assert not stale, f"{module}: triage entries whose mutant no longer survives (remove them): {stale}"


def test_triage_reasons_say_why() -> None:
    for key, reason in TRIAGE.items():
        assert reason.split(":", 1)[0] in ("equivalent", "accepted"), (key, reason)
        assert len(reason.split(":", 1)[-1].strip()) > 10, (key, reason)
