#!/bin/sh
# Fails when podvm sandboxes (label io.podvm.managed) were left behind by
# processes that have ended, and removes those, so one leak does not poison
# the next run. Sandboxes whose owner process (label io.podvm.owner.pid) is
# still running belong to a run in progress (another test run, a benchmark)
# and are neither reported nor touched.
set -eu
REPO=$(cd "$(dirname "$0")/.." && pwd -P)
. "$REPO/scripts/lib.sh"
eval "$("$REPO/scripts/podman-up.sh")"
leaks=$(podvm_ended_containers podman "$CONTAINER_HOST" | cut -c1-12)
[ -z "$leaks" ] && exit 0
podman() { command podman --url "$CONTAINER_HOST" "$@"; }
echo "check-leaks: podvm containers left behind by ended processes:" >&2
# shellcheck disable=SC2086 # one ID per word
podman ps -a --filter label=io.podvm.managed --format '{{.ID}} {{.Names}} {{.Labels}}' | grep -F "$(printf '%s\n' $leaks)" >&2 || true
# shellcheck disable=SC2086
podman rm -f -t 0 $leaks >/dev/null 2>&1 || true
exit 1
