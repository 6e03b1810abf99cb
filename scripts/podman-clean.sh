#!/bin/sh
# Removes every container podvm left behind (label io.podvm.managed), e.g. after
# a crashed test run. Uses the local podman with podman-up's configuration, so
# it works whether or not the service is running. Touches nothing else.
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
STATE=${PODVM_STATE:-$REPO/.podvm}

command -v podman >/dev/null || exit 0
unset CONTAINER_HOST CONTAINER_CONNECTION
[ ! -f "$STATE/containers.conf" ] || export CONTAINERS_CONF="$STATE/containers.conf"

ids=$(podman ps -aq --filter label=io.podvm.managed)
if [ -n "$ids" ]; then
	echo "podman-clean: removing $(echo "$ids" | wc -l) container(s)" >&2
	# shellcheck disable=SC2086 # one ID per word
	podman rm -f -t 0 $ids >/dev/null
fi
