"""How a mutant's tests are run (tests/mutations/run.py): whatever they
started is gone once they end, and a hang is cut at its timeout."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

from tests.mutations.run import run_tests

# A "test run" that starts a daemon-like child and exits without stopping it.
_LEAVES_A_CHILD = textwrap.dedent(
    """
    import subprocess, sys
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(child.pid)
    sys.exit(int(sys.argv[1]))
    """
)


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie waiting for its reaper."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _until_gone(pid: int) -> bool:
    deadline = time.monotonic() + 5
    while not _gone(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_process_the_tests_left_running_is_killed_with_them(tmp_path: Path) -> None:
    for status in (0, 1):  # passed or failed: nothing they started outlives them
        r = run_tests([sys.executable, "-c", _LEAVES_A_CHILD, str(status)], tmp_path, dict(os.environ), 60)
        assert r is not None and r.returncode == status, r
        assert _until_gone(int(r.stdout)), "the tests' child outlived them"


def test_tests_that_run_past_their_timeout_are_killed_and_said_so(tmp_path: Path) -> None:
    started = time.monotonic()
    argv = [sys.executable, "-c", "import time; time.sleep(120)"]
    assert run_tests(argv, tmp_path, dict(os.environ), 0.5) is None
    assert time.monotonic() - started < 30
