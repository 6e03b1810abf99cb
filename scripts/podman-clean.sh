#!/bin/sh
# Removes the containers podvm left behind (label io.podvm.managed) whose owner
# process has ended, e.g. after a crashed test run. A live owner's (another
# clone's demo or tests, on the same storage) are left alone. Uses the local
# podman with podman-up's configuration, so it works whether or not the
# service is running. Touches nothing else.
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
STATE=${PODVM_STATE:-$REPO/.podvm}

command -v podman >/dev/null || exit 0
unset CONTAINER_HOST CONTAINER_CONNECTION
[ ! -f "$STATE/containers.conf" ] || export CONTAINERS_CONF="$STATE/containers.conf"

. "$REPO/scripts/lib.sh"
podman ps -aq >/dev/null # fails here, not silently in the pipeline below
ids=$(podvm_ended_containers podman)
if [ -n "$ids" ]; then
	echo "podman-clean: removing $(echo "$ids" | wc -l) container(s)" >&2
	# shellcheck disable=SC2086 # one ID per word
	podman rm -f -t 0 --ignore $ids >/dev/null
fi
