#!/bin/sh
# Stops what scripts/rootless-up.sh started and leaves no session behind:
# podvm's containers of the rootless user are removed, its service stopped,
# then every process of the user (its pause process, conmons, a podman
# stuck on a lock) is killed, its runtime directory and lock segment
# removed, as a logout would. The user, its subordinate IDs, its storage
# and test image stay for the next run. Idempotent; needs root.
set -u

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
RUSER=${PODVM_ROOTLESS_USER:-podvm-rootless}
log() { echo "rootless-down: $*" >&2; }

uid=$(id -u "$RUSER" 2>/dev/null) || exit 0
if [ -S "/run/user/$uid/podman/podman.sock" ]; then
	timeout 30 "$REPO/scripts/as-rootless" sh "$REPO/scripts/podman-clean.sh" || log "podman-clean failed or timed out"
	timeout 15 "$REPO/scripts/as-rootless" sh "$REPO/scripts/podman-down.sh" || log "podman-down failed or timed out"
fi
if pgrep -u "$uid" >/dev/null; then
	pkill -TERM -u "$uid"
	i=0
	while pgrep -u "$uid" >/dev/null && [ $i -lt 20 ]; do
		sleep 0.25
		i=$((i + 1))
	done
	pkill -KILL -u "$uid" 2>/dev/null || true
fi
# A podman killed while holding a container's lock leaves it held: the
# next service starts from a fresh segment.
rm -rf "/run/user/$uid" "/dev/shm/libpod_rootless_lock_$uid"
log "stopped; $RUSER has no process left"
