"""Logging: to the journal with fields when stderr is the journal, else text.

systemd sets ``JOURNAL_STREAM=<dev>:<inode>`` for a service whose stderr is
connected to journald. Then each record goes to journald's native socket as
one datagram with ``PRIORITY``, ``SYSLOG_IDENTIFIER=wcached``,
``WCACHED_INSTANCE`` and, for records about one model, ``WCACHED_MODEL``, so
that ``journalctl -u 'wcached@*' WCACHED_MODEL=llama-8b`` and ``-p warning``
work. Where that socket cannot take a record, the line goes to stderr with a
``<N>`` priority prefix (the stream protocol). Elsewhere: plain timestamped
text.

Log calls about a model pass ``extra={"model": name}``.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import sys

JOURNAL_SOCKET = "/run/systemd/journal/socket"
IDENTIFIER = "wcached"

_PRIORITY = {
    logging.DEBUG: 7,
    logging.INFO: 6,
    logging.WARNING: 4,
    logging.ERROR: 3,
    logging.CRITICAL: 2,
}

# The instance this process serves (or fills for): on every record.
_context = {"instance": ""}


def set_instance(instance: str) -> None:
    _context["instance"] = instance


def current_instance() -> str:
    return _context["instance"]


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
    """The stream protocol: ``<N>`` before every line of a record."""

    def format(self, record: logging.LogRecord) -> str:
        prio = _PRIORITY.get(record.levelno, 6)
        text = super().format(record)
        # Continuation lines (tracebacks) keep the priority of their record.
        return "\n".join(f"<{prio}>{line}" for line in text.splitlines())


def journal_fields(record: logging.LogRecord, message: str) -> dict[str, str]:
    fields = {
        "MESSAGE": message,
        "PRIORITY": str(_PRIORITY.get(record.levelno, 6)),
        "SYSLOG_IDENTIFIER": IDENTIFIER,
        "CODE_FILE": record.pathname,
        "CODE_LINE": str(record.lineno),
        "CODE_FUNC": record.funcName,
    }
    if _context["instance"]:
        fields["WCACHED_INSTANCE"] = _context["instance"]
    model = getattr(record, "model", None)
    if model:
        fields["WCACHED_MODEL"] = str(model)
    return fields


def encode_journal(fields: dict[str, str]) -> bytes:
    """journald's native format: ``KEY=value\\n``, or for a value with a
    newline ``KEY\\n`` + its length (64-bit little endian) + value + ``\\n``."""
    out = bytearray()
    for key, value in fields.items():
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            out += key.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += key.encode() + b"=" + data + b"\n"
    return bytes(out)


class JournalHandler(logging.Handler):
    """Records as native journal entries; stderr (stream protocol) for a
    record the socket does not take (too large, journald restarting)."""

    def __init__(self, fallback: logging.Handler, path: str = JOURNAL_SOCKET):
        super().__init__()
        self.fallback = fallback
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            self.sock.sendto(encode_journal(journal_fields(record, message)), self.path)
        except OSError:
            self.fallback.handle(record)
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        self.sock.close()
        super().close()


def setup_logging(level: str = "info", name: str = "daemon", instance: str | None = None) -> None:
    if instance is not None:
        set_instance(instance)
    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    if stderr_is_journal():
        # journald stamps time and unit itself.
        handler.setFormatter(JournalFormatter(f"{name}: %(message)s"))
        if os.path.exists(JOURNAL_SOCKET):
            native = JournalHandler(handler)
            native.setFormatter(logging.Formatter(f"{name}: %(message)s"))
            handler = native
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s wcached {name}: %(message)s"))
    root = logging.getLogger("wcached")
    for old in root.handlers:
        old.close()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
