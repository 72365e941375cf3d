"""Restarts served from the fd store: real daemons, a stand-in for systemd's
store (tests.helpers.NotifyListener) that hands the fds back as LISTEN_FDS."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import (
    Daemon,
    as_bytes,
    load_reference,
    start_daemon,
    tied_model_config,
    wait_ready,
    write_config,
)
from wcached.client import attach
from wcached.client.connection import DaemonConnection
from wcached.daemon.fdstore import fd_name


@pytest.fixture
def ckpt(work: Path, sharded_ckpt: Path) -> Path:
    """A copy the test may rewrite."""
    return Path(shutil.copytree(sharded_ckpt, work / "ckpt"))


def _up(config: Path, store_from: Daemon | None = None, instance: str = "cpu0") -> Daemon:
    d = start_daemon(config, instance, store_from=store_from.notify if store_from else None)
    wait_ready(d, 60)
    d.notify.drain()
    return d


def _kill(d: Daemon, sig: int = signal.SIGKILL) -> None:
    d.stop(sig)
    d.notify.close(keep_store=True)


def _same_bytes(a, b) -> bool:
    return all(torch.equal(as_bytes(a.tensors[n]), as_bytes(b.tensors[n])) for n in a.tensors)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["crash", "restart"])
def test_restart_restores_without_reading_the_checkpoint(work: Path, ckpt: Path, sig: int) -> None:
    cfg = tied_model_config(work, ckpt, "64KiB")
    first = _up(cfg)
    segments = None
    try:
        old = attach("default", "cpu0", socket_dir=first.socket_dir)
        segments = len(old.manifest.segments)
        with DaemonConnection(first.socket_path) as conn:
            (filled,) = conn.status().models
        assert filled.origin == "filled"
        first_fill_seconds = filled.fill_seconds
        # The record first (a store cut short leaves it to say so), then
        # the segments, every name saying model and part.
        names = first.notify.stored_names()
        assert names == [fd_name("default", "manifest")] + [
            fd_name("default", f"seg{i}") for i in range(segments)
        ]
        _kill(first, sig)
        second = _up(cfg, store_from=first)
    except BaseException:
        first.stop(signal.SIGKILL)
        raise
    try:
        log = second.log()
        assert "restored default from the fd store" in log, log
        # Only the loader worker reads checkpoints, and none was started.
        assert "loader worker" not in log, log
        with attach("default", "cpu0", socket_dir=second.socket_dir) as new:
            assert new.manifest == old.manifest
            assert _same_bytes(new, old)
            reference = load_reference(ckpt)
            for name, ref in reference.items():
                assert torch.equal(as_bytes(new.tensors[name]), as_bytes(ref)), name
        # The store still holds the model for the next restart, once.
        assert sorted(second.notify.stored_names()) == sorted(names)
        # The old client attached again by itself: its lease is counted, its
        # tensors are the ones it had.
        deadline = time.monotonic() + 20
        while old.watch.reattached < 1:
            assert time.monotonic() < deadline, second.log()
            time.sleep(0.1)
        with DaemonConnection(second.socket_path) as conn:
            st = conn.status()
        assert os.getpid() in [c.pid for c in st.clients]
        # Status says where the weights came from, and keeps the fill's time.
        (model,) = st.models
        assert model.origin == "restored"
        assert model.fill_seconds == first_fill_seconds > 0
        assert torch.equal(as_bytes(old.tensors["embed.weight"]), as_bytes(reference["embed.weight"]))
    finally:
        old.close()
        second.stop()
        second.notify.close()


def _restart_reason(work: Path, cfg_before: Path, change, cfg_after: Path | None = None) -> str:
    first = _up(cfg_before)
    _kill(first)
    change()
    second = _up(cfg_after or cfg_before, store_from=first)
    try:
        log = second.log()
        assert "restored default" not in log, log
        assert "loader worker" in log, log
        # The refill replaced what was stored: one set of names, the new one.
        names = second.notify.stored_names()
        assert len(names) == len(set(names)), names
        with attach("default", "cpu0", socket_dir=second.socket_dir) as a:
            assert len(names) == len(a.manifest.segments) + 1
        return next(line for line in log.splitlines() if "refilling default, because" in line)
    finally:
        second.stop()
        second.notify.close()


def test_modified_checkpoint_is_refilled_naming_the_file(work: Path, ckpt: Path) -> None:
    cfg = tied_model_config(work, ckpt, "64KiB")
    shard = sorted(ckpt.glob("*.safetensors"))[0]

    def touch() -> None:
        st = shard.stat()
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))

    line = _restart_reason(work, cfg, touch)
    assert f"checkpoint file {shard.name} of {ckpt} was modified" in line


def test_client_of_a_refilled_model_keeps_its_weights_without_a_lease(work: Path, ckpt: Path) -> None:
    cfg = tied_model_config(work, ckpt, "64KiB")
    first = _up(cfg)
    old = attach("default", "cpu0", socket_dir=first.socket_dir)
    before = {n: as_bytes(t).clone() for n, t in old.tensors.items()}
    _kill(first)
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 1_000_000))
    second = _up(cfg, store_from=first)
    try:
        deadline = time.monotonic() + 20
        while old.watch.watching:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert old.watch.reattached == 0
        with DaemonConnection(second.socket_path) as conn:
            assert os.getpid() not in [c.pid for c in conn.status().clients]
        assert all(torch.equal(as_bytes(old.tensors[n]), b) for n, b in before.items())
    finally:
        old.close()
        second.stop()
        second.notify.close()


def test_replaced_checkpoint_file_is_refilled(work: Path, ckpt: Path) -> None:
    cfg = tied_model_config(work, ckpt, "64KiB")
    shard = sorted(ckpt.glob("*.safetensors"))[0]

    def replace() -> None:
        # Same bytes, same mtime, a new inode: a re-export copied into place.
        tmp = shard.with_suffix(".new")
        shutil.copy2(shard, tmp)
        os.replace(tmp, shard)

    line = _restart_reason(work, cfg, replace)
    assert f"checkpoint file {shard.name} of {ckpt} was replaced" in line


def _config(path: Path, work: Path, ckpt: Path, **model: object) -> Path:
    return write_config(
        path,
        models=[{"name": "default", "path": str(ckpt), **model}],
        daemon={"socket_dir": str(work / "run")},
    )


def test_changed_model_settings_are_refilled_naming_them(work: Path, ckpt: Path) -> None:
    before = _config(work / "before.toml", work, ckpt, segment_size="64KiB")
    # read_threads and fill_timeout_s change how a fill runs, not what it holds.
    after = _config(
        work / "after.toml",
        work,
        ckpt,
        segment_size="128KiB",
        digest=False,
        read_threads=1,
        fill_timeout_s=60.0,
    )
    line = _restart_reason(work, before, lambda: None, after)
    assert "its [[model]] settings changed: digest, segment_size" in line


def test_model_no_longer_configured_leaves_the_store(work: Path, ckpt: Path) -> None:
    both = write_config(
        work / "both.toml",
        models=[{"name": "default", "path": str(ckpt)}, {"name": "other", "path": str(ckpt)}],
        daemon={"socket_dir": str(work / "run")},
    )
    one = write_config(
        work / "one.toml",
        models=[{"name": "default", "path": str(ckpt)}],
        daemon={"socket_dir": str(work / "run")},
    )
    first = _up(both)
    assert any(n.startswith(fd_name("other", "")) for n in first.notify.stored_names())
    _kill(first)
    second = _up(one, store_from=first)
    try:
        log = second.log()
        assert "restored default" in log and "loader worker" not in log, log
        assert "dropping other from the fd store: no longer configured" in log, log
        assert not any(n.startswith(fd_name("other", "")) for n in second.notify.stored_names())
    finally:
        second.stop()
        second.notify.close()


def test_segments_without_their_record_are_refilled(work: Path, ckpt: Path) -> None:
    """A daemon killed while storing leaves segments without the record."""
    cfg = tied_model_config(work, ckpt, "64KiB")
    first = _up(cfg)
    _kill(first)
    record = fd_name("default", "manifest")
    os.close(next(fd for name, fd in first.notify.store if name == record))
    first.notify.store = [(n, fd) for n, fd in first.notify.store if n != record]
    second = _up(cfg, store_from=first)
    try:
        log = second.log()
        assert "refilling default, because its record is missing from the store" in log, log
        names = second.notify.stored_names()
        assert record in names and len(names) == len(set(names))
    finally:
        second.stop()
        second.notify.close()


def test_released_model_leaves_the_store(work: Path, ckpt: Path) -> None:
    cfg = tied_model_config(work, ckpt, "64KiB")
    d = _up(cfg)
    try:
        with DaemonConnection(d.socket_path) as conn:
            conn.release("default")
        assert d.notify.stored_names() == []
    finally:
        d.stop()
        d.notify.close()


def test_without_a_notify_socket_nothing_is_stored(work: Path, ckpt: Path) -> None:
    cfg = tied_model_config(work, ckpt, "64KiB")
    d = _up(cfg)
    try:
        assert "kept in the fd store" in d.log()
    finally:
        d.stop()
        d.notify.close()
    d = start_daemon(cfg, "cpu0", env={"NOTIFY_SOCKET": ""})
    try:
        deadline = time.monotonic() + 60
        while "serving cpu0" not in d.log():
            assert d.proc.poll() is None and time.monotonic() < deadline, d.log()
            time.sleep(0.1)
        with attach("default", "cpu0", socket_dir=d.socket_dir):
            pass
        assert "fd store" not in d.log()
    finally:
        d.stop()
        d.notify.close()


@pytest.mark.gpu
def test_gpu_segments_restored_after_sigkill(work: Path, ckpt: Path) -> None:
    """The same restore for CUDA segments: the exported VMM fds alone keep
    the GPU memory while no daemon runs."""
    from safetensors.torch import load_file

    reference = {}
    for f in sorted(ckpt.glob("*.safetensors")):
        reference.update(load_file(str(f), device="cuda"))
    cfg = tied_model_config(work, ckpt, "4MiB")
    first = _up(cfg, instance="0")
    try:
        old = attach("default", "0", socket_dir=first.socket_dir)
        assert old.manifest.segments[0].backend == "cuda"
        _kill(first)
        started = time.monotonic()
        second = _up(cfg, store_from=first, instance="0")
        ready_s = time.monotonic() - started
    except BaseException:
        first.stop(signal.SIGKILL)
        raise
    try:
        log = second.log()
        assert "restored default from the fd store" in log and "loader worker" not in log, log
        with attach("default", "0", socket_dir=second.socket_dir) as new:
            assert new.manifest == old.manifest
            for name, ref in reference.items():
                assert torch.equal(as_bytes(new.tensors[name]), as_bytes(ref)), name
        deadline = time.monotonic() + 20
        while old.watch.reattached < 1:
            assert time.monotonic() < deadline, second.log()
            time.sleep(0.1)
        for name, ref in reference.items():
            assert torch.equal(as_bytes(old.tensors[name]), as_bytes(ref)), name
        print(f"GPU restore: READY {ready_s:.2f} s after the restart; {len(old.manifest.segments)} segments")
    finally:
        old.close()
        second.stop()
        second.notify.close()


def _two_models(path: Path, work: Path, first: Path, second: Path) -> Path:
    return write_config(
        path,
        models=[
            {"name": "first", "path": str(first), "segment_size": "64KiB"},
            {"name": "second", "path": str(second), "segment_size": "64KiB"},
        ],
        daemon={"socket_dir": str(work / "run")},
    )


@pytest.mark.parametrize("instance", ["cpu0", pytest.param("0", marks=pytest.mark.gpu)])
def test_a_model_is_kept_as_it_fills_so_a_later_failure_costs_only_that_model(
    work: Path, ckpt: Path, instance: str
) -> None:
    """The second model's checkpoint is truncated: the start fails (65), yet
    the first model, filled before it, is in the store; once the second is
    fixed, the next start restores the first and fills only the second."""
    bad = Path(shutil.copytree(ckpt, work / "bad"))
    shard = sorted(bad.glob("*.safetensors"))[-1]
    os.truncate(shard, shard.stat().st_size // 2)
    cfg = _two_models(work / "two.toml", work, ckpt, bad)
    first = start_daemon(cfg, instance)
    assert first.wait_exit(60) == 65, first.log()
    names = first.notify.stored_names()
    assert names and all(n.startswith(fd_name("first", "")) for n in names), names
    first.notify.close(keep_store=True)
    shutil.rmtree(bad)
    shutil.copytree(ckpt, bad)
    second = _up(cfg, store_from=first, instance=instance)
    try:
        log = second.log()
        assert "restored first from the fd store" in log, log
        assert "filled second" in log and "filled first" not in log, log
        reference = load_reference(ckpt)
        with attach("first", instance, socket_dir=second.socket_dir) as a:
            for name, ref in reference.items():
                assert torch.equal(as_bytes(a.tensors[name]).cpu(), as_bytes(ref)), name
    finally:
        second.stop()
        second.notify.close()


def test_an_absent_checkpoint_keeps_its_stored_fill_until_it_is_back(work: Path, ckpt: Path) -> None:
    """Not there (a mount not up yet) is not changed: the start fails with
    69 (retried by the unit) and removes nothing from the store; once the
    path is back, the fill is compared and restored without a read."""
    cfg = tied_model_config(work, ckpt, "64KiB")
    first = _up(cfg)
    _kill(first)
    stored = sorted(name for name, _ in first.notify.store)
    away = ckpt.with_name("ckpt.away")
    ckpt.rename(away)
    retry = start_daemon(cfg, store_from=first.notify)
    try:
        assert retry.wait_exit(60) == 69, retry.log()
        assert "stays in the fd store unserved" in retry.log(), retry.log()
        assert sorted(retry.notify.stored_names()) == stored
    finally:
        away.rename(ckpt)
    retry.notify.close(keep_store=True)
    back = _up(cfg, store_from=retry)
    try:
        log = back.log()
        assert "restored default from the fd store" in log and "loader worker" not in log, log
    finally:
        back.stop()
        back.notify.close()


def test_a_respelled_segment_size_restores(work: Path, ckpt: Path) -> None:
    before = _config(work / "before.toml", work, ckpt, segment_size="64KiB")
    after = _config(work / "after.toml", work, ckpt, segment_size="65536B")
    first = _up(before)
    _kill(first)
    second = _up(after, store_from=first)
    try:
        log = second.log()
        assert "restored default from the fd store" in log and "loader worker" not in log, log
    finally:
        second.stop()
        second.notify.close()


def test_a_model_over_the_store_budget_is_served_and_not_stored(work: Path, ckpt: Path) -> None:
    """systemd says its budget in $FDSTORE; a model that needs more is not
    stored at all (systemd would cut it short), and the journal says why."""
    cfg = tied_model_config(work, ckpt, "64KiB")
    d = start_daemon(cfg, env={"FDSTORE": "2"})
    try:
        wait_ready(d, 60)
        with attach("default", "cpu0", socket_dir=d.socket_dir):
            pass
        assert d.notify.stored_names() == []
        log = d.log()
        assert "default not kept in the fd store" in log and "2 the unit allows ($FDSTORE)" in log, log
        assert "segment_size = " in log and "kept in the fd store (" not in log, log
    finally:
        d.stop()
        d.notify.close()


def test_a_file_added_to_the_checkpoint_is_refilled_naming_it(work: Path, ckpt: Path) -> None:
    """A shard copied into the checkpoint directory since the fill is a change:
    the stored fill is not served, and the journal names the new file."""
    cfg = tied_model_config(work, ckpt, "64KiB")
    shard = sorted(ckpt.glob("*.safetensors"))[0]

    def add() -> None:
        shutil.copy2(shard, ckpt / "model-extra.safetensors")

    line = _restart_reason(work, cfg, add)
    assert f"checkpoint {ckpt} has a new file model-extra.safetensors" in line, line


def _gated_worker(work: Path) -> tuple[Path, Path, Path]:
    """An interpreter for the loader worker that says it was started (the
    daemon has taken its stamps by then) and waits for a go before running."""
    import sys

    started, go = work / "worker-started", work / "worker-go"
    wrapper = work / "gated-python"
    wrapper.write_text(
        f'#!/bin/sh\ntouch {started}\nwhile [ ! -e {go} ]; do sleep 0.02; done\nexec {sys.executable} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper, started, go


def test_a_checkpoint_rewritten_while_it_is_filled_is_refilled_at_the_next_start(
    work: Path, ckpt: Path
) -> None:
    """A shard rewritten after the fill began (a fine-tune step landing while
    the daemon reads): what was stored may mix old and new bytes, so the next
    start must see a change and refill, never restore it as unchanged."""
    wrapper, started, go = _gated_worker(work)
    cfg = tied_model_config(work, ckpt, "64KiB", worker_python=str(wrapper))
    shard = sorted(ckpt.glob("*.safetensors"))[0]
    first = start_daemon(cfg)
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert first.proc.poll() is None and time.monotonic() < deadline, first.log()
            time.sleep(0.02)
        st = shard.stat()
        os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
        go.touch()
        wait_ready(first, 60)
        first.notify.drain()
        assert "kept in the fd store" in first.log(), first.log()
        _kill(first)
    except BaseException:
        first.stop(signal.SIGKILL)
        first.notify.close()
        raise
    second = _up(cfg, store_from=first)
    try:
        log = second.log()
        assert "restored default" not in log, log
        assert f"refilling default, because checkpoint file {shard.name} of {ckpt} was modified" in log, log
    finally:
        second.stop()
        second.notify.close()


def test_another_segment_size_is_refilled_and_the_refill_is_what_restores(work: Path, ckpt: Path) -> None:
    """The same tensors cut into segments of another size are another layout:
    the old segments are not served for it, and the refill takes their place
    in the store, so the start after that restores the new layout."""
    before = _config(work / "before.toml", work, ckpt, segment_size="64KiB")
    after = _config(work / "after.toml", work, ckpt, segment_size="1MiB")
    first = _up(before)
    with attach("default", "cpu0", socket_dir=first.socket_dir, keep_lease=False) as a:
        old_segments = len(a.manifest.segments)
    _kill(first)
    second = _up(after, store_from=first)
    try:
        assert "refilling default, because its [[model]] settings changed: segment_size" in second.log()
        with attach("default", "cpu0", socket_dir=second.socket_dir, keep_lease=False) as a:
            refilled = a.manifest
        assert len(refilled.segments) < old_segments, (len(refilled.segments), old_segments)
        _kill(second)
    except BaseException:
        second.stop(signal.SIGKILL)
        second.notify.close()
        raise
    third = _up(after, store_from=second)
    try:
        log = third.log()
        assert "restored default from the fd store" in log and "loader worker" not in log, log
        with attach("default", "cpu0", socket_dir=third.socket_dir, keep_lease=False) as a:
            assert a.manifest == refilled
            reference = load_reference(ckpt)
            for name, ref in reference.items():
                assert torch.equal(as_bytes(a.tensors[name]), as_bytes(ref)), name
    finally:
        third.stop()
        third.notify.close()


def test_a_released_model_was_stored_and_leaves_the_store(work: Path, ckpt: Path) -> None:
    """`wcached release` takes a model that was in the store out of it, so
    the next start refills it instead of restoring what was released."""
    cfg = tied_model_config(work, ckpt, "64KiB")
    d = _up(cfg)
    try:
        with attach("default", "cpu0", socket_dir=d.socket_dir, keep_lease=False) as a:
            segments = len(a.manifest.segments)
        assert sorted(d.notify.stored_names()) == sorted(
            [fd_name("default", "manifest")] + [fd_name("default", f"seg{i}") for i in range(segments)]
        )
        with DaemonConnection(d.socket_path) as conn:
            conn.release("default")
        assert d.notify.stored_names() == []
        _kill(d)
    except BaseException:
        d.stop(signal.SIGKILL)
        d.notify.close()
        raise
    again = _up(cfg, store_from=d)
    try:
        log = again.log()
        assert "restored default" not in log and "loader worker" in log, log
    finally:
        again.stop()
        again.notify.close()


def test_a_hidden_file_added_to_the_checkpoint_still_restores(work: Path, ckpt: Path) -> None:
    """Download tools keep lock and partial files under hidden names in the
    checkpoint directory: one appearing is no change to the weights, and the
    stored fill is restored without a read."""
    cfg = tied_model_config(work, ckpt, "64KiB")
    first = _up(cfg)
    _kill(first)
    (ckpt / ".model-00001-of-00002.safetensors.lock").write_text("")
    second = _up(cfg, store_from=first)
    try:
        log = second.log()
        assert "restored default from the fd store" in log and "loader worker" not in log, log
    finally:
        second.stop()
        second.notify.close()
