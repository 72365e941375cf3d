"""Build wcached_<version>_all.deb with dpkg-buildpackage, offline.

``packaging/deb/debian/`` is an ordinary debhelper (compat 13) source
package, less the files any systemd host uses, which live in
``packaging/systemd/`` (the units, sysusers.d and tmpfiles.d, the launcher,
the unit's environment file; ``make install`` installs the same files). This
script only prepares what dpkg-buildpackage cannot make itself:

- a source tree: the project's files, ``debian/`` at its root, and the
  systemd files under the names debhelper looks for
  (:data:`SYSTEMD_FILES`);
- a copy of the tree at the version asked for (``--version``: debian/changelog
  and ``wcached.__version__`` both say it), dated by the last commit, so that
  two builds of one commit are the same bytes;
- the wheel of wcached that engines' virtualenvs install (client and vLLM
  plugin), built by pip from pyproject.toml (PEP 517) into debian/wheel/:
  the project's metadata needs a newer setuptools than Debian 12 ships.

Needs ``apt install debhelper dh-python build-essential``.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from email.utils import formatdate
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What the source package is made of.
SOURCES = ("wcached", "docs", "etc", "README.md", "pyproject.toml", "packaging/systemd")
DEBIAN = REPO / "packaging" / "deb" / "debian"
# packaging/systemd/<file> -> debian/<name> (dh_installsystemd,
# dh_installsysusers, dh_installtmpfiles and dh_installinit's /etc/default).
SYSTEMD_FILES = {
    "wcached@.service": "wcached@.service",
    "wcached.target": "wcached.target",
    "sysusers.conf": "wcached.sysusers",
    "tmpfiles.conf": "wcached.tmpfiles",
    "wcached.default": "wcached.default",
}


def version() -> str:
    text = (REPO / "wcached" / "__init__.py").read_text()
    return re.search(r'__version__ = "([^"]+)"', text).group(1)


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


# What building the package needs: apt install debhelper dh-python build-essential.
BUILD_PACKAGES = "debhelper dh-python build-essential"


def missing_tools() -> list[str]:
    """Tools and packages dpkg-buildpackage needs that this host lacks
    (dpkg-checkbuilddeps refuses to build without build-essential)."""
    missing = [t for t in ("dpkg-buildpackage", "dh", "dh_python3") if shutil.which(t) is None]
    try:
        status = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", "build-essential"], capture_output=True, text=True
        ).stdout
    except OSError:
        status = ""
    if "install ok installed" not in status:
        missing.append("build-essential")
    return missing


def prepare(src: Path, ver: str, epoch: int) -> None:
    """The source tree at ``ver`` in ``src``."""
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "wheel")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    shutil.copytree(DEBIAN, src / "debian", ignore=ignore)
    for name, as_name in SYSTEMD_FILES.items():
        shutil.copy2(REPO / "packaging" / "systemd" / name, src / "debian" / as_name)
    tree_version = version()
    init = src / "wcached" / "__init__.py"
    init.write_text(init.read_text().replace(f'__version__ = "{tree_version}"', f'__version__ = "{ver}"'))
    # Every file dated by the commit: the package's bytes depend on the
    # commit, not on when the tree was checked out.
    for path in [src, *src.rglob("*")]:
        os.utime(path, (epoch, epoch), follow_symlinks=False)
    # A native package: one version, no Debian revision.
    (src / "debian" / "changelog").write_text(
        f"wcached ({ver}) unstable; urgency=medium\n\n  * Release {ver}.\n\n"
        f" -- wcached developers <wcached@example.org>  {formatdate(epoch)}\n"
    )


def build_wheel(src: Path) -> Path:
    wheels = src / "debian" / "wheel"
    argv = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels)]
    if _has_setuptools(68):
        # Offline: this interpreter's setuptools builds it (pyproject.toml's
        # build-system), rather than one pip would fetch for an isolated build.
        argv.append("--no-build-isolation")
    subprocess.run([*argv, str(src)], check=True, env=dict(os.environ, PIP_NO_CACHE_DIR="1"))
    (wheel,) = wheels.glob("wcached-*.whl")
    # pip's build leaves its egg-info in the tree; the package does not want it.
    for junk in src.glob("*.egg-info"):
        shutil.rmtree(junk)
    shutil.rmtree(src / "build", ignore_errors=True)
    return wheel


def _has_setuptools(major: int) -> bool:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return int(dist_version("setuptools").split(".")[0]) >= major
    except (PackageNotFoundError, ValueError):
        return False


def build(out_dir: Path, work: Path, ver: str | None = None) -> Path:
    """The .deb of this tree; ``ver`` overrides the version (the package's
    and the daemon's own ``__version__``)."""
    missing = missing_tools()
    if missing:
        raise SystemExit(f"build_deb: {', '.join(missing)} not found: apt install {BUILD_PACKAGES}")
    ver = ver or version()
    epoch = build_epoch()
    src = work / f"wcached-{ver}"
    prepare(src, ver, epoch)
    build_wheel(src)
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch), DEB_BUILD_OPTIONS="nocheck")
    r = subprocess.run(
        ["dpkg-buildpackage", "--build=binary", "--no-sign", "--no-pre-clean"],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise SystemExit(f"dpkg-buildpackage failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    built = work / f"wcached_{ver}_all.deb"
    out_dir.mkdir(parents=True, exist_ok=True)
    deb = out_dir / built.name
    shutil.move(built, deb)
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
