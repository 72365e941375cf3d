"""Log records as journal entries with fields, over a real datagram socket."""

from __future__ import annotations

import logging
import socket
import struct
from pathlib import Path

from wcached.log import JournalHandler, set_instance


def _parse(datagram: bytes) -> dict[str, str]:
    """journald's native format, as journald reads it."""
    fields, i = {}, 0
    while i < len(datagram):
        end = datagram.index(b"\n", i)
        line = datagram[i:end]
        if b"=" in line:
            key, _, value = line.partition(b"=")
            i = end + 1
        else:
            key = line
            (size,) = struct.unpack("<Q", datagram[end + 1 : end + 9])
            value = datagram[end + 9 : end + 9 + size]
            assert datagram[end + 9 + size : end + 10 + size] == b"\n"
            i = end + 10 + size
        fields[key.decode()] = value.decode()
    return fields


def test_records_carry_instance_model_and_priority(tmp_path: Path) -> None:
    journal = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    journal.bind(str(tmp_path / "journal.sock"))
    journal.settimeout(5)
    stderr = logging.Handler()
    handler = JournalHandler(stderr, str(tmp_path / "journal.sock"))
    handler.setFormatter(logging.Formatter("daemon: %(message)s"))
    logger = logging.getLogger("wcached.test_log")
    logger.handlers[:] = [handler]
    logger.propagate = False
    set_instance("0")
    try:
        logger.warning("filled %s", "llama-8b", extra={"model": "llama-8b"})
        one = _parse(journal.recv(65536))
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            logger.exception("fill failed")
        two = _parse(journal.recv(65536))
    finally:
        set_instance("")
        handler.close()
    assert one["MESSAGE"] == "daemon: filled llama-8b"
    assert (one["PRIORITY"], one["SYSLOG_IDENTIFIER"]) == ("4", "wcached")
    assert (one["WCACHED_INSTANCE"], one["WCACHED_MODEL"]) == ("0", "llama-8b")
    # A traceback is one entry, newlines and all; no model, no field.
    assert two["PRIORITY"] == "3" and "Traceback" in two["MESSAGE"] and "RuntimeError: boom" in two["MESSAGE"]
    assert "WCACHED_MODEL" not in two


def test_a_record_the_socket_does_not_take_goes_to_stderr(tmp_path: Path) -> None:
    seen: list[str] = []

    class Fallback(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = JournalHandler(Fallback(), str(tmp_path / "no-journal.sock"))
    logger = logging.getLogger("wcached.test_log_fallback")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.error("still said")
    handler.close()
    assert seen == ["still said"]
