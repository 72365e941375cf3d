"""Attach to a daemon's weights: ``with attach(model=..., instance=...) as a:``."""

from wcached.client.attach import Attachment, attach
from wcached.client.connection import DaemonConnection
from wcached.errors import (
    DaemonUnavailable,
    KeyMismatch,
    PermissionRefused,
    ProtocolError,
    WcacheError,
)

__all__ = [
    "Attachment",
    "DaemonConnection",
    "DaemonUnavailable",
    "KeyMismatch",
    "PermissionRefused",
    "ProtocolError",
    "WcacheError",
    "attach",
]
