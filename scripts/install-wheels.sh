#!/bin/sh
# Installs broker-filter from a folder made by scripts/build-wheels.sh, without an index: only the
# wheels there can be used, so a dependency the package does not declare makes this fail.  The
# container image and the install test (tests/ops/test_install.py) both run this.
#   scripts/install-wheels.sh WHEEL_DIR [EXTRAS]               e.g. EXTRAS=journal
# PYTHON picks the interpreter (default python3; a virtualenv's python installs into it).
set -eu
[ $# -ge 1 ] || { echo "usage: $0 WHEEL_DIR [EXTRAS]" >&2; exit 2; }
wheel_dir=$1
extras=${2:-}
requirement=broker-filter
[ -n "$extras" ] && requirement="broker-filter[$extras]"
"${PYTHON:-python3}" -m pip install --disable-pip-version-check --quiet --no-index --find-links "$wheel_dir" "$requirement"
