"""What a fill is made from, and the one rule that says a stored fill is stale.

A :class:`Provenance` is taken before a model is filled (so that a checkpoint
rewritten while it is read is not stamped as what was read), kept in the fd
store's record beside the manifest, and taken again at the next start: a
stored fill is served again only if nothing that made it changed: its parsed
``[[model]]`` table, the loader's environment (the worker's vLLM release) and
every checkpoint file's stat stamp (device, inode, size, modification time).
All of it is found without reading a checkpoint byte.

A checkpoint that cannot be looked at now (not there: a mount not up yet; not
readable by the daemon's user) is not a changed one: :class:`CheckpointAway`
says so, and the stored fill is kept until the path can be compared again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import msgspec

from wcached.daemon.fdstore import StoredModel
from wcached.errors import CheckpointMissing, CheckpointUnreadable, TooManyFiles
from wcached.loaders.base import EnvironmentUnknown, ModelConfig, get_loader, model_from_builtins
from wcached.loaders.checkpoint import Checkpoint, FileStamp

# [[model]] settings that change how a fill runs, not what it holds: changing
# them does not make a stored fill stale.
HOW_NOT_WHAT = frozenset({"read_threads", "fill_timeout_s"})


class NotRestorable(Exception):
    """Why a stored model is refilled instead (the message says what changed)."""


class CheckpointAway(Exception):
    """The checkpoint cannot be looked at now (absent or unreadable): neither
    the same nor changed. The message says which path and why."""


class EnvironmentAway(CheckpointAway):
    """The loader cannot tell its environment now (the worker's interpreter
    on a mount not up yet, a version query that timed out): not a change."""


class Provenance(msgspec.Struct, frozen=True, kw_only=True):
    """What one fill is made from."""

    # As the config parsed it (sizes as integers), ranks in canonical ids.
    model: ModelConfig
    environment: str
    checkpoint: tuple[FileStamp, ...]

    @classmethod
    def take(cls, model: ModelConfig, python: str) -> Provenance:
        """Raises :class:`CheckpointAway` (the checkpoint, or the loader's
        environment, cannot be looked at now) or :class:`NotRestorable` (a hub
        id: nothing to stamp, such a fill is never stored)."""
        if model.accepts_remote_path and not os.path.isabs(model.path):
            raise NotRestorable(f"{model.path} is a hub id, whose files cannot be stamped")
        try:
            stamps = Checkpoint(model.path).stamps()
        except TooManyFiles as e:
            raise NotRestorable(str(e)) from None
        except (CheckpointMissing, CheckpointUnreadable) as e:
            raise CheckpointAway(str(e)) from None
        return cls(model=model, environment=loader_environment(model, python), checkpoint=tuple(stamps))

    @classmethod
    def of_record(cls, record: StoredModel) -> Provenance:
        """What a stored record says its fill was made from; NotRestorable if
        its table no longer parses (a loader gone, a key renamed)."""
        try:
            model = model_from_builtins(record.config)
        except Exception as e:  # msgspec, a loader that no longer imports, a bad size
            raise NotRestorable(f"its stored [[model]] table is not usable now: {e}") from None
        return cls(model=model, environment=record.environment, checkpoint=tuple(record.checkpoint))

    def stale_reason(self, now: Provenance) -> str | None:
        """Why a fill made from ``self`` may not be served as ``now``'s, or
        None if it may. The only place that decides it."""
        was, new = _settings(self.model), _settings(now.model)
        changed = sorted(k for k in set(was) | set(new) if was.get(k) != new.get(k) and k not in HOW_NOT_WHAT)
        if changed:
            return f"its [[model]] settings changed: {', '.join(changed)}"
        if self.environment != now.environment:
            return f"the loader's environment changed ({self.environment} -> {now.environment})"
        return _stamps_differ(self.checkpoint, now.checkpoint, now.model.path)


def _settings(model: ModelConfig) -> dict:
    return msgspec.to_builtins(model)


def loader_environment(model: ModelConfig, python: str) -> str:
    """What outside the config decides a loader's output (for vLLM its
    release, part of the cache key); the loader says."""
    try:
        return get_loader(model.loader).environment(model, python)
    except EnvironmentUnknown as e:
        raise EnvironmentAway(str(e)) from None


def _stamps_differ(old: Sequence[FileStamp], new: Sequence[FileStamp], path: str) -> str | None:
    before = {s.path: s for s in old}
    after = {s.path: s for s in new}
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a is None:
            return f"checkpoint {path} has a new file {name}"
        if b is None:
            return f"checkpoint file {name} of {path} is gone"
        if (a.dev, a.ino) != (b.dev, b.ino):
            return f"checkpoint file {name} of {path} was replaced"
        if a.size != b.size or a.mtime_ns != b.mtime_ns:
            return f"checkpoint file {name} of {path} was modified"
    return None
