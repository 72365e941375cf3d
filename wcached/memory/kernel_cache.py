"""Built GPU kernels kept on disk from one process to the next.

Every fill runs in a fresh loader worker, and building the digest kernel
with NVRTC there took some 50 ms of each fill (an eighth of a warm 16 GB fill
on an H100, bench/results/cuda-attach-20261205). As Triton and torch's
inductor do, the built binary is kept under the user's cache directory
(``$XDG_CACHE_HOME``, which the packaged unit points at /var/cache/wcache),
named by a hash of everything that decides its bytes, so a change of source,
options or GPU architecture is a new name, never a stale file.

A kept file is code the GPU will run, so it is used only if it is a regular
file of this user that nobody else may write, and only whole: it starts
with the SHA-256 of what follows, because the CUDA driver does not survive
a damaged binary (a truncated CUBIN made ``cuModuleLoadData`` crash the
process on an H200). The caller still checks what it loads (the digest
kernel's self-check) and forgets a file that fails. A cache that cannot be
written costs only the next process a build.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("wcached.memory")

# A kept file: this tag, the SHA-256 of the payload, the payload.
_TAG = b"wcached-kernel-1\n"
_SUM = hashlib.sha256().digest_size


def cache_dir() -> Path:
    """Where built kernels are kept: ``$XDG_CACHE_HOME/wcached/kernels``
    (``~/.cache`` where the variable is unset or empty)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "wcached" / "kernels"


def entry(name: str, *inputs: str) -> Path:
    """The file that holds ``name`` built from ``inputs`` (its source,
    options, architecture: whatever changes the binary)."""
    key = hashlib.sha256("\0".join(inputs).encode()).hexdigest()[:32]
    return cache_dir() / f"{name}-{key}.bin"


def load(path: Path) -> bytes | None:
    """The kept bytes, or None where there are none to trust: no file, not
    readable, a symlink, not this user's, writable by group or others, or
    not whole (its checksum differs)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            log.debug("%s: not kept by this user alone; building the kernel instead", path)
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read()
    except OSError:
        return None
    finally:
        os.close(fd)
    head, payload = raw[: len(_TAG) + _SUM], raw[len(_TAG) + _SUM :]
    if head != _TAG + hashlib.sha256(payload).digest():
        log.info("%s is damaged (cut short or altered); building the kernel again", path)
        return None
    return payload


def store(path: Path, data: bytes) -> None:
    """Keep ``data`` at ``path``, whole or not at all (written aside, then
    renamed over). Failing to is no error: the next process builds again."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(_TAG + hashlib.sha256(data).digest() + data)
        os.replace(tmp, path)
    except OSError as e:
        log.debug("cannot keep the built kernel at %s: %s", path, e)
        with contextlib.suppress(OSError):
            tmp.unlink()


def forget(path: Path) -> None:
    """Remove a kept file that failed its check, so it is built afresh."""
    with contextlib.suppress(OSError):
        path.unlink()
