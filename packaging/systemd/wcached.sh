#!/bin/sh
# wcached launcher: runs the wcached package shipped in /usr/lib/wcached with
# the interpreter named by WCACHED_PYTHON (see /etc/default/wcached).
set -e
if [ -z "${WCACHED_PYTHON:-}" ] && [ -r /etc/default/wcached ]; then
    . /etc/default/wcached
fi
PY="${WCACHED_PYTHON:-/usr/bin/python3}"
if [ ! -x "$PY" ]; then
    echo "wcached: WCACHED_PYTHON=$PY is not an executable interpreter (see /etc/default/wcached)" >&2
    exit 69
fi
PYTHONPATH="/usr/lib/wcached${PYTHONPATH:+:$PYTHONPATH}"
# The package's bytecode is py3compile's (made at install, removed by
# py3clean): a Python run by hand as root adds none of its own.
PYTHONDONTWRITEBYTECODE=1
export PYTHONPATH PYTHONDONTWRITEBYTECODE WCACHED_PYTHON="$PY"
exec "$PY" -m wcached "$@"
