"""``wcached verify``: is what a daemon serves what it filled, and still what
the checkpoint on disk holds?

Attaches like an engine, then for every tensor with a recorded digest hashes
the memory being served (GPU tensors are copied to the host in chunks) and
compares it with the manifest. For the safetensors loader it also reads each
tensor from the checkpoint on disk (cast as the fill cast it) and compares: a
checkpoint rewritten in place after the fill shows here, tensor by tensor.
Every difference is printed; the exit status is 1 if there is any, 3 if a
model had nothing that could be compared (never "ok"), 69 if no daemon
answers on the instance's socket.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from wcached import defaults, tensor_digest
from wcached.config import ModelConfig, load_config

# verify's status when some model had nothing to compare (no digests recorded,
# no checkpoint to read): never 0, which says verified.
EXIT_NOT_VERIFIED = 3


@dataclass
class Report:
    model: str
    checked_memory: int = 0
    checked_disk: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def verify_model(att: Any, model: ModelConfig | None) -> Report:
    """``att``: an attachment; ``model``: its ``[[model]]`` table (for the disk
    comparison), if the config names it."""
    manifest = att.manifest
    rep = Report(manifest.model)
    # Hashed as the fill hashed it: on the host, or on the GPU serving it.
    algorithm = manifest.attrs.get("digest", tensor_digest.HOST)
    for info in manifest.tensors:
        if info.alias_of is not None or not info.digest:
            continue
        if isinstance(att, HostBytes):
            got = att.digest(info, algorithm)
        else:
            got = tensor_digest.digest(att.tensors[info.name], algorithm, info.nbytes)
        rep.checked_memory += 1
        if got != info.digest:
            rep.problems.append(f"{info.name}: the memory served differs from what was filled")
    if not rep.checked_memory:
        rep.notes.append("no per-tensor digests were recorded by this fill (digest = false)")
    if model is None:
        rep.notes.append("not in this config: the checkpoint on disk is not compared")
        return rep
    if manifest.key.loader != "safetensors":
        _compare_fingerprint(manifest, model, rep)
        return rep
    # The checkpoint's bytes are hashed as the fill hashed its own: wmix128
    # where the served bytes live (a GPU), xxh3 on the host.
    device = (
        "cpu"
        if isinstance(att, HostBytes) or not att.tensors
        else str(next(iter(att.tensors.values())).device)
    )
    _compare_disk(manifest, model, rep, algorithm, device)
    return rep


def _compare_fingerprint(manifest: Any, model: ModelConfig, rep: Report) -> None:
    """Loaders whose tensors are not the checkpoint's bytes (vLLM fuses and
    transforms them): the checkpoint's fingerprint, and with ``fingerprint =
    "content"`` every byte the fill read."""
    from wcached.errors import WcacheError
    from wcached.loaders.vllm.key import checkpoint_fingerprint

    try:
        now = checkpoint_fingerprint(model.path)
    except (OSError, WcacheError) as e:
        now = f"unreadable ({e})"
    if manifest.key.fingerprint and now != manifest.key.fingerprint:
        rep.problems.append(f"checkpoint {model.path} changed since the fill (its fingerprint differs)")
    recorded = manifest.attrs.get("checkpoint.content")
    if recorded:
        from wcached.loaders.checkpoint import Checkpoint

        try:
            content = Checkpoint(model.path).content_digest()
        except (OSError, WcacheError) as e:
            rep.problems.append(f"checkpoint {model.path}: its bytes cannot be read ({e})")
            return
        rep.checked_disk += 1
        if content != recorded:
            rep.problems.append(f"checkpoint {model.path}: its bytes differ from those the fill read")
    else:
        rep.notes.append(
            f"{manifest.key.loader} loader: the checkpoint's fingerprint compared, not its bytes "
            '(fingerprint = "content" records them)'
        )


def _compare_disk(manifest: Any, model: ModelConfig, rep: Report, algorithm: str, device: str) -> None:
    from wcached.dtypes import BY_TORCH_NAME
    from wcached.errors import CheckpointCorrupt, FillError
    from wcached.loaders.checkpoint import Checkpoint, OpenFiles, cast_pieces, read_pieces

    try:
        ckpt = Checkpoint(model.path).headers()
    except FillError as e:
        rep.problems.append(f"checkpoint {model.path}: {e}")
        return
    by_name = {i.name: i for i in manifest.tensors}
    with OpenFiles() as files:
        for t in ckpt.tensors:
            info = by_name.get(t.name)
            if info is None:
                rep.problems.append(
                    f"{t.name}: in the checkpoint ({os.path.basename(t.file)}) but not served"
                )
                continue
            if not info.digest:
                continue
            out = BY_TORCH_NAME[info.dtype]
            if (out is not t.dtype or algorithm != tensor_digest.HOST) and not _has_torch():
                why = "cast at fill" if out is not t.dtype else f"its digest is {algorithm}"
                rep.notes.append(f"{t.name}: {why}, not compared with the disk (needs torch)")
                continue
            h = tensor_digest.stream(algorithm, device)
            try:
                fd = files.fd(t.file)
                # Read (and cast) as the fill did, a piece at a time.
                for piece in read_pieces(fd, t) if out is t.dtype else cast_pieces(fd, t, out):
                    h.update(piece)
            except CheckpointCorrupt:
                rep.problems.append(f"{t.name}: {os.path.basename(t.file)} is truncated now")
                continue
            except FillError as e:
                rep.problems.append(f"{t.name}: {e}")
                continue
            rep.checked_disk += 1
            if h.hexdigest() != info.digest:
                rep.problems.append(
                    f"{t.name}: {os.path.basename(t.file)} on disk differs from what is served "
                    "(the checkpoint changed since the fill)"
                )
    on_disk = {t.name for t in ckpt.tensors}
    for info in manifest.tensors:
        if info.alias_of is None and info.name not in on_disk:
            rep.problems.append(f"{info.name}: served but no longer in the checkpoint {model.path}")


class HostBytes:
    """A host-memory model's segments, mapped read-only without torch (a
    packaged host's /usr/bin/python3 has none): what verify hashes there.
    The memfds are checked as an engine's client checks them (sealed, as
    large as the manifest says) and each tensor's span as its views are."""

    def __init__(self, name: str, path: str, timeout: float = 10.0):
        import mmap

        from wcached.client.connection import DaemonConnection
        from wcached.errors import ProtocolError
        from wcached.memory.host import check_sealed
        from wcached.protocol.wire import close_fds

        self._conn = DaemonConnection(path, timeout, client="wcached verify")
        self._maps: list[mmap.mmap] = []
        try:
            self.manifest, fds = self._conn.attach(name)
            try:
                for fd, seg in zip(fds, self.manifest.segments, strict=True):
                    if seg.backend != "host":
                        raise ProtocolError(
                            f"segment {seg.index} is {seg.backend} memory: verify needs torch"
                        )
                    check_sealed(fd, seg.nbytes)
                    self._maps.append(mmap.mmap(fd, seg.nbytes, mmap.MAP_SHARED, mmap.PROT_READ))
            finally:
                close_fds(fds)
        except BaseException:
            self.close()
            raise

    def digest(self, info: Any, algorithm: str) -> str:
        import xxhash

        from wcached.errors import ProtocolError

        if algorithm != tensor_digest.HOST:
            raise ProtocolError(f"{info.name}: digest {algorithm!r} of host memory")
        m = self._maps[info.segment]
        if info.offset < 0 or info.offset + info.nbytes > len(m):
            raise ProtocolError(f"{info.name}: bytes {info.offset}+{info.nbytes} outside its segment")
        h = xxhash.xxh3_128()
        with memoryview(m) as view:
            h.update(view[info.offset : info.offset + info.nbytes])
        return h.hexdigest()

    def close(self) -> None:
        for m in self._maps:
            m.close()
        self._maps = []
        self._conn.close()

    def __enter__(self) -> HostBytes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _has_torch() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def run(instance: str, model_name: str | None, config: str | None, socket_dir: str | None) -> int:
    from wcached.client import attach
    from wcached.client.connection import DaemonConnection, find_socket_dir, socket_path
    from wcached.errors import WcacheError

    try:
        sdir = find_socket_dir(socket_dir, config)
        cfg = load_config(config) if config or os.path.exists(defaults.config_path()) else None
        with DaemonConnection(socket_path(instance, sdir), client="wcached verify") as conn:
            names = [m.name for m in conn.status().models if m.state == "ready"]
    except WcacheError as e:
        print(f"wcached: {e}")
        return e.exit_status
    if model_name:
        if model_name not in names:
            print(f"wcached: instance {instance} serves no model {model_name!r} (it serves {names})")
            return 2
        names = [model_name]
    if not names:
        # Nothing compared is no "ok" (all released, or none filled yet).
        print(f"wcached: instance {instance} serves no model to verify")
        return EXIT_NOT_VERIFIED
    configured = {m.name: m for m in cfg.model} if cfg else {}
    bad = unverified = 0
    for name in names:
        try:
            if _has_torch():
                with attach(
                    name, instance, socket_dir=sdir, client="wcached verify", keep_lease=False
                ) as att:
                    rep = verify_model(att, configured.get(name))
            else:
                with HostBytes(name, socket_path(instance, sdir)) as att:
                    rep = verify_model(att, configured.get(name))
        except WcacheError as e:
            print(f"{name}: cannot attach: {e}")
            bad += 1
            continue
        compared = rep.checked_memory + rep.checked_disk
        state = "DIFFERS" if rep.problems else "ok" if compared else "NOT VERIFIED"
        print(
            f"{name}: {state} ({rep.checked_memory} tensors checked in memory, "
            f"{rep.checked_disk} against the checkpoint)"
        )
        for p in rep.problems:
            print(f"  {p}")
        for n in rep.notes:
            print(f"  note: {n}")
        bad += bool(rep.problems)
        unverified += not rep.problems and not compared
    if bad:
        return 1
    # Nothing compared is no "ok": a monitor must not read it as verified.
    return EXIT_NOT_VERIFIED if unverified else 0
