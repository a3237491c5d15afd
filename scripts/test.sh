#!/usr/bin/env bash
# Installs everything (scripts/setup.sh) and runs every test.  Extra arguments go to pytest (and then
# only that run is made).
#
# Without arguments: every test on the daemon's default I/O loop (the engine), then a bounded set
# again on proton's Container (`--io container`, chosen by BROKER_FILTER_IO): the embedded broker's
# daemon tests, the daemon's operations tests (signals, TLS and SASL, pass-through) and the core proxy
# files against RabbitMQ 3.10 (about 1.5 min).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export SPARK_LOCAL_IP=127.0.0.1
if [ "$#" -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
.venv/bin/python -m pytest
CONTAINER_TESTS=(
    tests/embedded
    tests/ops/test_daemon.py
    tests/proxy/test_attach.py
    tests/proxy/test_filters.py
    tests/proxy/test_forwarding.py
    tests/proxy/test_queue.py
)
BROKER_FILTER_IO=container exec .venv/bin/python -m pytest "${CONTAINER_TESTS[@]}" -m "not rabbitmq4 and not rabbitmq_latest"
