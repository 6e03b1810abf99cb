#!/bin/sh
# Brings up a Podman 5.4 API service (Debian trixie's package) beside the
# host's Podman 4.3, idempotently, without touching the host's libc or its
# podman: a trixie minbase rootfs, entered with pivot_root in a private mount
# namespace, with its own socket, storage, locks and bridge network.
#
#   eval "$(scripts/podman5-up.sh)"     # then: CONTAINER_HOST is the 5.4 socket
#
# Needs root (mount namespace, pivot_root) on Debian/Ubuntu: installs
# debootstrap with apt when missing. Cold: ~1 min and ~330 MB (the rootfs);
# with the service up a second run takes a fraction of a second.
# Stdout carries only `export ...` lines; every message goes to stderr.
#
# Why pivot_root and not chroot: under a plain chroot the containers' mount
# namespaces keep the host's "/" as their root, so every setns() into them
# (exec, top) lands in the HOST filesystem, not in the container.
#
# Layout
#   $PODVM_PODMAN5_ROOT (default /var/tmp/podvm-podman5), shared by every
#   checkout on the machine and reused across runs:
#     rootfs/      the trixie tree (podman, runc, conmon, netavark, nftables...)
#     ready        written last by a successful build; holds the recipe. A
#                  rootfs without it (or with another recipe) is rebuilt.
#     build.log    debootstrap and apt output of the last build
#   $PODVM_STATE/podman5 (default <repo>/.podvm/podman5), this checkout's:
#     podman.sock  the API socket (same path inside the namespace and outside)
#     service.pid  PID of `podman system service` (scripts/podman5-down.sh)
#     service.log  its output
#     storage/     images and containers (the rootfs's /var/lib/containers/storage)
#
# Env: PODVM_STATE, PODVM_TEST_IMAGE (as scripts/podman-up.sh),
#      PODVM_PODMAN5_ROOT, PODVM_PODMAN5_MIRROR (default http://deb.debian.org/debian)
# Config: testdata/podman5/containers.conf and podman-network.json, copied into
# the rootfs at each start.
# Stop with scripts/podman5-down.sh; run the 5.4 CLI with scripts/podman5-cli.
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
STATE=${PODVM_STATE:-$REPO/.podvm}
ROOT=${PODVM_PODMAN5_ROOT:-/var/tmp/podvm-podman5}
MIRROR=${PODVM_PODMAN5_MIRROR:-http://deb.debian.org/debian}
IMAGE=${PODVM_TEST_IMAGE:-localhost/podvm-test:latest}

SUITE=trixie
# runc: crun fails on cgroup v1 hybrid hosts. nftables: trixie's netavark
# drives the firewall through nft. catatonit: the pause image for pods.
PACKAGES="podman runc conmon catatonit nftables"
RECIPE="$SUITE: $PACKAGES (1)" # bump the number to force a rebuild

log() { echo "podman5-up: $*" >&2; }
die() { log "$*"; exit 1; }

# --- host requirements ----------------------------------------------------------

[ "$(id -u)" = 0 ] || die "must run as root (it needs a private mount namespace and pivot_root)"
for tool in unshare pivot_root nsenter flock curl; do
	command -v "$tool" >/dev/null || die "$tool not found (util-linux, curl)"
done

mkdir -p "$STATE/podman5" "$ROOT"
STATE5=$(cd "$STATE/podman5" && pwd -P) # bind-mounted at the same path inside
ROOT=$(cd "$ROOT" && pwd -P)
RFS=$ROOT/rootfs
SOCK=$STATE5/podman.sock
PIDFILE=$STATE5/service.pid
LOG=$STATE5/service.log
# sun_path holds 108 bytes: bind() fails on a longer socket path.
[ "${#SOCK}" -lt 100 ] || die "socket path too long ($SOCK): set PODVM_STATE to a shorter directory"

# One run at a time per checkout; the rootfs build has its own lock below.
# Whatever we start that outlives us gets 9>&- so it does not hold the lock.
exec 9>"$STATE5/lock"
flock 9

unset CONTAINER_HOST CONTAINER_CONNECTION # our curl talks to $SOCK only

api() { curl -sS --max-time "${API_TIMEOUT:-10}" --unix-socket "$SOCK" "$@"; }
ping_ok() { API_TIMEOUT=2 api -f http://d/_ping 2>/dev/null | grep -qx OK; }
image_ok() { [ "$(api -o /dev/null -w '%{http_code}' "http://d/v5.0.0/libpod/images/$IMAGE/exists" 2>/dev/null)" = 204 ]; }

# The PID in service.pid, if it is still our service (and not a reused PID).
service_pid() {
	pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "system service --time=0 unix://$SOCK" || return 1
	echo "$pid"
}

print_env() {
	echo "export CONTAINER_HOST=unix://$SOCK"
	echo "export PODVM_TEST_IMAGE=$IMAGE"
}

# Fast path: everything already up.
if service_pid >/dev/null && ping_ok && image_ok; then
	print_env
	exit 0
fi

# --- rootfs ---------------------------------------------------------------------

rootfs_ok() { [ "$(cat "$ROOT/ready" 2>/dev/null)" = "$RECIPE" ] && [ -x "$RFS/usr/bin/podman" ]; }

build_rootfs() {
	if ! command -v debootstrap >/dev/null; then
		if [ -r /etc/debian_version ] && command -v apt-get >/dev/null; then
			log "installing debootstrap"
			export DEBIAN_FRONTEND=noninteractive
			apt-get install -y -q --no-install-recommends debootstrap >&2 ||
				{ apt-get update -q >&2 && apt-get install -y -q --no-install-recommends debootstrap >&2; }
		else
			die "debootstrap not found: install it (Debian/Ubuntu: apt-get install debootstrap), or use a Debian host"
		fi
	fi
	if pid=$(service_pid); then # ours, running from the rootfs we replace
		kill "$pid" 2>/dev/null || true
		sleep 1
	fi
	new=$ROOT/rootfs.new
	# --one-file-system: never follow a mount into the host (there should be
	# none: the build mounts only inside its own namespace).
	rm -rf --one-file-system "$new" "$ROOT/ready"
	mkdir -p "$new"
	log "building a $SUITE rootfs in $ROOT (debootstrap + apt, about a minute; log: $ROOT/build.log)"
	# In a private mount namespace: the /proc that debootstrap and the package
	# scripts mount disappears with it, even when the build is interrupted.
	if ! unshare --mount --propagation private sh -eu -c '
		new=$1 suite=$2 mirror=$3 packages=$4
		debootstrap --variant=minbase "$suite" "$new" "$mirror"
		cp /etc/resolv.conf "$new/etc/resolv.conf"
		# No init here: tell package scripts not to start services.
		printf "#!/bin/sh\nexit 101\n" >"$new/usr/sbin/policy-rc.d"
		chmod 755 "$new/usr/sbin/policy-rc.d"
		mountpoint -q "$new/proc" || mount -t proc proc "$new/proc"
		chroot "$new" apt-get update -q
		chroot "$new" env DEBIAN_FRONTEND=noninteractive \
			apt-get install -y -q --no-install-recommends $packages
		chroot "$new" apt-get clean
		rm -rf "$new"/var/lib/apt/lists/* # ~90 MB, and stale by next time anyway
		umount "$new/proc"
		chroot "$new" dpkg-query -W podman runc conmon netavark
	' build "$new" "$SUITE" "$MIRROR" "$PACKAGES" >"$ROOT/build.log" 2>&1 </dev/null; then
		tail -n 20 "$ROOT/build.log" >&2
		die "rootfs build failed (log: $ROOT/build.log)"
	fi
	mkdir -p "$new/.oldroot"
	rm -rf --one-file-system "$RFS"
	mv "$new" "$RFS"
	echo "$RECIPE" >"$ROOT/ready"
	log "rootfs ready: $(grep -E '^(podman|runc|conmon|netavark)\s' "$ROOT/build.log" | tr '\t\n' '= ' | sed 's/ $//')"
}

if ! rootfs_ok; then
	# Shared by every checkout: one build at a time, and maybe another run
	# finished it while we waited.
	exec 8>"$ROOT.lock"
	flock 8
	rootfs_ok || build_rootfs
	exec 8>&-
fi

# --- service --------------------------------------------------------------------

# Cheap and idempotent, so done at each start: config changes need no rebuild.
sync_file() { cmp -s "$1" "$2" 2>/dev/null || { mkdir -p "$(dirname "$2")" && cp "$1" "$2"; }; }
sync_config() {
	sync_file "$REPO/testdata/podman5/containers.conf" "$RFS/etc/containers/containers.conf"
	# Replaces the default network "podman": on bridge podman0 and 10.88.0.0/16
	# it would collide with the host's Podman (separate IPAM, duplicate IPs).
	sync_file "$REPO/testdata/podman5/podman-network.json" "$RFS/etc/containers/networks/podman.json"
	sync_file /etc/resolv.conf "$RFS/etc/resolv.conf" # used by the containers
}

start_service() {
	if pid=$(service_pid); then # ours but not answering: restart it
		kill "$pid" 2>/dev/null || true
		sleep 1
	fi
	rm -f "$SOCK" "$PIDFILE"
	sync_config
	mkdir -p "$STATE5/storage" "$RFS$STATE5" "$RFS/var/lib/containers/storage" "$RFS/.oldroot"
	log "starting podman 5 system service on unix://$SOCK"
	# Everything below is mounted in the service's own mount namespace: none
	# of it shows in the host's mount table, and it all goes away when the
	# last process in the namespace (the service, its conmons) exits.
	#  - the rootfs bind-mounted on itself: pivot_root needs a mount point
	#    (and image import fails with "remount /, flags: 0x44000" without);
	#  - a private /run (runroot, netns, runc state), fresh at each start, as
	#    after a reboot: Podman then resets the state left by a killed service;
	#  - a private /dev/shm: Podman's lock segment /dev/shm/libpod_lock has the
	#    same name in both versions; sharing the host's would mix their lock
	#    allocations (a restarting 5.4 frees all locks it finds there);
	#  - the state directory at its own path, so the socket has one name for
	#    the service and for its clients on the host;
	#  - the storage from the state directory.
	# setsid detaches it from our session; the inner sh records its own PID,
	# which exec turns into podman's.
	setsid unshare --mount --propagation private sh -eu -c '
		rfs=$1 state=$2 pidfile=$3 sock=$4
		mount --bind "$rfs" "$rfs"
		mount -t proc proc "$rfs/proc"
		mount --rbind /sys "$rfs/sys"
		mount --rbind /dev "$rfs/dev"
		mount -t tmpfs -o mode=1777,nosuid,nodev shm "$rfs/dev/shm"
		mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$rfs/run"
		mount --bind "$state" "$rfs$state"
		mount --bind "$state/storage" "$rfs/var/lib/containers/storage"
		echo $$ >"$pidfile"
		cd "$rfs"
		pivot_root . .oldroot
		cd /
		umount -l /.oldroot
		# --time=0: no idle timeout (the default 5 s drops long-lived clients).
		exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
			PODMAN_IGNORE_CGROUPSV1_WARNING=1 \
			podman system service --time=0 "unix://$sock"
	' podman5 "$RFS" "$STATE5" "$PIDFILE" "$SOCK" >"$LOG" 2>&1 </dev/null 9>&- &
	i=0
	until ping_ok; do
		i=$((i + 1))
		if [ $i -gt 60 ] || ! kill -0 "$(cat "$PIDFILE" 2>/dev/null || echo $!)" 2>/dev/null; then
			tail -n 20 "$LOG" >&2
			die "service did not answer on $SOCK (log: $LOG)"
		fi
		sleep 0.5
	done
	log "service up, pid $(cat "$PIDFILE"), $(api http://d/v5.0.0/libpod/version | grep -o '"Version":"[^"]*"' | head -n 1)"
}

ping_ok || start_service

# --- image ----------------------------------------------------------------------

if ! image_ok; then
	log "importing $IMAGE"
	# The same image as on the 4.3 side: testdata/image/build.sh, with the 5.4
	# CLI (running in remote mode against our socket) doing the import.
	CONTAINER_HOST=unix://$SOCK PODMAN="$REPO/scripts/podman5-cli" \
		"$REPO/testdata/image/build.sh" "$IMAGE" 9>&-
	image_ok || die "$IMAGE not found in the 5.4 storage after the import"
fi

print_env
