#!/bin/sh
# Runs the parity test (every conformance case on both backends, their
# Results compared field by field) against both Podman servers,
# Debian 12's 4.3 (scripts/podman-up.sh) and Debian 13's 5.4
# (scripts/podman5-up.sh, needs root), then prints the compatibility table:
# server × backend × pass/fail.
#
#   scripts/test-matrix.sh
#
# Per server: go test -race -count=1 -run '^TestParity(Exec)?$' ./vm/
# with CONTAINER_HOST and PODVM_TEST_IMAGE of that server, PODVM_SERVER
# (podman4 or podman5), PODVM_PODMAN (the podman CLI the CLI backend runs:
# the host's podman for 4.3, scripts/podman5-cli for 5.4, which is remote
# only: PODVM_PODMAN_REMOTE=1) and
# go test -v's log turned into "backend<TAB>case<TAB>outcome" records per
# case by scripts/conformance-table.sh -r. Then no podvm container may be left on that server.
# Files, in $PODVM_STATE/matrix (default <repo>/.podvm/matrix): SERVER.log
# (go test's output), SERVER.cases (the vmtest lines), table.md.
# Exit status 0 only when both servers ran every case without a failure and
# nothing leaked. Both services are left running (stop them with
# scripts/podman-down.sh and scripts/podman5-down.sh).
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
. "$REPO/scripts/lib.sh"
STATE=${PODVM_STATE:-$REPO/.podvm}
OUT=$STATE/matrix
GO=${GO:-go}

log() { echo "test-matrix: $*" >&2; }

cd "$REPO"
rm -rf "$OUT"
mkdir -p "$OUT"

# Both services first: one that does not come up fails the run before any test.
unset CONTAINER_HOST CONTAINER_CONNECTION CONTAINERS_CONF
env4=$(scripts/podman-up.sh) || { log "the Podman 4.3 service did not come up"; exit 1; }
env5=$(scripts/podman5-up.sh) || { log "the Podman 5.4 service did not come up"; exit 1; }

# run SERVER ENV CLI REMOTE: the suite against the server whose `export`
# lines are ENV, with CLI as the CLI backend's podman (REMOTE=1: it has no
# local mode). Records go test's failure in
# SERVER.failed and the podvm containers that appeared during the run, and
# are still there after it, in SERVER.leaks; it removes none (the service
# may be shared: `make check-leaks`, scripts/podman5-down.sh clean up).
# A subshell: one server's environment never reaches the other's.
run() (
	server=$1 cli=$3
	eval "$2"
	export PODVM_PODMAN_REMOTE="$4"
	export PODVM_SERVER="$server" PODVM_PODMAN="$cli"
	version=$(curl -sS --unix-socket "${CONTAINER_HOST#unix://}" http://d/v4.0.0/libpod/version |
		grep -o '"Version":"[^"]*"' | head -n 1 | cut -d'"' -f4)
	echo "$version" >"$OUT/$server.version"
	# A live owner's containers (a demo, a benchmark beside this run) are
	# not this run's leaks.
	podvm_ended_containers "$cli" "$CONTAINER_HOST" >"$OUT/$server.before"
	log "$server (Podman $version): go test, output in $OUT/$server.log"
	start=$(date +%s)
	status=0
	$GO test -race -count=1 -v -run '^TestParity(Exec)?$' ./vm/ >"$OUT/$server.log" 2>&1 || status=$?
	scripts/conformance-table.sh -r "$OUT/$server.log" >"$OUT/$server.cases" || true
	tail -n 3 "$OUT/$server.log" >&2
	log "$server: go test exit status $status after $(($(date +%s) - start)) s"
	[ $status = 0 ] || echo "$status" >"$OUT/$server.failed"
	podvm_ended_containers "$cli" "$CONTAINER_HOST" | comm -13 "$OUT/$server.before" - >"$OUT/$server.leaks"
	if [ -s "$OUT/$server.leaks" ]; then
		log "$server: podvm containers left behind: $(cut -c1-12 "$OUT/$server.leaks" | tr '\n' ' ')"
	fi
)

run podman4 "$env4" "$(command -v podman)" ""
run podman5 "$env5" "$REPO/scripts/podman5-cli" 1 # it has no local mode

# --- the table ----------------------------------------------------------------------

{
	echo "| Podman | backend | pass | fail | skip | result |"
	echo "|---|---|---|---|---|---|"
	for server in podman4 podman5; do
		version=$(cat "$OUT/$server.version" 2>/dev/null || echo "?")
		failed=$(cat "$OUT/$server.failed" 2>/dev/null || true)
		leaks=$(wc -l <"$OUT/$server.leaks" 2>/dev/null || echo 0)
		awk -F'\t' -v v="$version" -v server="$server" -v failed="$failed" -v leaks="$leaks" '
			{
				b = $1
				# Conformance records name the backend ("CLI"); a subtest nested
				# deeper may come out as "TestConformanceCLI:<subtest>".
				if (b ~ /^TestConformance/) { sub(/^TestConformance/, "", b); sub(/:.*/, "", b) }
				seen[b] = 1; n[b, $3]++; lines++; if ($3 == "FAIL") fails++
			}
			END {
				for (b in seen) {
					r = n[b, "FAIL"] ? "FAIL" : (n[b, "pass"] ? "pass" : "skip")
					printf "| %s | %s | %d | %d | %d | %s |\n", v, b, n[b, "pass"], n[b, "FAIL"], n[b, "skip"], r
				}
				if (failed != "" && !fails) printf "| %s | (go test) | | | | FAIL: exit status %s, see %s.log |\n", v, failed, server
				if (!lines) printf "| %s | (none) | 0 | 0 | 0 | FAIL: no case ran |\n", v
				if (leaks > 0) printf "| %s | (leaks) | | | | FAIL: %d podvm container(s) left, see %s.leaks |\n", v, leaks, server
			}
		' "$OUT/$server.cases" | sort
	done
} >"$OUT/table.md"
for server in podman4 podman5; do
	echo
	echo "Podman $(cat "$OUT/$server.version" 2>/dev/null) ($server), by case:"
	scripts/conformance-table.sh "$OUT/$server.log" || true
done
echo
cat "$OUT/table.md"
if grep -q FAIL "$OUT/table.md"; then exit 1; fi
