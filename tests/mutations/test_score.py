"""The mutation score's choice of tests: by the statement a mutant changes."""

from __future__ import annotations

from tests.mutations.score import Mutant, Reach, mutated_lines, statement_lines

SOURCE = """\
def f(a, b=1):
    x = g(
        a,
        b,
    )
    if x:
        return h(x)
    return 0
"""


def test_a_line_belongs_to_its_statement_and_a_header_not_to_its_body() -> None:
    lines = statement_lines(SOURCE)
    assert [lines[n] for n in (2, 3, 4, 5)] == [(2, 5)] * 4
    assert lines[6] == (6, 6) and lines[7] == (7, 7) and lines[8] == (8, 8)
    header = statement_lines("while (\n    a\n    and b\n):\n    x = 1\n")
    assert [header[n] for n in (1, 2, 3, 4)] == [(1, 4)] * 4 and header[5] == (5, 5)


def test_a_mutant_is_run_against_the_tests_that_ran_its_statement() -> None:
    source_lines = SOURCE.splitlines()
    reach = Reach(
        by_function={"f": ["quick", "also", "slow"]},
        # The tracer recorded the call at its second line, not its first.
        by_line={3: ["quick", "also", "slow"], 6: ["quick", "also", "slow"], 7: ["slow", "also"]},
        spans={"f": (2, 8)},
        statements=statement_lines(SOURCE),
    )
    inside = Mutant(name="m.x_f__mutmut_1", function="f", diff="-        b,\n+        None,")
    assert mutated_lines(inside.diff, source_lines, (2, 8)) == {4}
    assert reach.tests_of(inside, source_lines) == ["quick", "also", "slow"]
    rare = Mutant(name="m.x_f__mutmut_2", function="f", diff="-        return h(x)\n+        return h(None)")
    assert reach.tests_of(rare, source_lines) == ["also", "slow"]  # in the function's order
    never = Mutant(name="m.x_f__mutmut_3", function="f", diff="-    return 0\n+    return 1")
    assert reach.tests_of(never, source_lines) == []
    default = Mutant(name="m.x_f__mutmut_4", function="f", diff="-def f(a, b=1):\n+def f(a, b=2):")
    assert reach.tests_of(default, source_lines) == ["quick", "also", "slow"]


def test_a_modules_own_tests_are_its_mirror_in_the_suite() -> None:
    from tests.mutations.score import mirrored_tests

    assert mirrored_tests("wcached/client/attach.py") == "tests/client/test_attach.py"
    assert mirrored_tests("wcached/exits.py") == "tests/test_exits.py"
    assert mirrored_tests("wcached/loaders/vllm/fill.py") == "tests/loaders/vllm/test_fill.py"
