"""Build wcached_<version>_all.deb with dpkg-deb, offline.

The package ships the pure-Python ``wcached`` package in /usr/lib/wcached and a
launcher that runs it with the interpreter /etc/default/wcached names, so a host
whose torch / vLLM live in a virtualenv points wcached there.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from email.utils import formatdate
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "packaging" / "deb"
UNITS = REPO / "packaging" / "systemd"


def version() -> str:
    text = (REPO / "wcached" / "__init__.py").read_text()
    return re.search(r'__version__ = "([^"]+)"', text).group(1)


def put(root: Path, rel: str, data: bytes, mode: int = 0o644) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)


def build_epoch() -> int:
    """The last commit's time: reproducible builds, and no 1970 timestamps."""
    if "SOURCE_DATE_EPOCH" in os.environ:
        return int(os.environ["SOURCE_DATE_EPOCH"])
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "log", "-1", "--format=%ct"], capture_output=True, text=True, check=True
        ).stdout.strip()
        return int(out)
    except (OSError, subprocess.CalledProcessError, ValueError):
        return int(time.time())


def gz(data: bytes) -> bytes:
    # No name and a fixed mtime (lintian: package-contains-timestamped-gzip).
    return gzip.compress(data, compresslevel=9, mtime=0)


def build(out_dir: Path, work: Path, ver: str | None = None) -> Path:
    """The .deb of this tree; ``ver`` overrides the version (the package's
    and the daemon's own ``__version__``)."""
    tree_version = version()
    ver = ver or tree_version
    root = work / "root"
    if root.exists():
        shutil.rmtree(root)
    for src in sorted((REPO / "wcached").rglob("*.py")):
        data = src.read_bytes()
        if src == REPO / "wcached" / "__init__.py":
            data = data.replace(f'__version__ = "{tree_version}"'.encode(), f'__version__ = "{ver}"'.encode())
        put(root, f"usr/lib/wcached/{src.relative_to(REPO)}", data)
    put(root, "usr/bin/wcached", (HERE / "wcached.sh").read_bytes(), 0o755)
    put(root, "usr/lib/systemd/system/wcached@.service", (UNITS / "wcached@.service").read_bytes())
    put(root, "usr/lib/systemd/system/wcached.target", (UNITS / "wcached.target").read_bytes())
    put(root, "usr/lib/sysusers.d/wcached.conf", (UNITS / "wcached.sysusers").read_bytes())
    put(root, "usr/lib/tmpfiles.d/wcached.conf", (UNITS / "wcached.tmpfiles").read_bytes())
    put(root, "etc/wcache/wcached.toml", (REPO / "etc" / "wcache" / "wcached.toml").read_bytes())
    put(root, "etc/default/wcached", (UNITS / "wcached.default").read_bytes())
    # Where the README tells operators to put checkpoints (dpkg removes it
    # on purge once it is empty).
    (root / "var/lib/wcache/models").mkdir(parents=True)
    doc = "usr/share/doc/wcached"
    put(root, f"{doc}/copyright", (HERE / "copyright").read_bytes())
    put(root, f"{doc}/README.md.gz", gz((REPO / "README.md").read_bytes()))
    epoch = build_epoch()
    changelog = (
        f"wcached ({ver}) unstable; urgency=medium\n\n  * Release {ver}.\n\n"
        f" -- wcached developers <wcached@example.org>  {formatdate(epoch)}\n"
    )
    # A native package (no Debian revision): changelog.gz, not changelog.Debian.gz.
    put(root, f"{doc}/changelog.gz", gz(changelog.encode()))
    put(root, "usr/share/lintian/overrides/wcached", (HERE / "lintian-overrides").read_bytes())
    # The pages generated from the code (docs/, `make docs`), at this version.
    for page in ("wcached.8", "wcached.toml.5"):
        man = (REPO / "docs" / page).read_text().replace(f'"wcached {tree_version}"', f'"wcached {ver}"')
        put(root, f"usr/share/man/man{page[-1]}/{page}.gz", gz(man.encode()))

    files = sorted(p for p in root.rglob("*") if p.is_file())
    size_kib = sum((p.stat().st_size + 1023) // 1024 for p in files)
    debian = root / "DEBIAN"
    control = (HERE / "control.in").read_text().replace("@VERSION@", ver).replace("@SIZE@", str(size_kib))
    put(root, "DEBIAN/control", control.encode())
    put(root, "DEBIAN/conffiles", (HERE / "conffiles").read_bytes())
    for script in ("postinst", "prerm", "postrm"):
        put(root, f"DEBIAN/{script}", (HERE / script).read_bytes(), 0o755)
    md5 = "".join(
        f"{hashlib.md5(p.read_bytes()).hexdigest()}  {p.relative_to(root)}\n"
        for p in files
        if not str(p.relative_to(root)).startswith("etc/")
    )
    put(root, "DEBIAN/md5sums", md5.encode())
    for d in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        d.chmod(0o755)
    out_dir.mkdir(parents=True, exist_ok=True)
    deb = out_dir / f"wcached_{ver}_all.deb"
    for p in [root, *root.rglob("*")]:
        os.utime(p, (epoch, epoch), follow_symlinks=False)
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch))
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root), str(deb)],
        check=True,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    assert debian.is_dir()
    return deb


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(REPO / "dist"))
    p.add_argument("--work", default=str(REPO / "build" / "deb"))
    p.add_argument("--version", default=None, help="package version (default: wcached.__version__)")
    args = p.parse_args()
    print(build(Path(args.out), Path(args.work), args.version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
