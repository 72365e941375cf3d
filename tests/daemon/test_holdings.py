"""Every transition of a model's life (wcached.daemon.holdings), in process:
real fills by the safetensors loader into host memory, a real notify socket
standing in for systemd's fd store (tests.helpers.NotifyListener)."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from tests.daemon.inprocess import DEVICE, fill
from tests.helpers import REPO, NotifyListener, fds_opened_since, open_fds
from wcached.daemon.fdstore import UNIT_FDSTORE_MAX, FdStore, fd_name
from wcached.daemon.holdings import Holdings
from wcached.daemon.state import HeldModel
from wcached.daemon.systemd import Notifier
from wcached.errors import ModelReleased, UnknownModel
from wcached.loaders.base import get_loader
from wcached.loaders.safetensors import SafetensorsModel
from wcached.memory.host import HostBackend


@pytest.fixture
def ckpt(work: Path, sharded_ckpt: Path) -> Path:
    return Path(shutil.copytree(sharded_ckpt, work / "ckpt"))


@pytest.fixture
def listener(work: Path):
    lst = NotifyListener(work)
    yield lst
    lst.close()


def _model(ckpt: Path, name: str = "default", **kw) -> SafetensorsModel:
    # As the config hands it over: sizes parsed.
    return SafetensorsModel(name=name, path=str(ckpt), segment_size=64 * 1024, **kw)


def _holdings(listener: NotifyListener, *models, limit: int | None = None) -> Holdings:
    store = FdStore(Notifier({"NOTIFY_SOCKET": listener.path}), limit=limit)
    return Holdings(models, DEVICE, store, python="")


def _listened(listener: NotifyListener) -> list[tuple[str, int]]:
    """The store as the next start gets it (LISTEN_FDS: its own copies)."""
    listener.drain()
    return [(name, os.dup(fd)) for name, fd in listener.store]


def _states(h: Holdings) -> dict[str, str]:
    return {name: slot.state for name, slot in h.slots.items()}


def test_filled_models_are_held_and_kept_record_first(listener: NotifyListener, ckpt: Path) -> None:
    h = _holdings(listener, _model(ckpt))
    assert _states(h) == {"default": "configured"}
    fill(h)
    assert _states(h) == {"default": "held"}
    segments = len(h.get("default").manifest.segments)
    assert listener.stored_names() == [fd_name("default", "manifest")] + [
        fd_name("default", f"seg{i}") for i in range(segments)
    ]
    assert h.store.used == segments + 1
    h.close()


def test_a_later_failure_costs_only_the_failing_model(listener: NotifyListener, ckpt: Path) -> None:
    """Kept as filled: the first model is in the store before the second is
    filled, and stays there when the second fails."""
    h = _holdings(listener, _model(ckpt, "first"), _model(ckpt, "second"))
    todo = h.to_fill()
    h.begin_fill(todo)
    filled = get_loader("safetensors").fill(todo[0], HostBackend(), DEVICE.instance_id, lambda *a: None)
    h.filled(HeldModel(filled.manifest, filled.fds, filled.fill_seconds))
    assert any(n.startswith(fd_name("first", "")) for n in listener.stored_names())
    h.fill_failed("second: truncated")
    assert _states(h) == {"first": "held", "second": "failed"}
    assert h.slots["second"].reason == "second: truncated"
    h.close()
    # The next start restores the first and fills only the second.
    again = _holdings(listener, _model(ckpt, "first"), _model(ckpt, "second"))
    again.restore(_listened(listener))
    assert _states(again) == {"first": "restored", "second": "configured"}
    assert [m.name for m in again.to_fill()] == ["second"]
    again.close()


def test_restore_of_an_unchanged_fill(listener: NotifyListener, ckpt: Path) -> None:
    h = _holdings(listener, _model(ckpt))
    fill(h)
    manifest = h.get("default").manifest
    h.close()
    again = _holdings(listener, _model(ckpt))
    again.restore(_listened(listener))
    assert _states(again) == {"default": "restored"}
    held = again.get("default")
    assert held.manifest == manifest and held.origin == "restored"
    assert again.store.used == len(manifest.segments) + 1  # still counted against the budget
    assert again.to_fill() == []
    again.close()


def test_a_record_of_an_unparsed_size_matches_the_parsed_setting(
    listener: NotifyListener, ckpt: Path
) -> None:
    """A record written with segment_size as the operator spelled it (older
    daemons) is compared parsed: "64KiB" is 65536."""
    h = _holdings(listener, SafetensorsModel(name="default", path=str(ckpt), segment_size="64KiB"))
    fill(h)
    h.close()
    again = _holdings(listener, _model(ckpt))
    again.restore(_listened(listener))
    assert _states(again) == {"default": "restored"}
    again.close()


def test_a_changed_checkpoint_is_stale_and_leaves_the_store(listener: NotifyListener, ckpt: Path) -> None:
    h = _holdings(listener, _model(ckpt))
    fill(h)
    h.close()
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 1))
    again = _holdings(listener, _model(ckpt))
    again.restore(_listened(listener))
    assert _states(again) == {"default": "stale"}
    assert "was modified" in again.slots["default"].reason
    assert listener.stored_names() == []
    assert [m.name for m in again.to_fill()] == ["default"]


def test_an_absent_checkpoint_is_away_not_changed(listener: NotifyListener, ckpt: Path) -> None:
    h = _holdings(listener, _model(ckpt))
    fill(h)
    h.close()
    stored = listener.stored_names()
    away = ckpt.with_name("ckpt.away")
    ckpt.rename(away)
    again = _holdings(listener, _model(ckpt))
    again.restore(_listened(listener))
    assert _states(again) == {"default": "away"}
    assert "does not exist" in again.slots["default"].reason
    assert listener.stored_names() == stored  # nothing removed
    assert again.store.used == len(stored)
    again.close()
    away.rename(ckpt)  # the mount is back: compared, and the same
    back = _holdings(listener, _model(ckpt))
    back.restore(_listened(listener))
    assert _states(back) == {"default": "restored"}
    back.close()


def test_a_record_without_its_segments_is_stale(listener: NotifyListener, ckpt: Path) -> None:
    h = _holdings(listener, _model(ckpt))
    fill(h)
    h.close()
    listened = _listened(listener)
    (seg1,) = [fd for name, fd in listened if name == fd_name("default", "seg1")]
    os.close(seg1)
    listened = [(name, fd) for name, fd in listened if fd != seg1]
    again = _holdings(listener, _model(ckpt))
    again.restore(listened)
    assert _states(again) == {"default": "stale"}
    segs = len(h.get("default").manifest.segments)
    assert again.slots["default"].reason == (
        f"the store holds {segs - 1} of its {segs} segments "
        "(stopped while storing, or FileDescriptorStoreMax= too low?)"
    )


def test_stored_models_no_longer_configured_leave_the_store(listener: NotifyListener, ckpt: Path) -> None:
    h = _holdings(listener, _model(ckpt, "gone"))
    fill(h)
    h.close()
    again = _holdings(listener, _model(ckpt))
    again.restore(_listened(listener))
    assert listener.stored_names() == []
    assert _states(again) == {"default": "configured"}


def test_release_leaves_the_store(listener: NotifyListener, ckpt: Path) -> None:
    h = _holdings(listener, _model(ckpt))
    fill(h)
    assert listener.stored_names()
    h.release("default")
    assert _states(h) == {"default": "released"}
    assert listener.stored_names() == [] and h.store.used == 0
    with pytest.raises(ModelReleased):
        h.get("default").check_served()
    with pytest.raises(UnknownModel):
        h.get("other")


def test_a_model_over_the_budget_is_held_not_stored(
    listener: NotifyListener, ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = _holdings(listener, _model(ckpt), limit=3)
    with caplog.at_level(logging.WARNING, "wcached.holdings"):
        fill(h)
    assert _states(h) == {"default": "held"}  # served all the same
    assert listener.stored_names() == []  # none of it: not a part that systemd would cut
    (line,) = [(text, model) for level, text, model in _journal(caplog) if level == "WARNING"]
    assert line[1] == "default"  # the MODEL= field
    line = line[0]
    assert line.startswith("default not kept in the fd store, so a restart refills it: ")
    segments = len(h.get("default").manifest.segments)
    assert f"needs {segments + 1} fds" in line and "3 the unit allows" in line
    assert "segment_size = " in line and "FileDescriptorStoreMax=" in line
    h.close()


def test_the_budget_counts_models_already_in_the_store(listener: NotifyListener, ckpt: Path) -> None:
    store = FdStore(Notifier({"NOTIFY_SOCKET": listener.path}), limit=5)
    store.adopt("restored", ["a", "b", "c"])
    h = Holdings([_model(ckpt)], DEVICE, store, python="")
    fill(h)  # 3 segments + a record do not fit beside 3 stored fds
    assert listener.stored_names() == []
    h.close()


def test_budget_is_read_from_systemd(listener: NotifyListener, monkeypatch: pytest.MonkeyPatch) -> None:
    notifier = Notifier({"NOTIFY_SOCKET": listener.path})
    monkeypatch.setenv("FDSTORE", "17")
    store = FdStore(notifier)
    assert store.limit == 17 and store.limit_source == "$FDSTORE"
    monkeypatch.setenv("FDSTORE", "0")  # FileDescriptorStoreMax=0: no store at all
    assert not FdStore(notifier).enabled
    monkeypatch.delenv("FDSTORE")
    assert FdStore(notifier).limit == UNIT_FDSTORE_MAX  # the unit's, where systemd does not say


def test_unit_file_budget_matches_the_daemons_default() -> None:
    unit = (REPO / "packaging" / "systemd" / "wcached@.service").read_text()
    assert f"FileDescriptorStoreMax={UNIT_FDSTORE_MAX}\n" in unit
    assert "FileDescriptorStorePreserve=yes\n" in unit


def test_a_loader_environment_that_cannot_be_told_now_is_away(
    listener: NotifyListener, ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's interpreter on a mount not up yet: neither the same nor
    changed, so the stored fill stays in the store."""
    from wcached.daemon import provenance
    from wcached.loaders.base import EnvironmentUnknown

    h = _holdings(listener, _model(ckpt))
    fill(h)
    h.close()
    stored = listener.stored_names()

    class Unreachable:
        def environment(self, model, python):
            raise EnvironmentUnknown(f"cannot ask {python} for its vLLM release: no such file")

    monkeypatch.setattr(provenance, "get_loader", lambda name: Unreachable())
    again = _holdings(listener, _model(ckpt))
    again.restore(_listened(listener))
    assert _states(again) == {"default": "away"}
    assert "cannot ask" in again.slots["default"].reason
    assert listener.stored_names() == stored
    again.close()


