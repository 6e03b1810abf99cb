#!/bin/sh
# Runs the parity test (the conformance cases on both backends, their
# Results compared field by field) against each kind of Podman service:
# Debian 12's 4.3 rootful (scripts/podman-up.sh), the same reached over
# ssh:// (scripts/ssh-up.sh, an sshd on 127.0.0.1), Debian 13's 5.4
# (scripts/podman5-up.sh) and Debian 12's 4.3 rootless, run as a user of
# its own (scripts/rootless-up.sh; the test binary runs as that user too),
# then prints the compatibility table: server × backend × pass/fail.
# Needs root. The test binary is built once, for every row.
#
#   scripts/test-matrix.sh
#
# Per server: the vm test binary (go test -c -race), -test.run '^TestParity(Exec)?$'
# (and TestRootlessLimits, which skips where limits are enforced, and
# the checkpoint tests, which work on the 5.4 row alone and show the
# refusal elsewhere),
# with CONTAINER_HOST and PODVM_TEST_IMAGE of that server, PODVM_SERVER
# (podman4 or podman5), PODVM_PODMAN (the podman CLI the CLI backend runs:
# the host's podman for 4.3, scripts/podman5-cli for 5.4, which is remote
# only: PODVM_PODMAN_REMOTE=1) and
# go test -v's log turned into "backend<TAB>case<TAB>outcome" records per
# case by scripts/conformance-table.sh -r. Then no podvm container may be left on that server.
# Files, in $PODVM_STATE/matrix (default <repo>/.podvm/matrix): SERVER.log
# (go test's output), SERVER.cases (the vmtest lines), table.md.
# PODVM_MATRIX_PODMAN4_LOG: the podman4 row is read from this go test -v log
# of the same tree against the 4.3 service (.ci/run passes make test's).
# Exit status 0 only when every server ran every case without a failure and
# nothing leaked. The services are left running (stop them with
# scripts/podman-down.sh, scripts/podman5-down.sh, scripts/rootless-down.sh,
# scripts/ssh-down.sh).
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

# Every service first: one that does not come up fails the run before any test.
unset CONTAINER_HOST CONTAINER_CONNECTION CONTAINERS_CONF
env4=$(scripts/podman-up.sh) || { log "the Podman 4.3 service did not come up"; exit 1; }
env5=$(scripts/podman5-up.sh) || { log "the Podman 5.4 service did not come up"; exit 1; }
envr=$(scripts/rootless-up.sh) || { log "the rootless Podman service did not come up"; exit 1; }
envs=$(eval "$env4" && scripts/ssh-up.sh) || { log "the sshd in front of the Podman 4.3 service did not come up"; exit 1; }

# One test binary for every row, readable by the rootless user.
log "building the vm test binary"
$GO test -c -race -o "$OUT/vm.test" ./vm/
# and vmtest's unix-socket service, built here: the rootless user's test
# binary could not build it from this tree.
CGO_ENABLED=0 $GO build -buildvcs=false -o "$OUT/unixecho" ./vm/vmtest/testdata/unixecho
chmod 755 "$OUT" "$OUT/vm.test" "$OUT/unixecho"
export PODVM_UNIXECHO="$OUT/unixecho"

# run SERVER ENV CLI REMOTE [AS [TESTS]]: the suite against the server whose
# `export` lines are ENV, with CLI as the CLI backend's podman (REMOTE=1: it
# has no local mode), run by the command AS (scripts/as-rootless: as the
# rootless user) or by this user; TESTS ("TestA|TestB") replace the
# default tests (the parity suites, TestRootlessLimits, and the
# checkpoint tests: TestCheckpoint*, TestRestore*, TestSuspendResume).
# Records the test binary's failure in
# SERVER.failed and the podvm containers that appeared during the run, and
# are still there after it, in SERVER.leaks; it removes none (the service
# may be shared: `make check-leaks`, the *-down scripts clean up).
# A subshell: one server's environment never reaches the other's.
run() (
	server=$1 cli=$3 as=${5:-} tests=${6:-}
	eval "$2"
	export PODVM_PODMAN_REMOTE="$4"
	export PODVM_SERVER="$server" PODVM_PODMAN="$cli" PODVM_REQUIRE_PODMAN=1
	sock=${CONTAINER_HOST#unix://}
	case $CONTAINER_HOST in ssh://*) sock=/${CONTAINER_HOST#ssh://*/} ;; esac # the same machine's socket
	version=$($as curl -sS --unix-socket "$sock" http://d/v4.0.0/libpod/version |
		grep -o '"Version":"[^"]*"' | head -n 1 | cut -d'"' -f4)
	echo "$version" >"$OUT/$server.version"
	# A live owner's containers (a demo, a benchmark beside this run) are
	# not this run's leaks.
	$as sh -c ". '$REPO/scripts/lib.sh'; podvm_ended_containers '$cli' \"\$CONTAINER_HOST\"" >"$OUT/$server.before"
	log "$server (Podman $version): vm tests, output in $OUT/$server.log"
	start=$(date +%s)
	status=0
	(cd vm && $as "$OUT/vm.test" -test.v -test.count=1 -test.timeout 30m \
		-test.run "^(${tests:-TestParity|TestRootlessLimits|TestCheckpoint[A-Za-z]*|TestRestore[A-Za-z]*|TestSuspendResume})\$") >"$OUT/$server.log" 2>&1 || status=$?
	scripts/conformance-table.sh -r "$OUT/$server.log" >"$OUT/$server.cases" || true
	tail -n 3 "$OUT/$server.log" >&2
	log "$server: exit status $status after $(($(date +%s) - start)) s"
	[ $status = 0 ] || echo "$status" >"$OUT/$server.failed"
	$as sh -c ". '$REPO/scripts/lib.sh'; podvm_ended_containers '$cli' \"\$CONTAINER_HOST\"" |
		comm -13 "$OUT/$server.before" - >"$OUT/$server.leaks"
	if [ -s "$OUT/$server.leaks" ]; then
		log "$server: podvm containers left behind: $(cut -c1-12 "$OUT/$server.leaks" | tr '\n' ' ')"
	fi
)

# reuse SERVER ENV LOG: the row of SERVER from LOG, the `go test -v ./...`
# log of a run against the same service and tree (`make test`'s, which
# .ci/run has just made), instead of running the suite again.
reuse() (
	server=$1
	eval "$2"
	curl -sS --unix-socket "${CONTAINER_HOST#unix://}" http://d/v4.0.0/libpod/version |
		grep -o '"Version":"[^"]*"' | head -n 1 | cut -d'"' -f4 >"$OUT/$server.version"
	# Only package vm's part: go test prints each package's output whole,
	# ended by its "ok"/"FAIL" line (vm/kube has parity tests of its own).
	awk '/^(ok|FAIL)[ \t]+github\.com\/podvm\/podvm\// {
		if ($2 == "github.com/podvm/podvm/vm") { printf "%s", buf; print }
		buf = ""; next
	} { buf = buf $0 "\n" }' "$3" >"$OUT/$server.log"
	scripts/conformance-table.sh -r "$OUT/$server.log" | grep '^parity' >"$OUT/$server.cases" || true
	: >"$OUT/$server.leaks" # make test checks for leaks itself
	log "$server: the rows of $3, not run again"
)

