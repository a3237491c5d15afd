#!/usr/bin/env bash
# Installs everything (scripts/setup.sh) and runs every test.  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SPARK_LOCAL_IP=127.0.0.1
exec .venv/bin/python -m pytest "$@"
