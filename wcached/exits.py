"""What each exit status of ``wcached serve`` means: one table, by cause.

An operator reads the exit status through systemd's ``Restart=`` policy,
``wcached status``, ``wcached doctor``, the journal, the README and
``wcached(8)``; every one of them is generated from (or tested against) this
table, so that they cannot drift apart. A cause decides the status, and the
status decides whether systemd retries: a temporary cause (a worker that
died, out of memory, a path or a device not there yet) is retried and costs
nothing (the fd store keeps what was filled); a permanent one (a configuration
mistake, a checkpoint whose bytes are wrong) stays failed until the fix named
here is applied.
"""

from __future__ import annotations

from dataclasses import dataclass

# sysexits(3) values that systemd units key on (RestartPreventExitStatus=).
EX_OK = 0
EX_DATAERR = 65
EX_UNAVAILABLE = 69
EX_SOFTWARE = 70
EX_TEMPFAIL = 75
EX_CONFIG = 78


@dataclass(frozen=True)
class Cause:
    status: int
    # What ended the run, as status and doctor say it.
    says: str
    # What fixes it ({unit}: the unit's name), as doctor suggests it.
    fix: str


CAUSES: tuple[Cause, ...] = (
    Cause(EX_OK, "stopped by SIGTERM/SIGINT", ""),
    Cause(
        EX_DATAERR,
        "a checkpoint's bytes are wrong (truncated, a corrupt header, a tensor that ends early); "
        "the journal names the file and tensor",
        "journalctl -u {unit} -e names the file and tensor: copy that file again, "
        "then: systemctl start {unit}",
    ),
    Cause(
        EX_UNAVAILABLE,
        "a checkpoint path does not exist yet (a network filesystem still mounting)",
        "findmnt for the checkpoint's mount; the unit retries by itself",
    ),
    Cause(
        EX_UNAVAILABLE,
        "the GPU is not usable yet (the driver or NVML not ready, a reset in progress)",
        "nvidia-smi; the unit retries by itself once the driver answers",
    ),
    Cause(
        EX_UNAVAILABLE,
        "WCACHED_PYTHON in /etc/default/wcached cannot be run",
        "point WCACHED_PYTHON at an interpreter (a virtualenv's bin/python3), then: systemctl restart {unit}",
    ),
    Cause(
        EX_SOFTWARE,
        "an unexpected error in the daemon or its loader worker (the traceback is in the journal at error "
        "priority), or a loader worker that died (killed by a signal, or exited without a word)",
        "journalctl -u {unit} -e has the traceback or the signal; the unit retries by itself; report a bug "
        "with the journal",
    ),
    Cause(
        EX_TEMPFAIL,
        "out of device or host memory while filling (the kernel's out-of-memory killer included), "
        "a fill that stalled (fill_timeout_s), or another daemon serving this device (its pid named)",
        "journalctl -u {unit} -e says which: nvidia-smi shows who holds device memory; "
        "systemctl list-units 'wcached@*' shows a second unit of one device (keep one); the unit retries",
    ),
    Cause(
        EX_CONFIG,
        "a configuration mistake (file and key named), an instance that names no device, a checkpoint "
        "the daemon's user cannot read (the file named), a socket path over 107 bytes, or a lock file of "
        "another user",
        "wcached check-config --user wcache; fix what it names, then: systemctl restart {unit}",
    ),
)

# Statuses a unit must not retry (the packaged unit's RestartPreventExitStatus=).
NOT_RETRIED = frozenset({EX_DATAERR, EX_CONFIG})


def retried(status: int) -> bool:
    """Whether the packaged unit (Restart=on-failure) starts the daemon again."""
    return status != EX_OK and status not in NOT_RETRIED


def meaning(status: int) -> str:
    """Every cause of ``status``, and whether systemd retries it."""
    says = [c.says for c in CAUSES if c.status == status]
    if not says:
        return "failed (a status wcached does not use: killed from outside?)"
    text = "; or ".join(says)
    if status == EX_OK:
        return text
    return f"{text} ({'retried' if retried(status) else 'not retried'})"


def fix(status: int, unit: str) -> str:
    """What doctor suggests for a unit that ended with ``status``."""
    fixes = [c.fix for c in CAUSES if c.status == status and c.fix]
    return "; or ".join(fixes).format(unit=unit) if fixes else f"journalctl -u {unit} -e"


def statuses() -> list[int]:
    return sorted({c.status for c in CAUSES})


def markdown_table() -> str:
    """The README's table of exit statuses (tests/test_exits.py keeps the
    README equal to it: ``python -m wcached.exits`` prints it)."""
    rows = ["| status | meaning | the unit |", "|---|---|---|"]
    for status in statuses():
        says = "; or ".join(c.says for c in CAUSES if c.status == status)
        unit = "stays stopped" if status == EX_OK else "retried" if retried(status) else "stays failed"
        rows.append(f"| {status} | {says} | {unit} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
