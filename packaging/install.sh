#!/bin/sh
# make install: wcached on a systemd host without dpkg, the same files the
# .deb installs (the units, sysusers.d and tmpfiles.d from packaging/systemd/,
# the daemon in its private /usr/lib/wcached, the conffiles, the man pages).
#
#   make install                      # then: systemctl start wcached@cpu0
#   make install DESTDIR=/tmp/stage   # staged, nothing started or created
#
# The unit runs /usr/bin/wcached, so the prefix is /usr. Python modules the
# daemon imports are the host's to provide (Debian: python3-msgspec
# python3-xxhash python3-prometheus-client python3-tqdm; or a virtualenv
# named by WCACHED_PYTHON in /etc/default/wcached). Conffiles already there
# are kept.
set -eu
SRC=$(cd "$(dirname "$0")/.." && pwd)
D=${DESTDIR:-}
SYSTEMD="$SRC/packaging/systemd"

cd "$SRC"
find wcached -name '*.py' | LC_ALL=C sort | while read -r f; do
    install -D -m 0644 "$f" "$D/usr/lib/wcached/$f"
done
install -D -m 0755 "$SYSTEMD/wcached.sh" "$D/usr/bin/wcached"
install -D -m 0644 "$SYSTEMD/wcached@.service" "$D/usr/lib/systemd/system/wcached@.service"
install -D -m 0644 "$SYSTEMD/wcached.target" "$D/usr/lib/systemd/system/wcached.target"
install -D -m 0644 "$SYSTEMD/sysusers.conf" "$D/usr/lib/sysusers.d/wcached.conf"
install -D -m 0644 "$SYSTEMD/tmpfiles.conf" "$D/usr/lib/tmpfiles.d/wcached.conf"
[ -e "$D/etc/wcache/wcached.toml" ] || install -D -m 0644 etc/wcache/wcached.toml "$D/etc/wcache/wcached.toml"
[ -e "$D/etc/default/wcached" ] || install -D -m 0644 "$SYSTEMD/wcached.default" "$D/etc/default/wcached"
install -D -m 0644 docs/wcached.8 "$D/usr/share/man/man8/wcached.8"
install -D -m 0644 docs/wcached.toml.5 "$D/usr/share/man/man5/wcached.toml.5"
install -d -m 0755 "$D/var/lib/wcache/models"
# Bytecode once, as root (the launcher never writes any: PYTHONDONTWRITEBYTECODE).
python3 -m compileall -q -d /usr/lib/wcached "$D/usr/lib/wcached" >/dev/null || true

if [ -z "$D" ]; then
    # What the package's maintainer scripts do: the user, /run/wcache, the units.
    systemd-sysusers wcached.conf
    systemd-tmpfiles --create wcached.conf
    systemctl daemon-reload
    systemctl enable wcached.target >/dev/null 2>&1 || true
fi
