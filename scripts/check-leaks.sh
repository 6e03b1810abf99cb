#!/bin/sh
# Fails when podvm sandboxes (label io.podvm.managed) are left behind, and
# removes them so one leak does not poison the next run.
set -eu
REPO=$(cd "$(dirname "$0")/.." && pwd -P)
eval "$("$REPO/scripts/podman-up.sh")"
left=$(podman --url "$CONTAINER_HOST" ps -a --filter label=io.podvm.managed --format '{{.ID}} {{.Names}} {{.Labels}}')
[ -z "$left" ] && exit 0
echo "check-leaks: podvm containers left behind:" >&2
echo "$left" >&2
"$REPO/scripts/podman-clean.sh" >&2 || true
exit 1
