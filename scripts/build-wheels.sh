#!/bin/sh
# Builds the wheel of broker-filter and a wheel of every dependency it declares into one folder, so
# that scripts/install-wheels.sh can install it offline.  The container image and the install test
# (tests/ops/test_install.py) both run this.
#   scripts/build-wheels.sh SOURCE_DIR WHEEL_DIR [EXTRAS]      e.g. EXTRAS=journal
# python-qpid-proton is published as source: pip compiles it (gcc and libssl-dev); pip's cache keeps
# the result unless PIP_NO_CACHE_DIR is set.  PYTHON picks the interpreter (default python3).
set -eu
[ $# -ge 2 ] || { echo "usage: $0 SOURCE_DIR WHEEL_DIR [EXTRAS]" >&2; exit 2; }
source_dir=$1
wheel_dir=$2
extras=${3:-}
requirement=$source_dir
[ -n "$extras" ] && requirement="$source_dir[$extras]"
"${PYTHON:-python3}" -m pip wheel --disable-pip-version-check --quiet --wheel-dir "$wheel_dir" "$requirement"
