#!/bin/sh
# Records raw HTTP responses of the Podman REST API, one file per case
# (NAME.http: status line, headers and body exactly as sent), for the unit
# tests of internal/libpod, internal/podman and vm, which replay them from a fake
# service on a unix socket.
#
#   eval "$(scripts/podman-up.sh)"; sh testdata/libpod/record.sh
#
# Recorded with Debian's podman 4.3.1 (runc). Everything it creates carries
# io.podvm.managed=true and is removed before it exits. Optional: with
# PODVM_PODMAN5_SOCK set to a 5.x service's socket, the cases that differ
# by version are recorded from it too (files named ...-v5.http).
set -u
DIR=$(cd "$(dirname "$0")" && pwd -P)
: "${CONTAINER_HOST:?run eval \"\$(scripts/podman-up.sh)\" first}"
IMAGE=${PODVM_TEST_IMAGE:?}
SOCK=${CONTAINER_HOST#unix://}
[ "$SOCK" != "$CONTAINER_HOST" ] || { echo "record.sh: CONTAINER_HOST must be unix://" >&2; exit 1; }
API=http://d/v4.3.1/libpod
N=podvm-rec-$$

# rec NAME CURL-ARGS...: saves the raw response as NAME.http.
rec() {
	name=$1
	shift
	curl -s -i --raw --max-time 20 -H Expect: --unix-socket "$SOCK" "$@" >"$DIR/$name.http"
	echo "$name: $(head -n 1 "$DIR/$name.http" | tr -d '\r')" >&2
}
# call CURL-ARGS...: the body of a response, not recorded.
call() { curl -s --max-time 20 --unix-socket "$SOCK" "$@"; }
json() { python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"; }
post() { rec "$1" -H 'Content-Type: application/json' -d "$3" "$API$2"; }
# execid CONTAINER CONFIG: a new exec session's ID.
execid() { call -H 'Content-Type: application/json' -d "$2" "$API/containers/$1/exec" | json Id; }
# start NAME ID: records a hijacked exec start and then the session's inspect.
start() {
	rec "$1" -H 'Connection: Upgrade' -H 'Upgrade: tcp' -H 'Content-Type: application/json' \
		-d '{"Detach":false,"Tty":false}' "$API/exec/$2/start"
	rec "$1-inspect" "$API/exec/$2/json"
}

cleanup() {
	for c in "$N" "$N-exited" "$N-other"; do
		call -X DELETE "$API/containers/$c?force=true&timeout=0" >/dev/null
	done
	rm -f "$DIR/tmp.tar"
}
trap cleanup EXIT

spec() { # spec NAME ENTRYPOINT-JSON
	printf '{"name":"%s","image":"%s","labels":{"io.podvm.managed":"true","io.podvm.token":"%s"},"netns":{"nsmode":"none"},"init":true,"entrypoint":%s,"no_new_privileges":true,"cap_drop":["ALL"],"cap_add":["CHOWN","KILL"],"resource_limits":{"pids":{"limit":1024}}}' \
		"$1" "$IMAGE" "$N" "$2"
}

# race: a forced removal of a container that exits by itself meanwhile,
# which Podman before 4.4 can refuse (podman#16142). Tried until caught,
# at most 200 times; the exit is timed a little differently each time.
race() {
	for i in $(seq 200); do
		id=$(call -H 'Content-Type: application/json' -d '{"image":"'"$IMAGE"'","labels":{"io.podvm.managed":"true"},"netns":{"nsmode":"none"},"command":["sleep","0.3"]}' \
			"$API/containers/create" | json Id)
		call -X POST "$API/containers/$id/start"
		sleep "0.2$((i % 5 + 5))"
		rec container-remove-stopped-meanwhile -X DELETE "$API/containers/$id?force=true&timeout=0" 2>/dev/null
		call -X DELETE "$API/containers/$id?force=true&timeout=0" >/dev/null
		if grep -q 'could not be stopped' "$DIR/container-remove-stopped-meanwhile.http"; then
			echo "container-remove-stopped-meanwhile: caught, try $i" >&2
			return
		fi
	done
	rm -f "$DIR/container-remove-stopped-meanwhile.http"
	echo "container-remove-stopped-meanwhile: not caught in 200 tries" >&2
}
# `record.sh race` records only the race (slow: up to a minute).
if [ "${1:-}" = race ]; then
	race
	exit
fi

rec ping "http://d/_ping"
rec info "$API/info"
# With PODVM_ROOTLESS_SOCK set to a rootless service's socket on cgroup v1
# (scripts/rootless-up.sh): its info, which names no controller.
[ -z "${PODVM_ROOTLESS_SOCK:-}" ] || (SOCK=$PODVM_ROOTLESS_SOCK; rec info-rootless "$API/info")
post container-create /containers/create "$(spec "$N" '["/run/podman-init","-P"]')"
post container-create-name-in-use /containers/create "$(spec "$N" '["/run/podman-init","-P"]')"
post container-create-image-not-known /containers/create \
	'{"name":"'"$N-other"'","image":"localhost/podvm-no-such-image:latest","labels":{"io.podvm.managed":"true"}}'
rec container-start -X POST "$API/containers/$N/start"
rec container-start-no-such-container -X POST "$API/containers/$N-missing/start"
rec container-inspect "$API/containers/$N/json"
rec container-list -G --data-urlencode 'all=true' \
	--data-urlencode "filters={\"label\":[\"io.podvm.managed=true\",\"io.podvm.token=$N\"]}" "$API/containers/json"

call -H 'Content-Type: application/json' -d "$(spec "$N-exited" '["true"]')" "$API/containers/create" >/dev/null
call -X POST "$API/containers/$N-exited/start"
call -X POST "$API/containers/$N-exited/wait?condition=exited" >/dev/null

rec image-inspect "$API/images/$IMAGE/json"
rec image-inspect-missing "$API/images/localhost/podvm-no-such-image:latest/json"
rec image-pull -X POST "$API/images/pull?reference=$IMAGE&policy=missing&quiet=true"
rec image-pull-unreachable -X POST "$API/images/pull?reference=localhost/podvm-no-such-image:latest&quiet=true"
rec image-pull-short-name -X POST "$API/images/pull?reference=podvm-no-such-image&quiet=true"
call "$API/images/$IMAGE/get?format=docker-archive" >"$DIR/tmp.tar"
rec image-load -H 'Content-Type: application/x-tar' --data-binary "@$DIR/tmp.tar" "$API/images/load"
rec image-load-garbage -H 'Content-Type: application/x-tar' --data-binary 'not a tar' "$API/images/load"

tar -C "$DIR" -cf "$DIR/tmp.tar" record.sh
rec archive-put -X PUT -H 'Content-Type: application/x-tar' --data-binary "@$DIR/tmp.tar" "$API/containers/$N/archive?path=/tmp"
rec archive-put-not-a-dir -X PUT -H 'Content-Type: application/x-tar' --data-binary "@$DIR/tmp.tar" "$API/containers/$N/archive?path=/etc/passwd"
rec archive-put-no-such-container -X PUT -H 'Content-Type: application/x-tar' --data-binary "@$DIR/tmp.tar" "$API/containers/$N-missing/archive?path=/tmp"
rec archive-head -I "$API/containers/$N/archive?path=/tmp"
rec archive-head-file -I "$API/containers/$N/archive?path=/etc/passwd"
rec archive-head-missing -I "$API/containers/$N/archive?path=/no/such/path"
rec archive-get "$API/containers/$N/archive?path=/tmp/record.sh"
rec archive-get-missing "$API/containers/$N/archive?path=/no/such/path"

post exec-create "/containers/$N/exec" '{"AttachStdout":true,"AttachStderr":true,"Cmd":["true"]}'
post exec-create-no-such-container "/containers/$N-missing/exec" '{"AttachStdout":true,"Cmd":["true"]}'
post exec-create-not-running "/containers/$N-exited/exec" '{"AttachStdout":true,"Cmd":["true"]}'
out='{"AttachStdout":true,"AttachStderr":true,'
start exec-start-exit-3 "$(execid "$N" "$out"'"Cmd":["sh","-c","echo hi; echo oops >&2; exit 3"]}')"
start exec-start-interleaved "$(execid "$N" "$out"'"Cmd":["sh","-c","i=0; while [ $i -lt 2000 ]; do echo \"out $i\"; echo \"err $i\" >&2; i=$((i+1)); done"]}')"
start exec-start-big "$(execid "$N" "$out"'"Cmd":["sh","-c","dd if=/dev/zero bs=65536 count=4 2>/dev/null | tr \"\\0\" x"]}')"
start exec-start-not-found "$(execid "$N" "$out"'"Cmd":["podvm-no-such-command"]}')"
start exec-start-not-executable "$(execid "$N" "$out"'"Cmd":["/etc/passwd"]}')"
start exec-start-is-directory "$(execid "$N" "$out"'"Cmd":["/etc"]}')"
start exec-start-no-workdir "$(execid "$N" "$out"'"WorkingDir":"/no/such/dir","Cmd":["pwd"]}')"
start exec-start-127-is-data "$(execid "$N" "$out"'"Cmd":["sh","-c","echo gone >&2; exit 127"]}')"
start exec-start-unknown-user "$(execid "$N" "$out"'"User":"podvm-no-such-user","Cmd":["true"]}')"
id=$(execid "$N" '{"Cmd":["sleep","3"]}')
call -H 'Content-Type: application/json' -d '{"Detach":true}' "$API/exec/$id/start"
rec exec-inspect-running "$API/exec/$id/json"
rec exec-inspect-no-such-session "$API/exec/0000000000000000000000000000000000000000000000000000000000000000/json"
post exec-remove "/exec/$id/remove" '{"Force":true}' # 4.3 has no such endpoint

rec container-remove -X DELETE "$API/containers/$N?force=true&timeout=0"
rec container-remove-no-such-container -X DELETE "$API/containers/$N?force=true&timeout=0"
race

if [ -n "${PODVM_PODMAN5_SOCK:-}" ]; then
	SOCK=$PODVM_PODMAN5_SOCK
	API=http://d/v5.0.0/libpod
	rec ping-v5 "http://d/_ping"
	call -H 'Content-Type: application/json' -d "$(spec "$N" '["/run/podman-init","-P"]')" "$API/containers/create" >/dev/null
	call -X POST "$API/containers/$N/start"
	id=$(execid "$N" '{"Cmd":["sleep","30"]}')
	call -H 'Content-Type: application/json' -d '{"Detach":true}' "$API/exec/$id/start"
	post exec-remove-v5 "/exec/$id/remove" '{"Force":true}'
	rec exec-inspect-removed-v5 "$API/exec/$id/json"
	post exec-remove-no-such-session-v5 "/exec/$id/remove" '{"Force":true}'
	call -X DELETE "$API/containers/$N?force=true&timeout=0" >/dev/null
fi
