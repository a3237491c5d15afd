#!/usr/bin/env bash
# Installs RabbitMQ 4.0 for the tests on a Debian 12 machine (run as root): Debian 13's rabbitmq-server
# (4.0.x, Erlang 27) needs trixie's libc, so it lives in a minimal trixie chroot and runs from there
# beside the system's RabbitMQ 3.10, on 127.0.0.1:5682 with its own node name (scripts/rabbitmq4.sh
# starts and stops it).
# Idempotent: when the chroot is complete a second run only checks (well under a second).
# Usage: scripts/setup-rabbitmq4.sh        (chroot: $BROKER_FILTER_RABBITMQ4_ROOT, default /opt/broker-filter-trixie)
# The same steps install a newer RabbitMQ from another Debian suite (scripts/setup-rabbitmq-latest.sh):
# BROKER_FILTER_RABBITMQ4_SUITE (trixie), _MIN and _BELOW (the accepted versions, 4.0 up to 4.1
# excluded; an empty _BELOW: no upper bound), _PORT (5682).
set -euo pipefail
root="${BROKER_FILTER_RABBITMQ4_ROOT:-/opt/broker-filter-trixie}"
suite="${BROKER_FILTER_RABBITMQ4_SUITE:-trixie}"
min="${BROKER_FILTER_RABBITMQ4_MIN:-4.0}"
below="${BROKER_FILTER_RABBITMQ4_BELOW-4.1}"
port="${BROKER_FILTER_RABBITMQ4_PORT:-5682}"
mirror="${BROKER_FILTER_TRIXIE_MIRROR:-http://deb.debian.org/debian}"
conf="listeners.tcp.1 = 127.0.0.1:$port
loopback_users = none
"
wanted="$min${below:+ up to $below (excluded)}"
# Debian unstable's Release file may be past its Valid-Until on a machine whose clock runs ahead.
apt_opts=()
[ "$suite" = trixie ] || apt_opts=(-o Acquire::Check-Valid-Until=false)

accepted() {  # the version is one this chroot is for
  dpkg --compare-versions "$1" ge "$min" && { [ -z "$below" ] || dpkg --compare-versions "$1" lt "$below"; }
}

installed_version() {  # the chroot's rabbitmq-server version, empty when absent
  dpkg-query --admindir="$1/var/lib/dpkg" -W -f='${db:Status-Abbrev} ${Version}' rabbitmq-server 2>/dev/null \
    | awk '$1 == "ii" {print $2}' || true
}

write_conf() {
  if [ "$(cat "$1/etc/rabbitmq/rabbitmq.conf" 2>/dev/null)" != "$(printf %s "$conf")" ]; then
    printf %s "$conf" > "$1/etc/rabbitmq/rabbitmq.conf"
  fi
}

version="$(installed_version "$root")"
if [ -n "$version" ] && [ ! -e "$root/debootstrap" ]; then
  if accepted "$version"; then write_conf "$root"; exit 0; fi
  echo "setup-rabbitmq4: $root holds rabbitmq-server $version, not $wanted: remove it and run again" >&2
  exit 1
fi

# Build in a side directory and move it in place only when complete: an interrupted run leaves no
# half-made chroot at $root, and the next run starts that side directory again.
work="$root.partial"
cleanup() {
  for m in "$work/dev" "$work/proc"; do
    if mountpoint -q "$m" 2>/dev/null; then umount "$m" || umount -l "$m"; fi
  done
}
trap cleanup EXIT
cleanup
if [ -e "$root" ]; then
  echo "setup-rabbitmq4: $root exists without a complete rabbitmq-server: remove it and run again" >&2
  exit 1
fi
rm -rf --one-file-system "$work"

command -v debootstrap >/dev/null 2>&1 || {
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
}
echo "setup-rabbitmq4: debootstrap --variant=minbase $suite $root"
debootstrap --variant=minbase "$suite" "$work" "$mirror" >"$work.log" 2>&1 || {
  tail -20 "$work.log" >&2
  echo "setup-rabbitmq4: debootstrap failed (log: $work.log)" >&2
  exit 1
}
# No service starts inside the chroot while packages install.
printf '#!/bin/sh\nexit 101\n' > "$work/usr/sbin/policy-rc.d"
chmod 755 "$work/usr/sbin/policy-rc.d"
mount -t proc proc "$work/proc"
mount --bind /dev "$work/dev"
echo "setup-rabbitmq4: apt-get install rabbitmq-server (in the chroot)"
# The node resolves its host name (localhost) at start.
[ -s "$work/etc/hosts" ] || printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' > "$work/etc/hosts"
chroot "$work" env DEBIAN_FRONTEND=noninteractive LC_ALL=C bash -c \
  "apt-get ${apt_opts[*]} update -qq && apt-get install -y -qq --no-install-recommends rabbitmq-server >/dev/null && apt-get clean" \
  >>"$work.log" 2>&1 || {
  tail -20 "$work.log" >&2
  echo "setup-rabbitmq4: installing rabbitmq-server in the chroot failed (log: $work.log)" >&2
  exit 1
}
cleanup
version="$(installed_version "$work")"
if ! accepted "$version"; then
  echo "setup-rabbitmq4: $suite gave rabbitmq-server '$version', expected $wanted" >&2
  exit 1
fi
write_conf "$work"
mv "$work" "$root"
rm -f "$work.log"
echo "setup-rabbitmq4: rabbitmq-server $version in $root"
