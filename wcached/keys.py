"""Cache key: what a client expects the daemon to hold.

The daemon holds each model under a full :class:`CacheKey`; a client sends the
fields it cares about and gets back the names of those that differ, so a
vLLM engine started with another dtype or tensor-parallel layout falls back to
disk and says exactly why.
"""

from __future__ import annotations

from typing import Any

import msgspec

from wcached.errors import BadRequest


class CacheKey(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    loader: str
    # sha256 over file names + sizes + safetensors headers (or every byte).
    fingerprint: str
    dtype: str
    tp_size: int = 1
    tp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0
    # Loader specifics (vLLM version, architecture, quantization hash, ...).
    extra: dict[str, str] = {}


KEY_FIELDS = tuple(f for f in CacheKey.__struct_fields__ if f != "extra")

ExpectValue = str | int


def mismatched_fields(held: CacheKey, expect: dict[str, Any]) -> list[str]:
    """Names of the expected fields whose values differ from ``held``.

    ``expect`` may name any key field or ``extra.<name>``; unknown names are a
    bad request rather than a silent match.
    """
    unknown = [k for k in expect if k not in KEY_FIELDS and not (k.startswith("extra.") and len(k) > 6)]
    if unknown:
        raise BadRequest(
            f"unknown cache key field(s) {', '.join(sorted(unknown))}; "
            f"known: {', '.join(KEY_FIELDS)}, extra.<name>"
        )
    differ = []
    for name, want in expect.items():
        if name.startswith("extra."):
            have: Any = held.extra.get(name[6:])
        else:
            have = getattr(held, name)
        if have != want:
            differ.append(name)
    return sorted(differ)


def describe_mismatch(held: CacheKey, expect: dict[str, Any], fields: list[str]) -> str:
    parts = []
    for name in fields:
        have = held.extra.get(name[6:]) if name.startswith("extra.") else getattr(held, name)
        parts.append(f"{name}: daemon holds {have!r}, client expects {expect[name]!r}")
    return "; ".join(parts)
