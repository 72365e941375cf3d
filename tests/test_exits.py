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
        (errors.DaemonUnavailable, 69),  # a client command with no daemon to ask
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
    # A status no cause has (a kill from outside, a foreign wrapper's): said
    # as unknown, never as one of wcached's causes.
    assert exits.meaning(99) == "failed (a status wcached does not use: killed from outside?)"


def _unit_retries(status: int) -> bool:
    """Whether the packaged unit's Restart=/RestartPreventExitStatus= start
    the daemon again after ``wcached serve`` exits with ``status``."""
    unit = (REPO / "packaging" / "systemd" / "wcached@.service").read_text()
    (restart,) = re.findall(r"^Restart=(\S+)$", unit, re.M)
    prevent = {
        int(x) for line in re.findall(r"^RestartPreventExitStatus=(.*)$", unit, re.M) for x in line.split()
    }
    success = {0} | {
        int(x) for line in re.findall(r"^SuccessExitStatus=(.*)$", unit, re.M) for x in line.split()
    }
    # An exit with a status (no signal): on-failure and always restart an
    # unclean one, on-abnormal/on-watchdog/on-abort/no never do.
    return restart in ("on-failure", "always") and status not in success and status not in prevent


TEMPORARY = [
    errors.OutOfMemory("out of device memory while filling"),
    errors.WorkerDied("loader worker was killed by SIGKILL"),
    errors.DeviceNotReady("NVML: driver not loaded"),
    errors.CheckpointMissing("checkpoint /mnt/models/llama does not exist"),
    errors.FillStalled("the fill made no progress for 600 s"),
    errors.LockHeldError("another daemon (pid 42) serves cpu0"),
    errors.WorkerNotRunnable("WCACHED_PYTHON /opt/venv/bin/python3 cannot be run"),
    errors.FillError("the loader worker failed"),
    RuntimeError("a bug nobody foresaw"),
]
PERMANENT = [
    errors.ConfigError("/etc/wcache/wcached.toml", "daemon.max_clients", "must be >= 1"),
    errors.CheckpointCorrupt("model.safetensors: tensor 'w' ends early"),
    errors.FillMisconfigured("no safetensors files in /srv/m"),
    errors.CheckpointUnreadable("user wcache cannot read /srv/m"),
    errors.TooManyFiles("/mnt has over 100000 files"),
    errors.DeviceError("no GPU with index 7"),
    errors.LockForeign("lock /run/wcache/0.lock belongs to root"),
    errors.UnservableModel("a quantization each engine must post-process"),
]


def _serve_failing_with(monkeypatch, error: BaseException) -> int:
    """The status ``wcached serve`` exits with when ``error`` ends its start."""
    from wcached.daemon import service

    def fail(*_args: object, **_kw: object) -> None:
        raise error

    monkeypatch.setattr(service, "load_config", fail)
    monkeypatch.setattr(service.Notifier, "status", lambda self, text: None)
    return service.serve("cpu0", None)


@pytest.mark.parametrize("error", TEMPORARY, ids=lambda e: type(e).__name__)
def test_a_temporary_failure_is_one_the_unit_retries(monkeypatch, error: BaseException) -> None:
    """Out of memory, a dead worker, a device or mount not there yet: serve's
    exit status is one the packaged unit restarts on, with no operator."""
    status = _serve_failing_with(monkeypatch, error)
    assert status not in (0, 1), status
    assert _unit_retries(status), f"{type(error).__name__} exits {status}, which the unit does not retry"


@pytest.mark.parametrize("error", PERMANENT, ids=lambda e: type(e).__name__)
def test_a_permanent_failure_is_one_the_unit_does_not_retry(monkeypatch, error: BaseException) -> None:
    """A configuration mistake or a corrupt checkpoint: retrying cannot fix
    it, so serve exits with a status the unit stays failed on."""
    status = _serve_failing_with(monkeypatch, error)
    assert status != 0, status
    assert not _unit_retries(status), (
        f"{type(error).__name__} exits {status}, which the unit retries in a loop"
    )


def test_a_status_with_several_causes_gets_each_fix_and_an_unknown_one_the_journal() -> None:
    fixes = exits.fix(69, "wcached@0.service").split("; or ")
    assert len(fixes) == 3 and fixes[0].startswith("findmnt") and fixes[1].startswith("nvidia-smi")
    assert "systemctl restart wcached@0.service" in fixes[2]
    assert exits.fix(0, "wcached@0.service") == "journalctl -u wcached@0.service -e"  # stopped
    assert exits.fix(143, "wcached@0.service") == "journalctl -u wcached@0.service -e"


def test_errors_from_the_wire_keep_their_message_and_an_unknown_code_is_a_plain_error() -> None:
    err = errors.error_for_code("config", "/etc/wcache/wcached.toml: key 'x': bad")
    assert type(err) is errors.ConfigError and str(err) == "<config>: /etc/wcache/wcached.toml: key 'x': bad"
    assert (err.path, err.key) == (None, None)
    err = errors.error_for_code("a-code-of-a-later-release", "what it said")
    assert type(err) is errors.WcacheError and str(err) == "what it said"


def test_a_config_error_names_file_and_key_as_given() -> None:
    from pathlib import Path

    err = errors.ConfigError(Path("/etc/wcache/wcached.toml"), "daemon.socket_dir", "too long")
    assert err.path == "/etc/wcache/wcached.toml" and isinstance(err.path, str)
    assert str(err) == "/etc/wcache/wcached.toml: key 'daemon.socket_dir': too long"
    assert str(errors.ConfigError(None, "", "no file")) == "<config>: no file"
