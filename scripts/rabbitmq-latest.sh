#!/usr/bin/env bash
# The newest RabbitMQ Debian ships (unstable; 4.1+ applies filter expressions on streams), optional
# for the tests: `install` sets it up in its own chroot (/opt/broker-filter-sid, about a minute),
# the rest start, stop and control it (127.0.0.1:5692, node rabbit-latest@localhost, distribution
# port 25692) with scripts/rabbitmq4.sh.  scripts/setup.sh does not install it: Debian unstable
# moves, and the tests that need it are skipped without it.
# Usage: scripts/rabbitmq-latest.sh install | start | stop | status | ctl RABBITMQCTL-ARGS...
set -euo pipefail
here="$(dirname "$0")"
export BROKER_FILTER_RABBITMQ4_ROOT="${BROKER_FILTER_RABBITMQ_LATEST_ROOT:-/opt/broker-filter-sid}"
export BROKER_FILTER_RABBITMQ4_NODE=rabbit-latest@localhost BROKER_FILTER_RABBITMQ4_DIST_PORT=25692
if [ "${1:-}" = install ]; then
  BROKER_FILTER_RABBITMQ4_SUITE=sid BROKER_FILTER_RABBITMQ4_MIN=4.1 BROKER_FILTER_RABBITMQ4_BELOW= \
    BROKER_FILTER_RABBITMQ4_PORT=5692 exec bash "$here/setup-rabbitmq4.sh"
fi
exec bash "$here/rabbitmq4.sh" "$@"