# One row at a time: two side by side on two cores made the timing
# promises (a kill within its grace) fail under the load.
if [ -n "${PODVM_MATRIX_PODMAN4_LOG:-}" ]; then
	reuse podman4 "$env4" "$PODVM_MATRIX_PODMAN4_LOG"
else
	run podman4 "$env4" "$(command -v podman)" ""
fi
# The rows after the first run a sample of the suite (vm/vmtest's
# samples, PODVM_PARITY_SAMPLE): each kind of case that reaches what the
# row adds, not every case again. The full suite runs on the first row
# (make test's). PODVM_MATRIX_FULL=1 runs every case on every row (about
# 20 minutes more on this machine, over CI's budget): before a release,
# or to build docs/compatibility.md.
sample() { [ "${PODVM_MATRIX_FULL:-}" = 1 ] || echo "export PODVM_PARITY_SAMPLE=$1"; }
# The 4.3 service again, reached as ssh://root@127.0.0.1:PORT/...: through
# the agent, copied in as for any remote service (Podman exec over a
# remote connection is the 5.4 row's), and the host key checks. What the
# row adds is the transport (a key exchange per podman CLI call).
run ssh "$envs
export PODVM_PARITY_PATHS=agent
$(sample transport)" "$(command -v podman)" "" "" "TestParity|TestSSHHostKey|TestCheckpointSupport"
# Podman 5.4: every way a Podman call can fail or answer differently.
run podman5 "$env5
$(sample server)" "$REPO/scripts/podman5-cli" 1 # it has no local mode
# Rootless: limits, ownership, kills in a delegated cgroup, and beside
# them the channel's mount, Reap's owner check, the image archive.
run rootless "$envr
$(sample rootless)" /usr/bin/podman "" "$REPO/scripts/as-rootless" \
	"TestParity|TestRootlessLimits|TestCheckpointSupport|TestSuspendResume|TestCheckpointRestore|TestChannelDirIsClosedToTheSandbox|TestReap|TestImageArchive"
SERVERS="podman4 ssh podman5 rootless"

# --- the table ----------------------------------------------------------------------

{
	echo "| server | Podman | backend | pass | fail | skip | result |"
	echo "|---|---|---|---|---|---|---|"
	for server in $SERVERS; do
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
					printf "| %s | %s | %s | %d | %d | %d | %s |\n", server, v, b, n[b, "pass"], n[b, "FAIL"], n[b, "skip"], r
				}
				if (failed != "" && !fails) printf "| %s | %s | (go test) | | | | FAIL: exit status %s, see %s.log |\n", server, v, failed, server
				if (!lines) printf "| %s | %s | (none) | 0 | 0 | 0 | FAIL: no case ran |\n", server, v
				if (leaks > 0) printf "| %s | %s | (leaks) | | | | FAIL: %d podvm container(s) left, see %s.leaks |\n", server, v, leaks, server
			}
		' "$OUT/$server.cases" | sort
	done
} >"$OUT/table.md"
for server in $SERVERS; do
	echo
	echo "Podman $(cat "$OUT/$server.version" 2>/dev/null) ($server), by case:"
	scripts/conformance-table.sh "$OUT/$server.log" || true
done
echo
cat "$OUT/table.md"
# Last, where a CI log's tail shows it: what the failed rows printed,
# as make test prints it (no RUN, PASS or SKIP lines).
for server in $SERVERS; do
	[ -e "$OUT/$server.failed" ] || continue
	echo
	echo "$server: the log of the failed row, without RUN, PASS and SKIP lines (its end; all of it in $OUT/$server.log):"
	grep -vE '^ *(=== (RUN|PAUSE|CONT|NAME)|--- (PASS|SKIP)|PASS$)' "$OUT/$server.log" | grep -vE 'backend does not support this|a promise of podvm.s agent' | tail -n 80
done
if grep -q FAIL "$OUT/table.md"; then exit 1; fi
