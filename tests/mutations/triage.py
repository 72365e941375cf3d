"""What tests/mutations/test_ratchet.py holds the mutation report to.

FLOORS: each scored module's mutation score (caught / mutants some test
runs, in percent) may not drop below this; raise it when the score rises.

TRIAGE: every mutant that survived, keyed by (module, function, changed
lines as report.json gives them), with why it may: "equivalent: ..." (no
behaviour can tell it apart) or "accepted: ..." (a real difference no test
should pin, and why). A survivor that matters gets a test instead.
"""

from __future__ import annotations

FLOORS: dict[str, float] = {}

TRIAGE: dict[tuple[str, str, str], str] = {}