def test_refilling_a_model_whose_old_fill_is_in_the_store_replaces_it(
    listener: NotifyListener, ckpt: Path
) -> None:
    """An away model comes back changed: the fill's store replaces the old
    entries (one set of names, the budget counting it once)."""
    h = _holdings(listener, _model(ckpt))
    fill(h)
    h.close()
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    away = ckpt.with_name("ckpt.away")
    ckpt.rename(away)
    again = _holdings(listener, _model(ckpt))
    again.restore(_listened(listener))
    assert _states(again) == {"default": "away"}
    away.rename(ckpt)
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 1))
    fill(again)  # (the daemon would exit 69 first; its retry fills like this)
    names = listener.stored_names()
    assert len(names) == len(set(names)) == again.store.used
    again.close()


def test_a_name_stored_twice_is_served_from_neither(listener: NotifyListener, ckpt: Path) -> None:
    """A removal that never reached systemd, then a refill: two fds under one
    name. Which is whose cannot be told, so the model is refilled (and both
    leave the store, as systemd removes every fd of a name)."""
    h = _holdings(listener, _model(ckpt))
    fill(h)
    h.close()
    listened = _listened(listener)
    name, fd = listened[-1]
    listened.append((name, os.dup(fd)))
    again = _holdings(listener, _model(ckpt))
    again.restore(listened)
    assert _states(again) == {"default": "stale"}
    assert "twice" in again.slots["default"].reason
    assert listener.stored_names() == []


