from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.helpers import multi_dtype_tensors, open_tmpdir, write_config, write_sharded


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
    return write_config(
        work / "wcached.toml",
        models=[
            {
                "name": "default",
                "path": str(sharded_ckpt),
                "aliases": {"lm_head.weight": "embed.weight"},
                "segment_size": "64KiB",
            }
        ],
        daemon={"socket_dir": str(work / "run"), "connection_timeout_s": 2.0},
    )
