#!/bin/sh
# Stops what scripts/podman5-up.sh started, and nothing else:
#  1. through the API, removes podvm's containers (label io.podvm.managed)
#     and stops the other running ones, so Podman tears their network down;
#  2. ends the service's PID namespace: SIGTERM to its first process
#     (catatonit, which passes it to the service), SIGKILL after 10 s. The
#     kernel then kills whatever is left in it (conmons of containers and of
#     exec sessions, containers), and the service's mounts, all in its
#     private mount namespace, vanish with the last of them.
# Idempotent. Keeps the rootfs and the storage, so the next up is fast; to
# reclaim the disk after a down: rm -rf "${PODVM_STATE:-.podvm}/podman5".
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
STATE=${PODVM_STATE:-$REPO/.podvm}
[ -d "$STATE/podman5" ] || exit 0 # never started here
S5=$(cd "$STATE/podman5" && pwd -P)
SOCK=$S5/podman.sock
PIDFILE=$S5/service.pid

log() { echo "podman5-down: $*" >&2; }

# Not while scripts/podman5-up.sh runs (it calls us with the lock held).
if [ "${PODVM_PODMAN5_LOCKED:-}" != 1 ]; then
	exec 9>"$S5/lock"
	flock 9
fi

api() { curl -sS --max-time 30 --unix-socket "$SOCK" "$@"; }
ids() { grep -o '"Id":"[0-9a-f]*"' | cut -d'"' -f4; }
# Is $1 still our unshare? (Not a reused PID, not a zombie.)
ours() { tr '\0' '\n' 2>/dev/null <"/proc/$1/cmdline" | grep -qxF "$SOCK"; }

pid=$(cat "$PIDFILE" 2>/dev/null) || pid=
if [ -n "$pid" ] && ours "$pid"; then
	# 1. Containers, while the service answers.
	if curl -fsS --max-time 2 --unix-socket "$SOCK" http://d/_ping >/dev/null 2>&1; then
		for id in $(api -G http://d/v5.0.0/libpod/containers/json --data-urlencode all=true \
			--data-urlencode 'filters={"label":["io.podvm.managed"]}' | ids); do
			log "removing podvm container $id"
			api -X DELETE "http://d/v5.0.0/libpod/containers/$id?force=true&timeout=0" >/dev/null || true
		done
		for id in $(api http://d/v5.0.0/libpod/containers/json | ids); do
			api -X POST "http://d/v5.0.0/libpod/containers/$id/stop?timeout=0" >/dev/null || true
		done
	fi
	# 2. The namespace: its first process is unshare's only child.
	init=$(cat "/proc/$pid/task/$pid/children" 2>/dev/null) || init=
	log "stopping service, pid $pid"
	# shellcheck disable=SC2086 # empty or one PID
	[ -z "$init" ] || kill -TERM $init 2>/dev/null || true
	i=0
	while ours "$pid"; do # not our child: poll rather than wait
		i=$((i + 1))
		if [ $i -eq 50 ]; then
			log "still running after 10 s: killing it"
			# shellcheck disable=SC2086
			kill -KILL $init "$pid" 2>/dev/null || true
		fi
		[ $i -le 75 ] || { log "pid $pid did not exit"; exit 1; }
		sleep 0.2
	done
fi
rm -f "$PIDFILE" "$SOCK"
