"""Deciding, per model, whether what the fd store kept may be served again.

A stored model is served again only if nothing that made it has changed: the
``[[model]]`` table, the instance, the loader's environment (the worker's vLLM
release) and every checkpoint file's stat stamp (device, inode, size,
modification time). All of it is found without reading a checkpoint byte.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import msgspec

from wcached import __version__
from wcached.daemon.fdstore import FORMAT, FileStamp, StoredEntry, StoredModel, read_record
from wcached.daemon.state import HeldModel
from wcached.errors import WcacheError
from wcached.loaders.base import EnvironmentUnknown, ModelConfig, get_loader
from wcached.memory.host import check_sealed
from wcached.protocol.messages import Manifest

# A checkpoint directory is stamped file by file; beyond this many files it is
# not a checkpoint (a mount point given by mistake) and is not walked further.
MAX_STAMPED_FILES = 100_000


# [[model]] settings that change how a fill runs, not what it holds: changing
# them does not make a stored fill stale.
HOW_NOT_WHAT = frozenset({"read_threads", "fill_timeout_s"})


class NotRestorable(Exception):
    """Why a stored model is refilled instead (the message says what changed)."""


def checkpoint_stamps(path: str) -> list[FileStamp]:
    """Stamps of the checkpoint's files: the path itself, or every file under it
    (hidden entries left out: download tools keep lock files there)."""
    if os.path.isfile(path):
        files = [path]
    elif os.path.isdir(path):
        files = []
        for root, dirs, names in os.walk(path, onerror=_raise):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            files += [os.path.join(root, n) for n in sorted(names) if not n.startswith(".")]
            if len(files) > MAX_STAMPED_FILES:
                raise NotRestorable(f"{path} holds more than {MAX_STAMPED_FILES} files")
    else:
        raise NotRestorable(f"checkpoint {path} does not exist")
    stamps = []
    for f in files:
        try:
            st = os.stat(f)
        except OSError as e:
            raise NotRestorable(f"cannot stat {f}: {e.strerror}") from None
        rel = os.path.relpath(f, path) if f != path else os.path.basename(f)
        stamps.append(FileStamp(rel, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    return stamps


def _raise(e: OSError) -> None:
    raise NotRestorable(f"cannot list {e.filename}: {e.strerror}")


def loader_environment(model: ModelConfig, python: str) -> str:
    """What outside the config decides a loader's output (for vLLM its
    release, part of the cache key); the loader says."""
    try:
        return get_loader(model.loader).environment(model, python)
    except EnvironmentUnknown as e:
        raise NotRestorable(str(e)) from None


def make_record(
    model: ModelConfig,
    instance: str,
    environment: str,
    stamps: Sequence[FileStamp],
    manifest: Manifest,
    fill_seconds: float,
) -> StoredModel:
    return StoredModel(
        format=FORMAT,
        daemon_version=__version__,
        instance=instance,
        config=msgspec.to_builtins(model),
        environment=environment,
        checkpoint=list(stamps),
        manifest=manifest,
        fill_seconds=fill_seconds,
    )


def restore(entry: StoredEntry, model: ModelConfig, instance: str, python: str) -> HeldModel:
    """The stored model as held again, or :class:`NotRestorable` saying why.

    On success the entry's segment fds belong to the returned model and its
    record fd is closed; on failure the caller closes the entry.
    """
    if entry.record_fd is None:
        raise NotRestorable("its record is missing from the store (stopped while storing?)")
    try:
        record = read_record(entry.record_fd)
    except ValueError as e:
        raise NotRestorable(f"its stored record is not usable: {e}") from None
    if record.instance != instance:
        raise NotRestorable(f"it was stored by instance {record.instance}")
    now = msgspec.to_builtins(model)
    changed = sorted(
        k
        for k in set(now) | set(record.config)
        if now.get(k) != record.config.get(k) and k not in HOW_NOT_WHAT
    )
    if changed:
        raise NotRestorable(f"its [[model]] settings changed: {', '.join(changed)}")
    environment = loader_environment(model, python)
    if environment != record.environment:
        raise NotRestorable(f"the loader's environment changed ({record.environment} -> {environment})")
    _compare_stamps(record.checkpoint, checkpoint_stamps(model.path), model.path)
    manifest = record.manifest
    if sorted(entry.segment_fds) != list(range(len(manifest.segments))):
        raise NotRestorable(
            f"the store holds {len(entry.segment_fds)} of its {len(manifest.segments)} segments"
            " (FileDescriptorStoreMax= too low?)"
        )
    fds = [entry.segment_fds[i] for i in range(len(manifest.segments))]
    for fd, seg in zip(fds, manifest.segments, strict=True):
        if seg.backend == "host":
            try:
                check_sealed(fd, seg.nbytes)
            except WcacheError as e:
                raise NotRestorable(f"a stored segment is not usable: {e}") from None
    os.close(entry.record_fd)
    entry.record_fd = None
    entry.segment_fds = {}
    return HeldModel(manifest, fds, record.fill_seconds, origin="restored")


def _compare_stamps(old: Sequence[FileStamp], new: Sequence[FileStamp], path: str) -> None:
    before = {s.path: s for s in old}
    after = {s.path: s for s in new}
    for name in sorted(set(before) | set(after)):
        a, b = before.get(name), after.get(name)
        if a is None:
            raise NotRestorable(f"checkpoint {path} has a new file {name}")
        if b is None:
            raise NotRestorable(f"checkpoint file {name} of {path} is gone")
        if (a.dev, a.ino) != (b.dev, b.ino):
            raise NotRestorable(f"checkpoint file {name} of {path} was replaced")
        if a.size != b.size or a.mtime_ns != b.mtime_ns:
            raise NotRestorable(f"checkpoint file {name} of {path} was modified")
