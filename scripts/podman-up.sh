#!/bin/sh
# Brings up a Podman API service for podvm's tests, from nothing, idempotently.
#
#   eval "$(scripts/podman-up.sh)"
#
# Installs podman (root on Debian/Ubuntu only), builds the test image, checks
# that a container starts with Podman's defaults and, only where it does not,
# switches to testdata/containers.conf; then starts
# `podman system service` on a project-local socket (never the system one).
# Stdout carries only `export ...` lines; every message goes to stderr.
# A second run with the service up takes well under a second.
#
# Env: PODVM_STATE  state directory (default <repo>/.podvm): podman.sock,
#                   service.pid, service.log, probe.log, containers.conf
#      PODVM_TEST_IMAGE  image to build (default localhost/podvm-test:latest)
#      PODVM_SOCKET  the service's socket (default $PODVM_STATE/podman.sock)
# Stop with scripts/podman-down.sh.
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
STATE=${PODVM_STATE:-$REPO/.podvm}
IMAGE=${PODVM_TEST_IMAGE:-localhost/podvm-test:latest}
SOCK=${PODVM_SOCKET:-$STATE/podman.sock}
PIDFILE=$STATE/service.pid
LOG=$STATE/service.log
CONF=$STATE/containers.conf
DEFAULTS_OK=$STATE/defaults.ok # the probe passed without $CONF

log() { echo "podman-up: $*" >&2; }
die() { log "$*"; exit 1; }

# --- packages -----------------------------------------------------------------

static_busybox() { [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; }

need=""
command -v podman >/dev/null || need="podman runc catatonit"
static_busybox || need="$need busybox-static"
command -v curl >/dev/null || need="$need curl"
# Rootless podman needs newuidmap/newgidmap for the user's subordinate IDs.
[ "$(id -u)" = 0 ] || command -v newuidmap >/dev/null || need="$need uidmap"
if [ -n "$need" ]; then
	if [ "$(id -u)" = 0 ] && [ -r /etc/debian_version ] && command -v apt-get >/dev/null; then
		log "installing:$need"
		export DEBIAN_FRONTEND=noninteractive
		# Refresh the package lists only when they are missing or older than a
		# day, and once more if the install still fails (lists gone stale).
		if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mmin -1440 2>/dev/null | head -n 1)" ]; then
			apt-get -o DPkg::Lock::Timeout=300 update -q >&2
		fi
		# shellcheck disable=SC2086 # $need is a word list
		apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends $need >&2 ||
			{ apt-get -o DPkg::Lock::Timeout=300 update -q >&2 && apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends $need >&2; }
	else
		die "missing:$need. On Debian/Ubuntu: sudo apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends$need; elsewhere the equivalent packages (busybox statically linked, at /bin/busybox)."
	fi
fi

# --- state --------------------------------------------------------------------

mkdir -p "$STATE" "$(dirname "$SOCK")"
# One run at a time: concurrent `make test`s share the service. Whatever we
# start that outlives us (service, conmon) gets 9>&- so it does not hold the lock.
exec 9>"$STATE/lock"
command -v flock >/dev/null && flock 9

# sun_path holds 108 bytes: bind() fails on a longer socket path.
[ "${#SOCK}" -lt 100 ] || die "socket path too long ($SOCK): set PODVM_STATE to a shorter directory"

# Setup talks to the local podman, not to a service named by an earlier eval.
unset CONTAINER_HOST CONTAINER_CONNECTION
# Our config is used only when the state directory says so (see the probe).
[ "${CONTAINERS_CONF:-}" != "$CONF" ] || unset CONTAINERS_CONF
if [ -f "$CONF" ]; then
	# Decision already taken: keep the copy in step with testdata.
	cmp -s "$REPO/testdata/containers.conf" "$CONF" || cp "$REPO/testdata/containers.conf" "$CONF"
	export CONTAINERS_CONF="$CONF"
fi

ping_ok() { curl -fsS --max-time 2 --unix-socket "$SOCK" http://d/_ping 2>/dev/null | grep -qx OK; }

# The PID in service.pid, if it is still our service (and not a reused PID).
service_pid() {
	pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
	tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF "system service --time=0 unix://$SOCK" || return 1
	echo "$pid"
}

print_env() {
	echo "export CONTAINER_HOST=unix://$SOCK"
	echo "export PODVM_TEST_IMAGE=$IMAGE"
	if [ -n "${CONTAINERS_CONF:-}" ] && [ "$CONTAINERS_CONF" = "$CONF" ]; then
		echo "export CONTAINERS_CONF=$CONF"
	fi
}

# Fast path: everything already up.
if service_pid >/dev/null && ping_ok && podman image exists "$IMAGE"; then
	print_env
	exit 0
fi

# --- image --------------------------------------------------------------------

if ! podman image exists "$IMAGE"; then
	log "building $IMAGE"
	sh "$REPO/testdata/image/build.sh" "$IMAGE" 9>&-
fi

# --- probe: does a container start with the current configuration? -------------
# A real `podman run` exercises what differs between machines: the OCI runtime
# (crun fails on a cgroup v1 hybrid layout), the cgroup manager, and the default
# rlimits (Podman raises nofile/nproc, which needs CAP_SYS_RESOURCE).

probe() {
	name=podvm-probe-$$
	ok=0
	podman run --rm --name "$name" --network none "$IMAGE" true >>"$STATE/probe.log" 2>&1 9>&- || ok=1
	podman rm -f -t 0 "$name" >/dev/null 2>&1 || true # --rm may not clean up a failed start
	return $ok
}

if [ ! -f "$CONF" ] && [ ! -f "$DEFAULTS_OK" ]; then
	: >"$STATE/probe.log"
	if probe; then
		log "containers start with Podman's defaults"
		touch "$DEFAULTS_OK"
	else
		log "containers do not start with Podman's defaults (see $STATE/probe.log); trying testdata/containers.conf"
		cp "$REPO/testdata/containers.conf" "$CONF"
		export CONTAINERS_CONF="$CONF"
		if ! probe; then
			rm -f "$CONF"
			cat "$STATE/probe.log" >&2
			die "containers do not start, with or without testdata/containers.conf"
		fi
		log "using $CONF"
	fi
fi

# --- service ------------------------------------------------------------------

if ! ping_ok; then
	if pid=$(service_pid); then # ours but not answering: restart it
		kill "$pid" 2>/dev/null || true
		sleep 1
	fi
	rm -f "$SOCK" "$PIDFILE"
	log "starting podman system service on unix://$SOCK"
	# --time=0: no idle timeout (the default 5 s drops long-lived clients).
	# setsid detaches it from our session; the inner sh records its own PID,
	# which exec turns into podman's, whether or not setsid had to fork.
	# It runs in the state directory: conmon writes files such as "oom"
	# into its working directory, which it inherits from the service.
	# shellcheck disable=SC2016 # expanded by the inner sh
	setsid sh -c 'echo $$ >"$0"; cd "$2" && exec podman system service --time=0 "unix://$1"' \
		"$PIDFILE" "$SOCK" "$STATE" >"$LOG" 2>&1 </dev/null 9>&- &
	i=0
	until ping_ok; do
		i=$((i + 1))
		if [ $i -gt 60 ] || ! kill -0 "$(cat "$PIDFILE" 2>/dev/null || echo $!)" 2>/dev/null; then
			tail -n 20 "$LOG" >&2
			die "service did not answer on $SOCK (log: $LOG)"
		fi
		sleep 0.5
	done
	log "service up, pid $(cat "$PIDFILE")"
fi

print_env
