"""What tests/mutations/test_ratchet.py holds the mutation report to.

FLOORS: per scored module, (the lowest mutation score it may have: caught
over mutants some test runs, in percent; the most survivors it may have
without a TRIAGE entry). Raise the first and lower the second as tests are
written; a change that does the opposite fails make test.

TRIAGE: every mutant that survived, keyed by (module, function, changed
lines as report.json gives them), with why it may: "equivalent: ..." (no
behaviour can tell it apart), "accepted: ..." (a real difference no test
should pin, and why) or "caught: <test node id>, ..." (a test that fails
with it, checked by hand, beyond the tests the score ran for it: a mutant
runs only against the first --max-tests tests that reach its statement,
its module's own test file first). A survivor that matters gets a test
instead.
"""

from __future__ import annotations

# make mutation-score, 2026-12-02 (at most 20 tests a mutant): the ten
# modules at feda1db, then --survivors of the seven given tests since.
FLOORS: dict[str, tuple[float, int]] = {
    "wcached/client/attach.py": (89.2, 24),
    "wcached/daemon/liveness.py": (66.2, 23),
    "wcached/daemon/lock.py": (93.4, 5),
    "wcached/daemon/peers.py": (100.0, 0),
    "wcached/daemon/socket_dir.py": (100.0, 0),
    "wcached/errors.py": (100.0, 0),
    "wcached/exits.py": (100.0, 0),
    "wcached/loaders/layout.py": (65.5, 41),
    "wcached/memory/base.py": (92.7, 29),
    "wcached/memory/host.py": (89.3, 29),
}

TRIAGE: dict[tuple[str, str, str], str] = {}
