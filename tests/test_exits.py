"""The one table of exit statuses (wcached.exits) and everything made from it."""

from __future__ import annotations

import re

import pytest

from tests.helpers import REPO
from wcached import errors, exits


def test_readme_carries_the_table() -> None:
    readme = (REPO / "README.md").read_text()
    assert exits.markdown_table() in readme, "README's exit table differs: python -m wcached.exits prints it"


def test_the_unit_retries_exactly_the_retried_statuses() -> None:
    unit = (REPO / "packaging" / "systemd" / "wcached@.service").read_text()
    (line,) = re.findall(r"^RestartPreventExitStatus=(.*)$", unit, re.M)
    assert {int(x) for x in line.split()} == set(exits.NOT_RETRIED)
    assert "Restart=on-failure" in unit


def _all_errors() -> list[type[errors.WcacheError]]:
    out, todo = [], [errors.WcacheError]
    while todo:
        cls = todo.pop()
        out.append(cls)
        todo += cls.__subclasses__()
    return out


def test_every_error_exits_with_a_status_the_table_explains() -> None:
    for cls in _all_errors():
        assert cls.exit_status in exits.statuses(), cls
        assert cls.exit_status != 1, cls  # never a bare 1


@pytest.mark.parametrize(
    ("cls", "status"),
    [
        (errors.CheckpointCorrupt, 65),  # the bytes are wrong: copy the file again
        (errors.FillMisconfigured, 78),
        (errors.WorkerDied, 70),
        (errors.FillError, 70),  # unclassified: retried, never "corrupt"
        (errors.WcacheError, 70),
        (errors.OutOfMemory, 75),
        (errors.CheckpointMissing, 69),
        (errors.DeviceNotReady, 69),
        (errors.DeviceError, 78),
        (errors.WorkerNotRunnable, 69),
    ],
)
def test_causes_and_their_statuses(cls: type[errors.WcacheError], status: int) -> None:
    assert cls.exit_status == status
    assert exits.retried(status) == (status not in (0, 65, 78))


def test_worker_errors_keep_their_class_across_the_wire() -> None:
    """A worker reports a code; the daemon exits with that cause's status."""
    codes = [cls.__dict__.get("code") for cls in _all_errors()]
    assert None not in codes and len(set(codes)) == len(codes), codes
    for cls in _all_errors():
        if cls in (errors.ConfigError, errors.KeyMismatch):
            continue
        assert type(errors.error_for_code(cls.code, "x")) is cls, cls


def test_meaning_and_fix_come_from_the_table() -> None:
    from wcached.cli.status import exit_meaning

    assert exit_meaning("exited", 65) == exits.meaning(65)
    assert "not retried" in exits.meaning(65) and "(retried)" in exits.meaning(70)
    assert "{unit}" not in exits.fix(65, "wcached@0.service")
    assert "wcached@0.service" in exits.fix(65, "wcached@0.service")
