"""Each configured model's life, decided in one place.

A model of the instance is a :class:`Slot` that moves::

    (start) --stored in the fd store--> restored ------------------> held --> released
       |             |                                              ^
       |             +--> stale (changed: leaves the store) --+     |
       |             +--> away (checkpoint absent/unreadable:  |     |
       |                   stays in the store, unserved)       v     |
       +-------------------------------------------------> filling --+
                                                              |
                                                              +--> failed (reason)

and every transition does its side effects here: restore or fill, keep in
the fd store (as soon as the model is filled, not once the instance is), take
out of it, and what status and metrics show. The service asks the holdings to
restore and to fill; the server asks them for a model to attach, to release
one, and for status.

What survives what is decided by three rules, each written once:

- a stored fill is served again only if its :class:`Provenance` has not
  changed (:meth:`Provenance.stale_reason`);
- a checkpoint that cannot be looked at now is not a changed one: its stored
  fill stays in the store (``away``), and the start then fails as the path
  check says (69: not there yet, retried; 78: not readable), costing nothing;
- a model goes to the store when its fill completes, within the store's
  budget, so a later failure of the same start costs only the failing model.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import msgspec

from wcached import __version__
from wcached.daemon.fdstore import (
    FORMAT,
    FdStore,
    NotKept,
    StoredEntry,
    StoredModel,
    group_by_model,
    read_record,
)
from wcached.daemon.provenance import CheckpointAway, EnvironmentAway, NotRestorable, Provenance
from wcached.daemon.state import HeldModel
from wcached.device import Device
from wcached.errors import UnknownModel, WcacheError
from wcached.loaders.base import ModelConfig
from wcached.memory.host import check_sealed
from wcached.protocol.messages import ModelStatus

log = logging.getLogger("wcached.holdings")

State = Literal["configured", "restored", "stale", "away", "filling", "held", "released", "failed"]


@dataclass
class Slot:
    """One configured model of this instance."""

    model: ModelConfig  # canonical for the device, as parsed by the config
    state: State = "configured"
    # Why it is stale, away or failed (the journal line says the same).
    reason: str = ""
    held: HeldModel | None = None
    # Taken before its fill: what the stored record says it was made from.
    provenance: Provenance | None = None

    @property
    def name(self) -> str:
        return self.model.name


class Holdings:
    def __init__(self, models: Iterable[ModelConfig], device: Device, store: FdStore, python: str):
        self.device = device
        self.store = store
        self.python = python
        self.slots: dict[str, Slot] = {}
        for m in models:
            model = m.for_device(device)
            self.slots[model.name] = Slot(model)

    # -- at start: what the store kept -----------------------------------

    def restore(self, listened: list[tuple[str, int]]) -> None:
        """Serve again what the store kept and still matches; stale entries
        and those of no configured model leave the store; entries whose
        checkpoint is away stay in it."""
        entries, unknown = group_by_model(listened)
        if unknown:
            log.warning(
                "dropping %d fd(s) of unknown names from the store: %s", len(unknown), ", ".join(unknown)
            )
            self.store.remove(unknown)
        for slot in self.slots.values():
            entry = entries.pop(slot.name, None)
            if entry is not None:
                self._restore_one(slot, entry)
        for entry in entries.values():
            log.info(
                "dropping %s from the fd store: no longer configured for this instance",
                entry.model,
                extra={"model": entry.model},
            )
            entry.close()
            self.store.remove(entry.names)

    def _restore_one(self, slot: Slot, entry: StoredEntry) -> None:
        started = time.monotonic()
        name = slot.name
        try:
            held = self._held_from(slot, entry)
        except CheckpointAway as e:
            # Neither the same nor changed: kept for when it can be compared.
            entry.close()
            self.store.adopt(name, entry.names)
            self._move(slot, "away", str(e))
            log.warning(
                "%s stays in the fd store unserved until its checkpoint can be compared again: %s",
                name,
                e,
                extra={"model": name},
            )
            return
        except NotRestorable as e:
            entry.close()
            self.store.remove(entry.names)
            self._move(slot, "stale", str(e))
            log.warning("refilling %s, because %s", name, e, extra={"model": name})
            return
        self.store.adopt(name, entry.names)
        slot.held = held
        self._move(slot, "restored")
        m = held.manifest
        log.info(
            "restored %s from the fd store: %d tensors, %.1f MiB in %d segment(s) in %.0f ms, "
            "no checkpoint read",
            name,
            len(m.tensors),
            m.total_bytes / 2**20,
            len(m.segments),
            (time.monotonic() - started) * 1000,
            extra={"model": name},
        )

    def _held_from(self, slot: Slot, entry: StoredEntry) -> HeldModel:
        """The stored model as held again, or why not. On success the entry's
        segment fds belong to the returned model and its record fd is closed."""
        if entry.duplicated:
            raise NotRestorable(f"the store holds {entry.duplicated} twice (an earlier removal was lost)")
        if entry.record_fd is None:
            raise NotRestorable("its record is missing from the store (stopped while storing?)")
        try:
            record = read_record(entry.record_fd)
        except ValueError as e:
            raise NotRestorable(f"its stored record is not usable: {e}") from None
        if record.instance != self.device.instance_id:
            raise NotRestorable(f"it was stored by instance {record.instance}")
        reason = Provenance.of_record(record).stale_reason(Provenance.take(slot.model, self.python))
        if reason:
            raise NotRestorable(reason)
        manifest = record.manifest
        if sorted(entry.segment_fds) != list(range(len(manifest.segments))):
            raise NotRestorable(
                f"the store holds {len(entry.segment_fds)} of its {len(manifest.segments)} segments "
                "(stopped while storing, or FileDescriptorStoreMax= too low?)"
            )
        fds = [entry.segment_fds[i] for i in range(len(manifest.segments))]
        for fd, seg in zip(fds, manifest.segments, strict=True):
            if seg.backend == "host":
                try:
                    check_sealed(fd, seg.nbytes)
                except WcacheError as e:
                    raise NotRestorable(f"a stored segment is not usable: {e}") from None
        entry.close_record()
        entry.segment_fds = {}
        return HeldModel(
            manifest,
            fds,
            record.fill_seconds,
            origin="restored",
            phases=record.phases,
            read_bytes=record.read_bytes,
        )

    # -- filling -----------------------------------------------------------

    def to_fill(self) -> list[ModelConfig]:
        """The models this start must fill (in config order)."""
        return [s.model for s in self.slots.values() if s.state in ("configured", "stale", "away")]

    def begin_fill(self, models: list[ModelConfig]) -> None:
        """Before the worker starts: each model's provenance (so that a
        checkpoint rewritten while it is read is not stamped as what was read)."""
        for m in models:
            slot = self.slots[m.name]
            slot.provenance = None
            if self.store.enabled:
                try:
                    slot.provenance = Provenance.take(slot.model, self.python)
                except (EnvironmentAway, NotRestorable) as e:
                    # (EnvironmentAway first: it is a CheckpointAway too.)
                    log.warning("%s will not be kept in the fd store: %s", m.name, e, extra={"model": m.name})
                except CheckpointAway:
                    pass  # the fill's path check says what is wrong, at once
            self._move(slot, "filling")

    def filled(self, held: HeldModel) -> None:
        """A model the worker just filled: held, and kept in the store now."""
        slot = self.slots[held.name]
        slot.held = held
        self._move(slot, "held")
        if slot.provenance is None:
            return
        p = slot.provenance
        record = StoredModel(
            format=FORMAT,
            daemon_version=__version__,
            instance=self.device.instance_id,
            config=msgspec.to_builtins(p.model),
            environment=p.environment,
            checkpoint=list(p.checkpoint),
            manifest=held.manifest,
            fill_seconds=held.fill_seconds,
            phases=held.phases,
            read_bytes=held.read_bytes,
        )
        try:
            self.store.store(record, held.fds)
        except NotKept as e:
            log.warning(
                "%s not kept in the fd store, so a restart refills it: %s",
                slot.name,
                e,
                extra={"model": slot.name},
            )
            return
        log.info(
            "%s kept in the fd store (%d segment fds and its record; %d of %d in use)",
            slot.name,
            len(held.fds),
            self.store.used,
            self.store.limit,
            extra={"model": slot.name},
        )

    def fill_failed(self, reason: str) -> None:
        """The fill ended early: what was filled stays held (and stored)."""
        for slot in self.slots.values():
            if slot.state == "filling":
                self._move(slot, "failed", reason)

    # -- serving -----------------------------------------------------------

    @property
    def served(self) -> dict[str, HeldModel]:
        return {s.name: s.held for s in self.slots.values() if s.held is not None}

    def get(self, name: str) -> HeldModel:
        slot = self.slots.get(name)
        if slot is None or slot.held is None:
            served = ", ".join(sorted(self.served)) or "none"
            raise UnknownModel(f"no model {name!r} on {self.device.instance_id} (serving: {served})")
        return slot.held

    def release(self, name: str) -> HeldModel:
        """An operator's release: the memory goes once the last attached
        client lets go, the store's copies included (restarts refill it)."""
        held = self.get(name)
        held.release()
        self.store.remove_model(name)
        self._move(self.slots[name], "released")
        return held

    def statuses(self) -> list[ModelStatus]:
        """What status and metrics show of each model served (restored and
        held models are "ready", released ones "released")."""
        out = []
        for slot in self.slots.values():
            held = slot.held
            if held is None:
                continue
            m = held.manifest
            out.append(
                ModelStatus(
                    name=m.model,
                    state="released" if slot.state == "released" else "ready",
                    loader=m.key.loader,
                    bytes=m.total_bytes,
                    tensors=len(m.tensors),
                    segments=len(m.segments),
                    key=m.key,
                    filled_at=m.filled_at,
                    fill_seconds=held.fill_seconds,
                    origin=held.origin,
                    phases=held.phases,
                    read_bytes=held.read_bytes,
                )
            )
        return out

    def close(self) -> None:
        """At exit: this process's fds go; the store keeps its own copies."""
        for slot in self.slots.values():
            if slot.held is not None:
                slot.held.release()

    # -- one place for every transition -------------------------------------

    def _move(self, slot: Slot, state: State, reason: str = "") -> None:
        log.debug("%s: %s -> %s %s", slot.name, slot.state, state, reason, extra={"model": slot.name})
        slot.state = state
        slot.reason = reason
