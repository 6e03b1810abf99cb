#!/bin/sh
# Fails when podvm sandboxes (label io.podvm.managed) were left behind by
# processes that have ended, and removes those, so one leak does not poison
# the next run. Sandboxes whose owner process (label io.podvm.owner.pid) is
# still running belong to a run in progress (another test run, a benchmark)
# and are neither reported nor touched.
set -eu
REPO=$(cd "$(dirname "$0")/.." && pwd -P)
eval "$("$REPO/scripts/podman-up.sh")"
podman() { command podman --url "$CONTAINER_HOST" "$@"; }
leaks=""
for line in $(podman ps -a --filter label=io.podvm.managed --format '{{.ID}},{{index .Labels "io.podvm.owner.pid"}}'); do
	id=${line%%,*} pid=${line#*,}
	case $pid in '' | *[!0-9]*) ;; *) kill -0 "$pid" 2>/dev/null && continue ;; esac
	leaks="$leaks $id"
done
[ -z "$leaks" ] && exit 0
echo "check-leaks: podvm containers left behind by ended processes:" >&2
# shellcheck disable=SC2086 # one ID per word
podman ps -a --filter label=io.podvm.managed --format '{{.ID}} {{.Names}} {{.Labels}}' | grep -F "$(printf '%s\n' $leaks)" >&2 || true
# shellcheck disable=SC2086
podman rm -f -t 0 $leaks >/dev/null 2>&1 || true
exit 1
