#!/bin/sh
# Brings up a Podman 5.4 API service (Debian trixie's package) beside the
# host's Podman 4.3, from nothing, idempotently, without touching the host's
# libc or its podman.
#
#   eval "$(scripts/podman5-up.sh)"   # CONTAINER_HOST is then the 5.4 socket
#
# How: a trixie minbase rootfs (debootstrap + apt, built once and cached),
# entered with pivot_root in private mount and PID namespaces. A plain chroot
# is not enough: the containers' mount namespaces would keep the host's "/" as
# their root, so every setns() into them (exec, top) would land in the HOST's
# filesystem. The PID namespace makes stopping exact: when its first process
# (catatonit, which runs the service) ends, the kernel kills everything left
# in it (conmons, containers), and the mounts vanish with the last of them.
# The service has its own socket, storage, /run, lock segment (/dev/shm) and
# default network (bridge podvm5br0, 10.95.0.0/16: testdata/podman5/).
#
# Like scripts/podman-up.sh: needs root (namespaces, pivot_root); installs
# debootstrap with apt on Debian/Ubuntu; builds the same test image; checks
# that a container starts with Podman's defaults and only where it does not
# applies testdata/containers.conf (runc, ulimits). Stdout carries only
# `export ...` lines; every message goes to stderr. From nothing: 2 to 5
# minutes (debootstrap); in a fresh clone, with the rootfs cached outside
# it: seconds (a copy); with the service up: a tenth of one.
#
# State, in $PODVM_STATE/podman5 (default <repo>/.podvm/podman5):
#   rootfs/          the trixie tree, kept across ups and downs
#   storage/         images and containers of the 5.4 service
#   podman.sock      the API socket (same path inside the namespace and out)
#   service.pid      PID of the `unshare` holding the namespaces
#   service.log, probe.log, rootfs.log
#   containers.conf  testdata/containers.conf, when the probe needed it;
#   defaults.ok      or this, when Podman's defaults worked
# Env: PODVM_STATE, PODVM_TEST_IMAGE (as scripts/podman-up.sh),
#      PODVM_PODMAN5_MIRROR  Debian mirror (default http://deb.debian.org/debian)
#      PODVM_PODMAN5_CACHE   where the built rootfs is kept for every clone
#                            (default /var/cache/podvm/podman5)
# Stop with scripts/podman5-down.sh; the 5.4 CLI is scripts/podman5-cli.
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
STATE=${PODVM_STATE:-$REPO/.podvm}
IMAGE=${PODVM_TEST_IMAGE:-localhost/podvm-test:latest}
MIRROR=${PODVM_PODMAN5_MIRROR:-http://deb.debian.org/debian}
CACHE=${PODVM_PODMAN5_CACHE:-/var/cache/podvm/podman5}

# runc: crun fails on cgroup v1 hybrid hosts. netavark + nftables: the
# bridge network. catatonit: PID 1 of the service's PID namespace.
# criu: checkpoints (trixie's 4.1 works on this kernel, bookworm's 3.17 does
# not); iptables: CRIU locks a container's network with iptables-restore.
PACKAGES="podman conmon runc netavark nftables catatonit criu iptables"
RECIPE="trixie: $PACKAGES; criu without breakpoints" # a rootfs built from another recipe is rebuilt

log() { echo "podman5-up: $*" >&2; }
die() { log "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (private namespaces, pivot_root)"
for tool in unshare pivot_root flock curl; do
	command -v "$tool" >/dev/null || die "$tool not found: install util-linux and curl"
done

mkdir -p "$STATE/podman5"
S5=$(cd "$STATE/podman5" && pwd -P) # bind-mounted at the same path inside
RFS=$S5/rootfs
SOCK=$S5/podman.sock
PIDFILE=$S5/service.pid
LOG=$S5/service.log
CONF=$S5/containers.conf
DEFAULTS_OK=$S5/defaults.ok
# sun_path holds 108 bytes: bind() fails on a longer socket path.
[ "${#SOCK}" -lt 100 ] || die "socket path too long ($SOCK): set PODVM_STATE to a shorter directory"

# One run at a time. Whatever we start that outlives us gets 9>&- so it does
# not hold the lock.
exec 9>"$S5/lock"
flock 9

unset CONTAINER_HOST CONTAINER_CONNECTION # we talk to $SOCK only

api() { curl -sS --max-time 10 --unix-socket "$SOCK" "$@"; }
ping_ok() { curl -fsS --max-time 2 --unix-socket "$SOCK" http://d/_ping 2>/dev/null | grep -qx OK; }
image_ok() { [ "$(api -o /dev/null -w '%{http_code}' "http://d/v5.0.0/libpod/images/$IMAGE/exists" 2>/dev/null)" = 204 ]; }
rootfs_ok() { [ "$(cat "$RFS/.podvm-recipe" 2>/dev/null)" = "$RECIPE" ]; }
# The PID in service.pid, if it is still our unshare (and not a reused PID).
service_pid() {
	pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
	tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | grep -qxF "$SOCK" || return 1
	echo "$pid"
}
stop_service() { PODVM_PODMAN5_LOCKED=1 "$REPO/scripts/podman5-down.sh" 9>&-; }

# PODVM_TEST_MOUNT_DIR: where tests make host directories to bind-mount;
# the service sees the state directory at its own path, not the host's /tmp.
print_env() {
	mkdir -p "$S5/mnt" && chmod 1777 "$S5/mnt"
	echo "export CONTAINER_HOST=unix://$SOCK"
	echo "export PODVM_TEST_IMAGE=$IMAGE"
	echo "export PODVM_TEST_MOUNT_DIR=$S5/mnt"
}

# Fast path: everything already up.
if rootfs_ok && service_pid >/dev/null && ping_ok && image_ok &&
	{ [ -f "$CONF" ] || [ -f "$DEFAULTS_OK" ]; }; then
	print_env
	exit 0
fi

# --- rootfs -----------------------------------------------------------------------

# build_rootfs DIR: debootstraps trixie with $PACKAGES into DIR.
build_rootfs() {
	if ! command -v debootstrap >/dev/null; then
		if [ -r /etc/debian_version ] && command -v apt-get >/dev/null; then
			log "installing debootstrap"
			export DEBIAN_FRONTEND=noninteractive
			apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends debootstrap >&2 ||
				{ apt-get -o DPkg::Lock::Timeout=300 update -q >&2 && apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends debootstrap >&2; }
		else
			die "debootstrap not found. On Debian/Ubuntu: sudo apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends debootstrap; elsewhere your distribution's debootstrap package."
		fi
	fi
	log "building a trixie rootfs in $RFS (a few minutes; log: $S5/rootfs.log)"
	# --one-file-system: never follow a mount into the host (there is none:
	# every mount below lives in a private namespace, gone with it).
	# shellcheck disable=SC2016 # expanded by the inner sh
	if ! unshare --mount --propagation private sh -euc '
		new=$1 mirror=$2 packages=$3
		debootstrap --variant=minbase trixie "$new" "$mirror"
		cp /etc/resolv.conf "$new/etc/resolv.conf"
		printf "#!/bin/sh\nexit 101\n" >"$new/usr/sbin/policy-rc.d" # no init: start no service
		chmod 755 "$new/usr/sbin/policy-rc.d"
		mountpoint -q "$new/proc" || mount -t proc proc "$new/proc"
		chroot "$new" apt-get -o DPkg::Lock::Timeout=300 update -q
		chroot "$new" env DEBIAN_FRONTEND=noninteractive \
			apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends $packages
		chroot "$new" apt-get clean
		# CRIU stops a dumped process on its way out of the parasite with a
		# hardware breakpoint. In this VM the breakpoint never fires, and
		# every dump hangs at "Waiting for N to trap". CRIU_FAULT=130 (its
		# FI_NO_BREAKPOINTS) makes it stop the process with PTRACE_SYSCALL
		# instead; runc and Podman run criu with an environment of their
		# own, so a wrapper sets it.
		chroot "$new" dpkg-divert --local --rename --add /usr/sbin/criu
		printf "#!/bin/sh\nCRIU_FAULT=130 exec /usr/sbin/criu.distrib \"\$@\"\n" >"$new/usr/sbin/criu"
		chmod 755 "$new/usr/sbin/criu"
		rm -rf "$new"/var/lib/apt/lists/* # tens of MB, stale by the next build anyway
		chroot "$new" dpkg-query -W $packages
	' build "$1" "$MIRROR" "$PACKAGES" >"$S5/rootfs.log" 2>&1 </dev/null; then
		tail -n 20 "$S5/rootfs.log" >&2
		die "rootfs build failed (log: $S5/rootfs.log)"
	fi
}

# A copy of the rootfs outside the clone, so that a fresh clone (CI) copies
# it in seconds instead of building it again.
rootfs_cached() { [ "$(cat "$CACHE/rootfs/.podvm-recipe" 2>/dev/null)" = "$RECIPE" ]; }

if ! rootfs_ok; then
	stop_service # it may run from the rootfs we replace
	rm -rf --one-file-system "$RFS.new"
	if mkdir -p "$CACHE" 2>/dev/null && exec 8>"$CACHE/lock"; then
		flock 8 # one build at a time, for every clone
		if rootfs_cached; then
			log "copying the trixie rootfs from $CACHE/rootfs"
			cp -a --one-file-system "$CACHE/rootfs" "$RFS.new"
		else
			build_rootfs "$RFS.new" 8>&-
			mkdir -p "$RFS.new/.oldroot"
			echo "$RECIPE" >"$RFS.new/.podvm-recipe"
			# The recipe goes first: a removal cut short leaves no tree
			# that rootfs_cached takes for whole.
			rm -f "$CACHE/rootfs/.podvm-recipe"
			rm -rf --one-file-system "$CACHE/rootfs.new" "$CACHE/rootfs"
			cp -a --one-file-system "$RFS.new" "$CACHE/rootfs.new" && mv "$CACHE/rootfs.new" "$CACHE/rootfs" ||
				log "could not cache the rootfs in $CACHE (the next clone builds it again)"
		fi
		exec 8>&-
	else
		log "$CACHE is not writable: building the rootfs for this clone alone"
		build_rootfs "$RFS.new"
		mkdir -p "$RFS.new/.oldroot"
		echo "$RECIPE" >"$RFS.new/.podvm-recipe"
	fi
	rm -rf --one-file-system "$RFS"
	mv "$RFS.new" "$RFS"
	log "rootfs ready: $(chroot "$RFS" dpkg-query -W $PACKAGES | tr '\t\n' '= ')"
fi

# --- service ----------------------------------------------------------------------

start_service() {
	stop_service # whatever is left of an earlier one (dead, or not answering)
	# Replaces the default network "podman", which on bridge podman0 and
	# 10.88.0.0/16 could collide with the host's Podman (separate IPAM).
	mkdir -p "$RFS/etc/containers/networks" "$RFS$S5" "$S5/storage"
	cp "$REPO/testdata/podman5/podman-network.json" "$RFS/etc/containers/networks/podman.json"
	cp /etc/resolv.conf "$RFS/etc/resolv.conf" # the containers' resolv.conf
	override=
	[ ! -f "$CONF" ] || override=CONTAINERS_CONF_OVERRIDE=$CONF
	log "starting podman 5 system service on unix://$SOCK"
	# The inner sh becomes PID 1 of the new PID namespace; all its mounts are
	# in the new mount namespace:
	#  - the rootfs on itself: pivot_root needs a mount point (image import
	#    fails with "remount /, flags: 0x44000" otherwise);
	#  - a fresh /run (runroot, netns, runc state) at each start, as after a
	#    reboot: Podman then resets what a killed service left behind;
	#  - a private /dev/shm: Podman's lock segment libpod_lock has the same
	#    name in 4.3 and 5.4; sharing it would mix their lock allocations;
	#  - the state directory at its own path: one socket path for all.
	# setsid detaches it from our session; the outer sh records its own PID,
	# which exec turns into unshare's. --kill-child: whatever kills unshare
	# kills the namespace too.
	# shellcheck disable=SC2016 # expanded by the inner sh
	setsid sh -c 'echo $$ >"$0"; exec "$@"' "$PIDFILE" \
		unshare --mount --propagation private --pid --fork --kill-child sh -euc '
		rfs=$1 state=$2 sock=$3 override=$4
		mount --bind "$rfs" "$rfs"
		mount -t proc proc "$rfs/proc"
		mount --rbind /sys "$rfs/sys"
		mount --rbind /dev "$rfs/dev"
		mount -t tmpfs -o mode=1777,nosuid,nodev shm "$rfs/dev/shm"
		mount -t tmpfs -o mode=755,nosuid,nodev run "$rfs/run"
		mount --bind "$state" "$rfs$state"
		cd "$rfs"
		pivot_root . .oldroot
		cd /
		umount -l /.oldroot
		# --time=0: no idle timeout (the default 5 s drops long-lived clients).
		exec env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
			PODMAN_IGNORE_CGROUPSV1_WARNING=1 $override \
			catatonit -- podman --root "$state/storage" \
			system service --time=0 "unix://$sock"
	' podvm-podman5 "$RFS" "$S5" "$SOCK" "$override" >"$LOG" 2>&1 </dev/null 9>&- &
	i=0
	until ping_ok; do
		i=$((i + 1))
		sleep 0.5 # first: lets the outer sh write service.pid
		# Alive by kill -0, not service_pid: a process that execs has, for
		# an instant, no command line to read, and would look dead.
		if [ $i -gt 60 ] || ! kill -0 "$(cat "$PIDFILE" 2>/dev/null)" 2>/dev/null; then
			tail -n 20 "$LOG" >&2
			die "service did not answer on $SOCK (log: $LOG)"
		fi
	done
	log "service up, pid $(cat "$PIDFILE"), $(api http://d/v5.0.0/libpod/version | grep -o '"Version":"[^"]*"' | head -n 1)"
}

if ! service_pid >/dev/null || ! ping_ok; then start_service; fi

# --- image ------------------------------------------------------------------------

if ! image_ok; then
	log "building $IMAGE"
	PODMAN="$REPO/scripts/podman5-cli" sh "$REPO/testdata/image/build.sh" "$IMAGE" 9>&-
fi

# --- probe: does a container start with the current configuration? --------------
# As in scripts/podman-up.sh: the OCI runtime, the cgroup layout and the
# default rlimits differ between machines.

probe() {
	name=podvm-probe-$$
	ok=0
	"$REPO/scripts/podman5-cli" run --rm --name "$name" --network none "$IMAGE" true >>"$S5/probe.log" 2>&1 9>&- || ok=1
	"$REPO/scripts/podman5-cli" rm -f -t 0 "$name" >/dev/null 2>&1 || true # --rm may not clean up a failed start
	return $ok
}

if [ -f "$CONF" ]; then
	# Decision already taken: keep the copy in step with testdata.
	if ! cmp -s "$REPO/testdata/containers.conf" "$CONF"; then
		cp "$REPO/testdata/containers.conf" "$CONF"
		start_service
	fi
elif [ ! -f "$DEFAULTS_OK" ]; then
	: >"$S5/probe.log"
	if probe; then
		log "containers start with Podman's defaults"
		touch "$DEFAULTS_OK"
	else
		log "containers do not start with Podman's defaults (see $S5/probe.log); trying testdata/containers.conf"
		cp "$REPO/testdata/containers.conf" "$CONF"
		start_service
		if ! probe; then
			rm -f "$CONF"
			cat "$S5/probe.log" >&2
			die "containers do not start, with or without testdata/containers.conf"
		fi
		log "using $CONF"
	fi
fi

print_env
