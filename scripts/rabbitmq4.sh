#!/usr/bin/env bash
# Starts, stops and controls the RabbitMQ 4.0 node installed by scripts/setup-rabbitmq4.sh (run as root).
# The node runs from its trixie chroot beside the system's RabbitMQ: AMQP on 127.0.0.1:5682, node
# name rabbit4@localhost, distribution port 25682, loopback only.  `start` mounts /proc and /dev in
# the chroot, `stop` stops the node and unmounts them again.
# Usage: scripts/rabbitmq4.sh start | stop | status | ctl RABBITMQCTL-ARGS...
#        (chroot: $BROKER_FILTER_RABBITMQ4_ROOT, default /opt/broker-filter-trixie; node name and
#        distribution port: $BROKER_FILTER_RABBITMQ4_NODE, $BROKER_FILTER_RABBITMQ4_DIST_PORT)
set -euo pipefail
root="${BROKER_FILTER_RABBITMQ4_ROOT:-/opt/broker-filter-trixie}"
node="${BROKER_FILTER_RABBITMQ4_NODE:-rabbit4@localhost}"
env_args=(RABBITMQ_NODENAME="$node" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
          RABBITMQ_DIST_PORT="${BROKER_FILTER_RABBITMQ4_DIST_PORT:-25682}" ERL_EPMD_ADDRESS=127.0.0.1
          HOME=/var/lib/rabbitmq LC_ALL=C.UTF-8
          "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}")

die() { echo "rabbitmq4: $*" >&2; exit 1; }
[ -x "$root/usr/sbin/rabbitmq-server" ] || die "no RabbitMQ chroot at $root (scripts/setup-rabbitmq4.sh installs it)"

mount_all() {
  mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
  mountpoint -q "$root/dev" || mount --bind /dev "$root/dev"
}

unmount_all() {
  local m
  for m in "$root/dev" "$root/proc"; do
    if mountpoint -q "$m"; then
      umount "$m" 2>/dev/null || { sleep 1; umount "$m"; }
    fi
  done
}

ctl() { chroot "$root" env "${env_args[@]}" rabbitmqctl "$@"; }

# Processes running inside the chroot (the node's beam, its epmd if it had to start one).
chroot_pids() {
  local p want
  want="$(readlink -f "$root")"
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$want" ] && echo "${p#/proc/}"
  done
  return 0
}

case "${1:-}" in
  start)
    mount_all
    chroot "$root" env "${env_args[@]}" rabbitmq-server -detached
    ;;
  stop)
    if [ -d "$root/proc/self" ]; then
      ctl stop >/dev/null 2>&1 || true
      # The node has gone; an epmd the chroot started (none when the system's epmd already ran) follows.
      for pid in $(chroot_pids); do
        if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = epmd ]; then kill "$pid" 2>/dev/null || true; fi
      done
      for _ in $(seq 50); do
        [ -z "$(chroot_pids)" ] && break
        sleep 0.2
      done
      [ -z "$(chroot_pids)" ] || die "processes still run in $root: $(chroot_pids | tr '\n' ' ')"
    fi
    unmount_all
    ;;
  status)
    ctl status
    ;;
  ctl)
    shift
    ctl "$@"
    ;;
  *)
    die "usage: $0 start | stop | status | ctl RABBITMQCTL-ARGS..."
    ;;
esac
