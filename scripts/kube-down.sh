#!/bin/sh
# Stops the cluster that scripts/kube-up.sh started, and nothing else, and
# undoes what it changed on the host:
#  1. the kubelet, the control plane and etcd: SIGTERM by PID (from
#     pids/, checked against the process's command line), SIGKILL after 10 s;
#  2. every task of our containerd's k8s.io namespace (pods' containers and
#     their pause containers), then containerd itself, then any shim left
#     that names our containerd's socket, and any process left in the
#     kubelet's kubepods cgroups;
#  3. the mounts under the state directory, the network namespaces that
#     containerd made (cni-*), the bridge, the kubepods cgroups, the
#     kubelet's iptables chains, and the sysctls the kubelet and the bridge
#     plugin changed (ip_forward only while no other bridge needs it).
# The API is not asked to delete pods first: killing them through containerd
# is as final and much faster, and etcd's data goes with the rest.
# Idempotent, and fast when nothing runs. Keeps the binary cache
# ($PODVM_KUBE_CACHE) and the last run's logs (logs.last/); removes the rest
# of $PODVM_STATE/kube.
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
STATE=${PODVM_STATE:-$REPO/.podvm}
[ -d "$STATE/kube" ] || exit 0 # never started here
K=$(cd "$STATE/kube" && pwd -P)
SOCK=$K/containerd.sock

log() { echo "kube-down: $*" >&2; }

# Not while scripts/kube-up.sh runs (it calls us with the lock held).
if [ "${PODVM_KUBE_LOCKED:-}" != 1 ]; then
	exec 9>"$K/lock"
	flock 9
fi

# Nothing but the lock (and old logs): nothing to do.
[ -n "$(ls -A "$K" | grep -vxE 'lock|logs\.last')" ] || exit 0

BIN= DEB= BRIDGE=podvmkube0 NETNAME=podvm-kube
# shellcheck source=/dev/null # written by kube-up.sh
[ ! -f "$K/down.env" ] || . "$K/down.env"
export PATH="$DEB/usr/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# The PID of component $1, if it is alive and still ours.
pid_of() {
	pid=$(cat "$K/pids/$1.pid" 2>/dev/null) || return 1
	tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF "$K/" || return 1
	echo "$pid"
}
# stop NAME...: SIGTERM to each, then wait for all, SIGKILL after 10 s.
stop() {
	pids=
	for c in "$@"; do
		if p=$(pid_of "$c"); then
			kill -TERM "$p" 2>/dev/null || true
			pids="$pids $p"
			log "stopping $c ($p)"
		fi
		rm -f "$K/pids/$c.pid"
	done
	i=0
	for p in $pids; do
		while [ -d "/proc/$p" ] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null; do
			i=$((i + 1))
			[ $i -ne 100 ] || { log "still running after 10 s: SIGKILL"; kill -KILL $pids 2>/dev/null || true; }
			[ $i -le 150 ] || { log "pid $p does not exit"; break; }
			sleep 0.1
		done
	done
}

# --- 1. processes -----------------------------------------------------------------

stop kubelet
stop kube-scheduler kube-controller-manager kube-apiserver
stop etcd # last: the API server, without it, takes its time to stop

# Pods: through containerd while it runs (the shims then clean up their mounts).
if pid_of containerd >/dev/null && command -v ctr >/dev/null; then
	for t in $(ctr -a "$SOCK" -n k8s.io tasks ls -q 2>/dev/null); do
		ctr -a "$SOCK" -n k8s.io tasks delete -f "$t" >/dev/null 2>&1 || true
	done
fi
stop containerd

# Shims of our containerd (their command line names its socket).
for d in /proc/[0-9]*; do
	if tr '\0' '\n' 2>/dev/null <"$d/cmdline" | grep -qxF "$SOCK"; then
		log "killing shim ${d#/proc/}"
		kill -KILL "${d#/proc/}" 2>/dev/null || true
	fi
