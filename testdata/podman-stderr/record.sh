#!/bin/sh
# Records the stderr of Podman's own failures, one file per case, named
# CASE.EXITCODE.txt, for the table test of internal/podman/errors.go.
# Each sample is recorded through the service (remote client, --url) and,
# where the text differs, with the local client (files named ...-loc).
#
#   eval "$(scripts/podman-up.sh)"; sh testdata/podman-stderr/record.sh
#
# Recorded with Debian's podman 4.3.1 (runc). Everything it creates carries
# io.podvm.managed=true and is removed before it exits.
set -u
DIR=$(cd "$(dirname "$0")" && pwd -P)
: "${CONTAINER_HOST:?run eval \"\$(scripts/podman-up.sh)\" first}"
IMAGE=${PODVM_TEST_IMAGE:?}
HOST=$CONTAINER_HOST
N=podvm-rec-$$

remote() { env -u CONTAINER_HOST podman --url "$HOST" "$@"; }
loc() { env -u CONTAINER_HOST podman "$@"; }

# rec NAME CLIENT ARGS...: runs podman, saves its stderr as NAME.RC.txt.
rec() {
	name=$1 client=$2
	shift 2
	$client "$@" </dev/null >/dev/null 2>"$DIR/tmp.txt"
	rc=$?
	rm -f "$DIR/$name".*.txt
	mv "$DIR/tmp.txt" "$DIR/$name.$rc.txt"
	echo "$name: exit $rc" >&2
}

cleanup() {
	remote rm -f -t 0 "$N" "$N-exited" "$N-oci" "$N-user" >/dev/null 2>&1
	remote rmi "localhost/$N:used" >/dev/null 2>&1
}
trap cleanup EXIT

# race NAME CLIENT: `rm -f` of a container that exits by itself meanwhile,
# which Podman before 4.4 can refuse (podman#16142). Tried until caught,
# at most 200 times; the exit is timed a little differently each time.
race() {
	name=$1 client=$2
	for i in $(seq 200); do
		id=$(remote run -d --label io.podvm.managed=true --network none "$IMAGE" sleep 0.3) || return 1
		sleep "0.2$((i % 5 + 5))"
		$client rm -f -t 0 "$id" </dev/null >/dev/null 2>"$DIR/tmp.txt"
		rc=$?
		remote rm -f -t 0 "$id" >/dev/null 2>&1
		if [ $rc -ne 0 ] && grep -q 'could not be stopped' "$DIR/tmp.txt"; then
			rm -f "$DIR/$name".*.txt
			mv "$DIR/tmp.txt" "$DIR/$name.$rc.txt"
			echo "$name: exit $rc, try $i" >&2
			return
		fi
	done
	rm -f "$DIR/tmp.txt"
	echo "$name: not caught in 200 tries" >&2
}
# `record.sh race` records only the races (slow: up to a minute each).
if [ "${1:-}" = race ]; then
	race rm-stopped-meanwhile-remote remote
	race rm-stopped-meanwhile-loc loc
	exit
fi

remote run -d --name "$N" --label io.podvm.managed=true --network none --init \
	--entrypoint '["/run/podman-init","-P"]' "$IMAGE" >/dev/null || exit 1
remote run -d --name "$N-exited" --label io.podvm.managed=true --network none "$IMAGE" true >/dev/null || exit 1
# An image of its own, used by a container: its removal is refused.
remote commit -q --pause=false "$N" "localhost/$N:used" >/dev/null || exit 1
remote create --name "$N-user" --label io.podvm.managed=true "localhost/$N:used" true >/dev/null || exit 1
sleep 1

for c in remote loc; do
	rec "exec-no-such-container-$c" $c exec "$N-missing" true
	rec "exec-not-running-$c" $c exec "$N-exited" true
	rec "exec-not-found-$c" $c exec "$N" podvm-no-such-command
	rec "exec-not-executable-$c" $c exec "$N" /etc/passwd
	rec "exec-is-directory-$c" $c exec "$N" /etc
	rec "exec-no-workdir-$c" $c exec -w /no/such/dir "$N" pwd
	rec "exec-unknown-user-$c" $c exec -u podvm-no-such-user "$N" true
	rec "run-image-not-known-$c" $c run -d --pull never --label io.podvm.managed=true localhost/podvm-no-such-image:latest
	rec "run-pull-unreachable-$c" $c run -d --pull missing --label io.podvm.managed=true localhost/podvm-no-such-image:latest
	rec "run-name-in-use-$c" $c run -d --name "$N" --label io.podvm.managed=true "$IMAGE"
	rec "run-oci-error-$c" $c run -d --name "$N-oci" --memory 1 --label io.podvm.managed=true "$IMAGE" true
	rec "run-unknown-flag-$c" $c run -d --podvm-bogus-flag "$IMAGE"
	rec "cp-in-no-such-container-$c" $c cp - "$N-missing:/tmp"
	rec "cp-out-no-such-container-$c" $c cp "$N-missing:/tmp" -
	rec "cp-in-not-a-dir-$c" $c cp - "$N:/etc/passwd"
	rec "cp-out-no-such-path-$c" $c cp "$N:/no/such/path" -
	rec "rm-no-such-container-$c" $c rm "$N-missing"
	rec "commit-no-such-container-$c" $c commit -q --pause=false "$N-missing" "localhost/$N:never"
	rec "image-inspect-not-known-$c" $c image inspect localhost/podvm-no-such-image:latest
	rec "rmi-in-use-$c" $c rmi "localhost/$N:used"
	remote rm -f -t 0 "$N-oci" >/dev/null 2>&1 # run leaves it behind when start fails
done
rec run-short-name-remote remote run -d --pull always --label io.podvm.managed=true podvm-no-such-image
rec run-pull-dns-remote remote run -d --pull always --label io.podvm.managed=true registry.podvm.invalid/busybox:latest
rec unreachable-socket loc --url unix:///nonexistent/podvm.sock ps
rec unreachable-tcp loc --url tcp://127.0.0.1:1 ps
# exec-ssh-reset-remote.125.txt is copied by hand from a run over ssh://
# (scripts/ssh-up.sh) whose sshd dropped connections beyond MaxStartups.

# Commands that exit 125-127 themselves: data, not Podman failures.
rec command-exit-125 remote exec "$N" sh -c 'echo oops >&2; exit 125'
rec command-exit-126 remote exec "$N" sh -c 'exit 126'
rec command-exit-127 remote exec "$N" sh -c 'echo gone >&2; exit 127'
rec command-error-line-127 remote exec "$N" sh -c 'echo "Error: my own failure" >&2; exit 127'

race rm-stopped-meanwhile-remote remote
race rm-stopped-meanwhile-loc loc
