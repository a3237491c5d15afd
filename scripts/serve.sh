#!/usr/bin/env bash
# Installs the daemon's runtime (scripts/setup.sh --runtime-only) and runs it.  Extra arguments go to
# `broker-filter serve`; with none it listens on 127.0.0.1:5672 with its embedded in-memory upstream.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --runtime-only
exec .venv/bin/broker-filter serve "$@"
