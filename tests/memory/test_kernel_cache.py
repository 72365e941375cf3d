"""Built kernels kept on disk: found by what built them, used only when
this user alone could have written them, written whole or not at all."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from wcached.memory import kernel_cache


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "wcached" / "kernels"


def test_the_cache_is_under_xdg_cache_home_else_the_home_directory(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert kernel_cache.cache_dir() == cache
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert kernel_cache.cache_dir() == tmp_path / "home" / ".cache" / "wcached" / "kernels"


def test_each_input_names_its_own_entry(cache: Path) -> None:
    a = kernel_cache.entry("wmix128", "source", "--gpu-architecture=sm_90")
    assert a.parent == cache and a.name.startswith("wmix128-")
    assert a == kernel_cache.entry("wmix128", "source", "--gpu-architecture=sm_90")
    others = {
        kernel_cache.entry("wmix128", "source", "--gpu-architecture=sm_100"),
        kernel_cache.entry("wmix128", "source2", "--gpu-architecture=sm_90"),
        kernel_cache.entry("other", "source", "--gpu-architecture=sm_90"),
        # Inputs are kept apart, not run together.
        kernel_cache.entry("wmix128", "sourc", "e--gpu-architecture=sm_90"),
    }
    assert a not in others and len(others) == 4


def test_stored_bytes_come_back_and_nothing_is_left_aside(cache: Path) -> None:
    path = kernel_cache.entry("k", "x")
    assert kernel_cache.load(path) is None
    kernel_cache.store(path, b"\x7fELF built")
    assert kernel_cache.load(path) == b"\x7fELF built"
    assert os.listdir(cache) == [path.name]
    assert cache.stat().st_mode & 0o777 == 0o700
    assert path.stat().st_mode & 0o022 == 0
    kernel_cache.store(path, b"rebuilt")  # replaced whole
    assert kernel_cache.load(path) == b"rebuilt"
    assert os.listdir(cache) == [path.name]


def test_a_file_others_may_write_or_a_symlink_is_not_used(cache: Path, tmp_path: Path) -> None:
    path = kernel_cache.entry("k", "x")
    kernel_cache.store(path, b"built")
    for mode in (0o664, 0o646):
        path.chmod(mode)
        assert kernel_cache.load(path) is None, oct(mode)
    for mode in (0o644, 0o755, 0o600):  # read or run by others is fine: not written
        path.chmod(mode)
        assert kernel_cache.load(path) == b"built", oct(mode)
    elsewhere = tmp_path / "planted"
    elsewhere.write_bytes(path.read_bytes())  # whole, this user's: only the link is wrong
    path.unlink()
    path.symlink_to(elsewhere)
    assert kernel_cache.load(path) is None
    cache.joinpath("dir-bin").mkdir()
    assert kernel_cache.load(cache / "dir-bin") is None


def test_a_file_of_another_user_is_not_used(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = kernel_cache.entry("k", "x")
    kernel_cache.store(path, b"built")
    owner = path.stat().st_uid
    monkeypatch.setattr(kernel_cache.os, "geteuid", lambda: owner + 1)
    assert kernel_cache.load(path) is None


def test_a_cache_that_cannot_be_written_is_skipped(cache: Path) -> None:
    cache.parent.mkdir(parents=True)
    cache.write_text("a file where the directory should be")
    path = kernel_cache.entry("k", "x")
    kernel_cache.store(path, b"built")  # no error
    assert kernel_cache.load(path) is None


def test_a_failed_write_leaves_no_partial_file(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = kernel_cache.entry("k", "x")

    def no_rename(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kernel_cache.os, "replace", no_rename)
    kernel_cache.store(path, b"built")
    assert os.listdir(cache) == []


@pytest.mark.parametrize("damage", ["cut", "flip", "empty", "bare"])
def test_a_damaged_file_is_not_used(cache: Path, damage: str) -> None:
    # The CUDA driver crashed the process on a truncated CUBIN: a file that
    # is not whole never reaches it.
    path = kernel_cache.entry("k", "x")
    data = bytes(range(256)) * 4
    kernel_cache.store(path, data)
    raw = path.read_bytes()
    assert raw.endswith(data) and len(raw) > len(data)
    if damage == "cut":
        path.write_bytes(raw[:-1])
    elif damage == "flip":
        path.write_bytes(raw[:-10] + bytes([raw[-10] ^ 1]) + raw[-9:])
    elif damage == "empty":
        path.write_bytes(b"")
    else:  # the payload without its header, as an older build would have kept it
        path.write_bytes(data)
    assert kernel_cache.load(path) is None
    kernel_cache.store(path, data)
    assert kernel_cache.load(path) == data


def test_forget_removes_the_file_and_minds_no_absence(cache: Path) -> None:
    path = kernel_cache.entry("k", "x")
    kernel_cache.store(path, b"built")
    kernel_cache.forget(path)
    assert not path.exists()
    kernel_cache.forget(path)


def test_a_kept_file_is_written_for_reading_only_whatever_the_umask(cache: Path) -> None:
    path = kernel_cache.entry("k", "x")
    old = os.umask(0)
    try:
        kernel_cache.store(path, b"built")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o644
    assert kernel_cache.load(path) == b"built"


def test_a_link_planted_at_the_temporary_name_is_not_written_through(cache: Path, tmp_path: Path) -> None:
    path = kernel_cache.entry("k", "x")
    cache.mkdir(parents=True)
    victim = tmp_path / "victim"
    victim.write_bytes(b"untouched")
    (cache / f".{path.name}.{os.getpid()}.tmp").symlink_to(victim)
    kernel_cache.store(path, b"built")
    assert victim.read_bytes() == b"untouched"
    assert not path.exists()


def test_what_the_log_says_names_the_file_and_why(
    cache: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG, logger="wcached.memory")
    path = kernel_cache.entry("k", "x")
    kernel_cache.store(path, b"built")
    path.write_bytes(path.read_bytes()[:-1])
    kernel_cache.load(path)
    path.chmod(0o666)
    kernel_cache.load(path)

    def full(src: object, dst: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kernel_cache.os, "replace", full)
    kernel_cache.store(path, b"built")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, f"{path} is damaged (cut short or altered); building the kernel again"),
        (logging.DEBUG, f"{path}: not kept by this user alone; building the kernel instead"),
        (logging.DEBUG, f"cannot keep the built kernel at {path}: [Errno 28] No space left on device"),
    ]
