from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.helpers import multi_dtype_tensors, open_tmpdir, tied_model_config, write_sharded


def cuda_available() -> bool:
    try:
        import torch

        if not torch.cuda.is_available():
            return False
        import cuda.bindings.driver  # noqa: F401
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


def pytest_collection_modifyitems(config, items) -> None:
    if cuda_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA, cuda-bindings and NVML (run on the GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_lease_outlives_its_test() -> None:
    """A test that leaves an attachment open leaves its lease watched: once its
    daemon is gone the watcher keeps retrying it, opening sockets that later
    tests see as their own fds. Stop each lease at the end of its test."""
    yield
    lease = sys.modules.get("wcached.client.lease")
    watcher = lease._Watcher._instance if lease is not None else None
    if watcher is not None:
        with watcher._lock:
            left = list(watcher._leases)
        for watch in left:
            watch.stop()


@pytest.fixture
def work() -> Path:
    path = open_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def sharded_ckpt(tmp_path_factory) -> Path:
    root = open_tmpdir()
    path = write_sharded(root / "ckpt", multi_dtype_tensors())
    yield path
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def cpu_config(work: Path, sharded_ckpt: Path) -> Path:
    return tied_model_config(work, sharded_ckpt, "64KiB", connection_timeout_s=2.0)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """One closing line: how many tests were skipped, grouped by why, so a
    green `make test` that skipped the package or GPU tests says so."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    why: dict[str, int] = {}
    for report in skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        reason = reason.removeprefix("Skipped: ")
        why[reason] = why.get(reason, 0) + 1
    parts = [f"{n} {reason}" for reason, n in sorted(why.items(), key=lambda kv: -kv[1])]
    config.stash[_SKIP_LINE] = f"wcached: {len(skipped)} skipped: " + "; ".join(parts)


_SKIP_LINE = pytest.StashKey[str]()


def pytest_unconfigure(config) -> None:
    # After pytest's own counts: the last line a reader sees.
    line = config.stash.get(_SKIP_LINE, "")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if line and reporter is not None:
        reporter.write_line(line)
