#!/usr/bin/env bash
# Installs everything (scripts/setup.sh) and runs every test.  Extra arguments go to pytest (and then
# only that run is made).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SPARK_LOCAL_IP=127.0.0.1
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
exec .venv/bin/python -m pytest
