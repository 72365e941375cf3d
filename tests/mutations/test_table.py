"""The hand table of mutations still applies to the tree as it is now: a
refactor that moves or rewrites a guarded line fails here, at `make test`,
instead of being found only by `make mutate`."""

from __future__ import annotations

import ast
import re

import pytest

from tests.helpers import REPO
from tests.mutations.run import function_span, mutate
from tests.mutations.table import MUTATIONS, Mutation


@pytest.mark.parametrize("m", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_each_mutation_applies_once_in_its_function(m: Mutation) -> None:
    text = (REPO / m.file).read_text()
    # LookupError: the line is gone or no longer unique, or the mutant does
    # not compile (it would fail every test and prove nothing).
    mutated = mutate(m, text)
    assert mutated != text
    if m.file.endswith(".py"):
        if not m.function:
            # Only a module-level line may go without its function.
            inside = [q for q in _functions(text) if m.old in text[slice(*function_span(text, q))]]
            assert not inside, f"{m.name!r}: name its function ({inside})"


@pytest.mark.parametrize("m", MUTATIONS, ids=[m.name for m in MUTATIONS])
def test_each_mutations_tests_exist(m: Mutation) -> None:
    for node in m.tests:
        path, _, name = node.partition("::")
        source = (REPO / path).read_text() if (REPO / path).is_file() else ""
        assert source or (REPO / path).is_dir(), f"{m.name!r}: no {path}"
        if name:
            test = re.escape(name.split("[")[0])
            assert re.search(rf"^def {test}\(", source, re.M), f"{m.name!r}: no {node}"


def _functions(text: str) -> list[str]:
    """The dotted names of every function and method in a module."""

    def walk(node: ast.AST, prefix: str) -> list[str]:
        out = []
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    out.append(name)
                out += walk(child, name + ".")
        return out

    return walk(ast.parse(text), "")