done
# Whatever is left in the pods' cgroups (exec'd processes of a killed shim...).
procs() { find /sys/fs/cgroup/*/kubepods -name cgroup.procs -exec cat {} + 2>/dev/null || true; }
i=0
while [ -n "$(procs)" ] && [ $i -lt 50 ]; do
	[ $i -ne 0 ] || log "killing processes left in kubepods cgroups: $(procs | tr '\n' ' ')"
	# shellcheck disable=SC2046 # a list of PIDs
	kill -KILL $(procs) 2>/dev/null || true
	i=$((i + 1))
	sleep 0.1
done

# --- 2. host state ------------------------------------------------------------------

# Mounts under our directory (deepest first; the kubelet bind-mounts its root
# on itself), until none is left.
i=0
while grep -qF " $K/" /proc/self/mounts && [ $i -lt 5 ]; do
	awk -v k="$K/" 'index($2, k) == 1 { print $2 }' /proc/self/mounts | sort -r |
		while read -r m; do umount -l "$m" 2>/dev/null || true; done
	i=$((i + 1))
done
# Network namespaces: containerd's are named cni-*; those already there at
# kube-up.sh's start were not ours.
if [ -d /var/run/netns ]; then
	for n in $(ls /var/run/netns | grep '^cni-' | sort | comm -13 "$K/saved.netns" - 2>/dev/null); do
		umount "/var/run/netns/$n" 2>/dev/null || true
		rm -f "/var/run/netns/$n"
	done
fi
if ip link show "$BRIDGE" >/dev/null 2>&1; then
	ip link del "$BRIDGE" && log "removed bridge $BRIDGE"
fi
# libcni's cache of what our containerd set up: entries of our network, and
# of containerd's own loopback network made since kube-up.sh started (no other
# containerd runs here; Podman names its entries after its networks).
find /var/lib/cni/results -maxdepth 1 -type f \( -name "$NETNAME-*" -o -name 'cni-loopback-*' \) \
	-newer "$K/saved.sysctl" -delete 2>/dev/null || true
for h in /sys/fs/cgroup/*/kubepods; do
	[ -d "$h" ] || continue
	find "$h" -depth -type d -exec rmdir {} + 2>/dev/null || true
	[ ! -d "$h" ] || log "could not remove $h"
done

if [ -f "$K/saved.sysctl" ]; then
	# The kubelet's iptables objects: KUBE-FIREWALL (filter, from INPUT and
	# OUTPUT) and its canary and hint chains.
	for ch in INPUT OUTPUT; do
		while iptables -w -D "$ch" -j KUBE-FIREWALL 2>/dev/null; do :; done
	done
	iptables -w -F KUBE-FIREWALL 2>/dev/null && iptables -w -X KUBE-FIREWALL 2>/dev/null || true
	for c in iptables ip6tables; do
		for t in mangle nat filter; do
			for ch in KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
				$c -w -t $t -X $ch 2>/dev/null || true
			done
		done
	done
	# Other bridges (Podman's) need forwarding on: leave it on for them.
	others=$(ip -o link show type bridge 2>/dev/null | grep -vc " $BRIDGE:" || true)
	while read -r k v; do
		if [ "$k" = net/ipv4/ip_forward ] && [ "$others" != 0 ]; then continue; fi
		echo "$v" >"/proc/sys/$k" 2>/dev/null || log "could not restore $k to $v"
	done <"$K/saved.sysctl"
fi
# The kubelet's links to its pods' logs (a path it does not let us choose).
for l in /var/log/containers/*.log; do
	case $(readlink "$l" 2>/dev/null) in "$K"/*) rm -f "$l" ;; esac
done
# Directories that did not exist before kube-up.sh: containerd's /run
# directory goes (no other containerd had made it), and the kubelet's
# device-plugin socket; then each of them, if empty (Podman's CNI may have
# begun to use /var/lib/cni and /var/run/netns since).
if [ -f "$K/saved.absent" ]; then
	while read -r p; do
		case $p in
		/run/containerd) rm -rf "$p" ;;
		/var/lib/kubelet) rm -f "$p/device-plugins/kubelet.sock" ;;
		esac
		[ ! -d "$p" ] || find "$p" -depth -type d -empty -delete 2>/dev/null || true
	done <"$K/saved.absent"
fi

# --- 3. state -------------------------------------------------------------------------

if grep -qF " $K/" /proc/self/mounts; then
	log "mounts are left under $K; not removing it:"
	grep -F " $K/" /proc/self/mounts >&2
	exit 1
fi
rm -rf "$K/logs.last"
[ ! -d "$K/logs" ] || mv "$K/logs" "$K/logs.last"
for f in "$K"/* "$K"/.[!.]*; do
	case ${f##*/} in lock | logs.last | '.[!.]*' | '*') ;; *) rm -rf --one-file-system "$f" ;; esac
done
log "down"
