#!/usr/bin/env bash
# Installs everything broker-filter and its tests need on a Debian 12 machine (run as root).
# Idempotent: a second run only checks.  Usage: scripts/setup.sh [--runtime-only]
# The full (test) set-up also installs RabbitMQ 4.0 in a trixie chroot (scripts/setup-rabbitmq4.sh:
# about 50 s once, well under a second when installed); BROKER_FILTER_RABBITMQ4=0 leaves it out.
set -euo pipefail
cd "$(dirname "$0")/.."
runtime_only=0
[ "${1:-}" = "--runtime-only" ] && runtime_only=1

need_apt=()
have() { command -v "$1" >/dev/null 2>&1; }
pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
have gcc || need_apt+=(gcc)
[ -e /usr/include/openssl/ssl.h ] || need_apt+=(libssl-dev)
python3 -c 'import sysconfig,os,sys; sys.exit(0 if os.path.exists(os.path.join(sysconfig.get_paths()["include"],"Python.h")) else 1)' \
  || need_apt+=(python3-dev)
if [ "$runtime_only" = 0 ]; then
  have rabbitmq-server || need_apt+=(rabbitmq-server)
  have java || need_apt+=(openjdk-17-jre-headless)
  have node || need_apt+=(nodejs)
  have npm || need_apt+=(npm)
  have openssl || need_apt+=(openssl)
  have ip || need_apt+=(iproute2)  # the replicas tests make network namespaces (ip netns)
fi
# The operations tests' tools, without their recommended extras: promtool and a Prometheus server
# (package prometheus) and headless Chromium (the backtest report's rendering test).
need_tools=()
if [ "$runtime_only" = 0 ]; then
  have promtool || need_tools+=(prometheus)
  have chromium || need_tools+=(chromium)
fi
if [ ${#need_apt[@]} -gt 0 ] || [ ${#need_tools[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need_apt[*]} ${need_tools[*]}"
  apt-get update -qq
fi
if [ ${#need_apt[@]} -gt 0 ]; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if [ ${#need_tools[@]} -gt 0 ]; then
  # The prometheus package would start its server as a service on port 9090: the tests run their own
  # on free ports, so no service is started (policy-rc.d for the install) and it stays disabled.
  policy=""
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT  # removed however the install ends
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy"
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_tools[@]}" >/dev/null
  if [ -n "$policy" ]; then
    rm -f "$policy"
    trap - EXIT
  fi
  if have systemctl && [ -d /run/systemd/system ]; then
    systemctl disable --now prometheus.service >/dev/null 2>&1 || true
  fi
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null
if [ "$runtime_only" = 1 ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -e .
  exit 0
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,spark,journal]'
if [ "$runtime_only" = 0 ]; then
  rabbitmq-plugins enable --offline rabbitmq_amqp1_0 >/dev/null
  if [ ! -d tests/js/node_modules/rhea ] || [ ! -d tests/js/node_modules/rhea-promise ]; then
    (cd tests/js && npm install --silent --no-audit --no-fund >/dev/null)
  fi
  if [ "${BROKER_FILTER_RABBITMQ4:-1}" != 0 ]; then
    bash scripts/setup-rabbitmq4.sh
  fi
fi