# -- what the journal says of each transition --------------------------------


def _journal(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str | None]]:
    """The holdings' lines as journald gets them: level, text and the MODEL=
    field (the ``model`` extra) an operator filters by."""
    return [
        (r.levelname, r.getMessage(), getattr(r, "model", None))
        for r in caplog.records
        if r.name == "wcached.holdings"
    ]


def _fill_with_phases(h: Holdings) -> None:
    fill(h, lambda f: HeldModel(f.manifest, f.fds, 1.5, phases={"read": 0.75}, read_bytes=4321))


def test_a_fill_and_its_restore_say_what_they_did_in_the_journal(
    listener: NotifyListener, ckpt: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = _holdings(listener, _model(ckpt))
    with caplog.at_level(logging.DEBUG, "wcached.holdings"):
        _fill_with_phases(h)
    m = h.get("default").manifest
    segs = len(m.segments)
    assert _journal(caplog) == [
        ("DEBUG", "default: configured -> filling ", "default"),
        ("DEBUG", "default: filling -> held ", "default"),
        (
            "INFO",
            f"default kept in the fd store ({segs} segment fds and its record; {segs + 1} of 4096 in use)",
            "default",
        ),
    ]
    h.close()
    caplog.clear()
    # The restore's time from the holdings' own clock: 250 ms.
    from types import SimpleNamespace

    import wcached.daemon.holdings as holdings

    clock = iter([100.0, 100.25])
    monkeypatch.setattr(holdings, "time", SimpleNamespace(monotonic=lambda: next(clock)))
    again = _holdings(listener, _model(ckpt))
    with caplog.at_level(logging.DEBUG, "wcached.holdings"):
        again.restore(_listened(listener))
    assert _journal(caplog) == [
        ("DEBUG", "default: configured -> restored ", "default"),
        (
            "INFO",
            f"restored default from the fd store: {len(m.tensors)} tensors, {m.total_bytes / 2**20:.1f} MiB "
            f"in {segs} segment(s) in 250 ms, no checkpoint read",
            "default",
        ),
    ]
    assert m.total_bytes / 2**20 >= 0.1  # the MiB figure is not 0.0 whatever its unit
    # What status shows of it: the fill before the restart, phase by phase.
    (status,) = again.statuses()
    assert (status.state, status.origin, status.fill_seconds, status.phases, status.read_bytes) == (
        "ready",
        "restored",
        1.5,
        {"read": 0.75},
        4321,
    )
    again.close()


def test_a_changed_checkpoint_says_it_is_refilled_and_why(
    listener: NotifyListener, ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = _holdings(listener, _model(ckpt))
    fill(h)
    h.close()
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 1))
    again = _holdings(listener, _model(ckpt))
    with caplog.at_level(logging.INFO, "wcached.holdings"):
        again.restore(_listened(listener))
    reason = again.slots["default"].reason
    assert "was modified" in reason
    assert _journal(caplog) == [("WARNING", f"refilling default, because {reason}", "default")]


