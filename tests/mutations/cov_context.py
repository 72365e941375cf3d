"""pytest plugin for the mutation score's coverage run: each test's lines are
recorded under its node id, in this process (switch_context) and in every
process it starts (their static context is ``${PYTEST_CURRENT_TEST}``, which
pytest sets in the environment they inherit; see score.COVERAGE_RC)."""

from __future__ import annotations

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import coverage

    cov = coverage.Coverage.current()
    if cov is not None:
        cov.switch_context(item.nodeid)
    yield
    if cov is not None:
        cov.switch_context("")
