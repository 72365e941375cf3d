"""Logging to stderr, with syslog priority prefixes when stderr is the journal.

systemd sets ``JOURNAL_STREAM=<dev>:<inode>`` for a service whose stderr is
connected to journald; a line starting with ``<N>`` then gets priority N, so
``journalctl -p warning`` works without a journald client library.
"""

from __future__ import annotations

import logging
import os
import sys

_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}


def stderr_is_journal() -> bool:
    stream = os.environ.get("JOURNAL_STREAM", "")
    dev, _, ino = stream.partition(":")
    if not dev or not ino:
        return False
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return f"{st.st_dev}:{st.st_ino}" == stream


class JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        prio = _PRIORITY.get(record.levelno, 6)
        text = super().format(record)
        # Continuation lines (tracebacks) keep the priority of their record.
        return "\n".join(f"<{prio}>{line}" for line in text.splitlines())


def setup_logging(level: str = "info", name: str = "daemon") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if stderr_is_journal():
        # journald stamps time and unit itself.
        handler.setFormatter(JournalFormatter(f"{name}: %(message)s"))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s wcached {name}: %(message)s"))
    root = logging.getLogger("wcached")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
