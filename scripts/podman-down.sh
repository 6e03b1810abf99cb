#!/bin/sh
# Stops what scripts/podman-up.sh started: podvm's leftover containers, then the
# service whose PID is in service.pid. Other podman processes are left alone.
# Idempotent. The containers.conf decision in the state directory is kept.
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
STATE=${PODVM_STATE:-$REPO/.podvm}
SOCK=${PODVM_SOCKET:-$STATE/podman.sock}
PIDFILE=$STATE/service.pid

# Is $1 still our service? (Not a reused PID, not a zombie: both have another
# or an empty command line.)
ours() { tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" | grep -qF "system service --time=0 unix://$SOCK"; }

sh "$REPO/scripts/podman-clean.sh"

if pid=$(cat "$PIDFILE" 2>/dev/null) && ours "$pid"; then
	echo "podman-down: stopping service, pid $pid" >&2
	kill "$pid"
	i=0
	while ours "$pid"; do # not our child: poll rather than wait
		i=$((i + 1))
		[ $i -le 50 ] || { kill -9 "$pid" 2>/dev/null || true; break; }
		sleep 0.2
	done
fi
rm -f "$PIDFILE" "$SOCK"
