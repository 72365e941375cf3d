"""What tests/mutations/test_ratchet.py holds the mutation report to.

FLOORS: per scored module, (the lowest mutation score it may have: caught
over mutants some test runs, in percent; the most survivors it may have
without a TRIAGE entry). Raise the first and lower the second as tests are
written; a change that does the opposite fails make test.

TRIAGE: every mutant that survived, keyed by (module, function, changed
lines as report.json gives them), with why it may: "equivalent: ..." (no
behaviour can tell it apart) or "accepted: ..." (a real difference no test
should pin, and why). A survivor that matters gets a test instead.
"""

from __future__ import annotations

FLOORS: dict[str, tuple[float, int]] = {}

TRIAGE: dict[tuple[str, str, str], str] = {}