def test_an_absent_checkpoint_says_its_fill_stays_stored_and_it_is_filled_again(
    listener: NotifyListener, ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = _holdings(listener, _model(ckpt))
    fill(h)
    h.close()
    ckpt.rename(ckpt.with_name("ckpt.away"))
    again = _holdings(listener, _model(ckpt), _model(ckpt, "other"))
    with caplog.at_level(logging.INFO, "wcached.holdings"):
        again.restore(_listened(listener))
    reason = again.slots["default"].reason
    assert _journal(caplog) == [
        (
            "WARNING",
            f"default stays in the fd store unserved until its checkpoint can be compared again: {reason}",
            "default",
        )
    ]
    # Away is filled again at this start (whose path check then says what is wrong).
    assert [m.name for m in again.to_fill()] == ["default", "other"]
    again.close()


def test_stored_models_of_no_configured_name_and_unknown_names_are_dropped_saying_so(
    listener: NotifyListener, ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    h = _holdings(listener, _model(ckpt, "gone"))
    fill(h)
    h.close()
    listened = _listened(listener)
    again = _holdings(listener, _model(ckpt))
    before = open_fds()
    strangers = [
        ("foreign/x/seg0", os.open("/dev/null", os.O_RDONLY)),
        ("wcache1/gone/segx", os.open("/dev/null", os.O_RDONLY)),
    ]
    with caplog.at_level(logging.INFO, "wcached.holdings"):
        again.restore(strangers + listened)
    assert _journal(caplog) == [
        (
            "WARNING",
            "dropping 2 fd(s) of unknown names from the store: foreign/x/seg0, wcache1/gone/segx",
            None,
        ),
        ("INFO", "dropping gone from the fd store: no longer configured for this instance", "gone"),
    ]
    listener.drain()
    removed = [
        line.removeprefix("FDNAME=")
        for m in listener.messages
        if "FDSTOREREMOVE=1" in m.split("\n")
        for line in m.split("\n")
        if line.startswith("FDNAME=")
    ]
    assert removed[:2] == ["foreign/x/seg0", "wcache1/gone/segx"]
    assert set(removed[2:]) == {name for name, _ in listened}
    assert fds_opened_since(before) == {}  # every fd handed over is closed
    assert again.store.used == 0


def test_a_stored_record_that_is_not_usable_is_stale_naming_why(listener: NotifyListener, ckpt: Path) -> None:
    from wcached.daemon.fdstore import read_record, write_record

    h = _holdings(listener, _model(ckpt))
    fill(h)
    h.close()
    listened = _listened(listener)
    (record_fd,) = [fd for name, fd in listened if name == fd_name("default", "manifest")]
    record = read_record(record_fd)
    others = [(n, fd) for n, fd in listened if fd != record_fd]
    os.close(record_fd)

    def restored_with(rfd: int) -> Holdings:
        again = _holdings(listener, _model(ckpt))
        again.restore([(fd_name("default", "manifest"), rfd)] + [(n, os.dup(fd)) for n, fd in others])
        return again

    garbage = os.memfd_create("garbage")
    os.write(garbage, b"\xc1")
    again = restored_with(garbage)
    assert _states(again) == {"default": "stale"}
    assert again.slots["default"].reason.startswith("its stored record is not usable: unreadable record: ")
    import msgspec

    again = restored_with(write_record(msgspec.structs.replace(record, instance="cpu7")))
    assert (again.slots["default"].state, again.slots["default"].reason) == (
        "stale",
        "it was stored by instance cpu7",
    )
    # A segment that is not the sealed memfd it was stored as.
    (seg0,) = [fd for n, fd in others if n == fd_name("default", "seg0")]
    unsealed = os.memfd_create("unsealed")
    os.ftruncate(unsealed, os.fstat(seg0).st_size)
    os.dup2(unsealed, seg0)
    os.close(unsealed)
    again = restored_with(write_record(record))
    assert again.slots["default"].state == "stale"
    assert again.slots["default"].reason.startswith("a stored segment is not usable: ")
    for _, fd in others:
        os.close(fd)


def test_asking_for_a_model_not_served_names_those_that_are(listener: NotifyListener, ckpt: Path) -> None:
    h = _holdings(listener, _model(ckpt), _model(ckpt, "second"))
    with pytest.raises(UnknownModel, match=r"^no model 'x' on cpu0 \(serving: none\)$"):
        h.get("x")
    fill(h)
    with pytest.raises(UnknownModel, match=r"^no model 'x' on cpu0 \(serving: default, second\)$"):
        h.get("x")
    h.release("default")
    assert [(s.name, s.state) for s in h.statuses()] == [("default", "released"), ("second", "ready")]
    h.close()


def test_a_restored_model_released_leaves_the_store(listener: NotifyListener, ckpt: Path) -> None:
    """What the store adopted at start is the model's: its release removes it."""
    h = _holdings(listener, _model(ckpt))
    fill(h)
    h.close()
    again = _holdings(listener, _model(ckpt))
    again.restore(_listened(listener))
    assert _states(again) == {"default": "restored"}
    again.release("default")
    assert listener.stored_names() == [] and again.store.used == 0
    again.close()


def test_status_shows_every_model_held_after_one_that_is_not(listener: NotifyListener, ckpt: Path) -> None:
    h = _holdings(listener, _model(ckpt, "first"), _model(ckpt, "second"))
    todo = h.to_fill()
    h.begin_fill(todo)
    filled = get_loader("safetensors").fill(todo[1], HostBackend(), DEVICE.instance_id, lambda *a: None)
    h.filled(HeldModel(filled.manifest, filled.fds, filled.fill_seconds))
    h.fill_failed("first: truncated")
    assert _states(h) == {"first": "failed", "second": "held"}
    assert [(s.name, s.state) for s in h.statuses()] == [("second", "ready")]
    h.close()


def test_models_are_held_as_made_for_the_instances_device(listener: NotifyListener, work: Path) -> None:
    """A rank written with the GPU's index reaches the fill (and the stored
    record) under the instance's canonical id."""
    from wcached.device import Device
    from wcached.loaders.vllm import VllmModel

    gpu1 = Device("cuda", "GPU-1111", 1, "H200", aliases=("1",))
    m = VllmModel(name="m", path=str(work), tensor_parallel_size=2, ranks={"0": 0, "1": 1})
    store = FdStore(Notifier({"NOTIFY_SOCKET": listener.path}))
    h = Holdings([m], gpu1, store, python="")
    assert h.slots["m"].model.ranks == {"0": 0, "GPU-1111": 1}
    assert h.to_fill()[0].rank_of("GPU-1111") == 1


class _EchoPython:
    """A loader whose environment is the interpreter it is asked about (as
    vLLM's is its release in the worker's interpreter)."""

    def environment(self, model, python):
        return f"python={python}"


def test_the_environment_is_the_workers_interpreters_at_fill_and_at_restore(
    listener: NotifyListener, ckpt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from wcached.daemon import provenance
    from wcached.daemon.fdstore import read_record

    monkeypatch.setattr(provenance, "get_loader", lambda name: _EchoPython())
    store = FdStore(Notifier({"NOTIFY_SOCKET": listener.path}))
    h = Holdings([_model(ckpt)], DEVICE, store, python="/venv-a/bin/python")
    fill(h)
    h.close()
    listened = _listened(listener)
    (record_fd,) = [fd for name, fd in listened if name == fd_name("default", "manifest")]
    assert read_record(os.dup(record_fd)).environment == "python=/venv-a/bin/python"
    same = Holdings(
        [_model(ckpt)], DEVICE, FdStore(Notifier({"NOTIFY_SOCKET": listener.path})), "/venv-a/bin/python"
    )
    same.restore([(n, os.dup(fd)) for n, fd in listened])
    assert _states(same) == {"default": "restored"}
    same.close()
    other = Holdings(
        [_model(ckpt)], DEVICE, FdStore(Notifier({"NOTIFY_SOCKET": listener.path})), "/venv-b/bin/python"
    )
    other.restore(listened)
    assert (other.slots["default"].state, other.slots["default"].reason) == (
        "stale",
        "the loader's environment changed (python=/venv-a/bin/python -> python=/venv-b/bin/python)",
    )


def test_a_fill_whose_provenance_cannot_be_taken_is_filled_but_not_stored_saying_why(
    listener: NotifyListener, ckpt: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The loader's environment unknown at fill time: nothing to stamp the
    fill with, so it is served and not kept (a restart refills it)."""
    from wcached.daemon import provenance
    from wcached.loaders.base import EnvironmentUnknown

    class Unreachable:
        def environment(self, model, python):
            raise EnvironmentUnknown("cannot ask /venv/bin/python for its vLLM release: timed out")

    monkeypatch.setattr(provenance, "get_loader", lambda name: Unreachable())
    h = _holdings(listener, _model(ckpt))
    with caplog.at_level(logging.WARNING, "wcached.holdings"):
        fill(h)
    assert _states(h) == {"default": "held"}
    assert listener.stored_names() == []
    assert _journal(caplog) == [
        (
            "WARNING",
            "default will not be kept in the fd store: "
            "cannot ask /venv/bin/python for its vLLM release: timed out",
            "default",
        )
    ]
    h.close()


def test_a_hub_id_is_filled_but_never_stored_saying_why(
    listener: NotifyListener, caplog: pytest.LogCaptureFixture
) -> None:
    from wcached.loaders.vllm import VllmModel

    h = _holdings(listener, VllmModel(name="m", path="org/model"))
    with caplog.at_level(logging.WARNING, "wcached.holdings"):
        h.begin_fill(h.to_fill())
    assert _states(h) == {"m": "filling"} and h.slots["m"].provenance is None
    assert _journal(caplog) == [
        (
            "WARNING",
            "m will not be kept in the fd store: org/model is a hub id, whose files cannot be stamped",
            "m",
        )
    ]
