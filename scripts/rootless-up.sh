#!/bin/sh
# Brings up a rootless Podman service for podvm's tests: a dedicated
# unprivileged user, its subordinate IDs, its XDG_RUNTIME_DIR (made here:
# no login session), its own storage and test image, and its own
# `podman system service` on $XDG_RUNTIME_DIR/podman/podman.sock, the
# socket vm.New looks for first. Idempotent; needs root.
#
#   eval "$(scripts/rootless-up.sh)"   # CONTAINER_HOST is the rootless socket
#   scripts/as-rootless go-test-binary ...  # run it as that user, in that env
#
# The service is scripts/podman-up.sh run as the user (same image, same
# probe). Everything the user runs starts under a hard RLIMIT_NPROC of
# $PODVM_ROOTLESS_NPROC (default 4096): the kernel also caps the user's
# namespaces with it, so nothing the rootless service starts, whatever
# podvm does, can hold more tasks than that. It is a net for the machine,
# not podvm's enforcement: on a cgroup v1 host rootless Podman has no
# cgroup controllers, and podvm bounds each sandbox itself
# (docs/compatibility.md).
#
# Env: PODVM_ROOTLESS_USER  the user (default podvm-rootless; created as a
#                           system user, home /var/lib/$USER, with
#                           subordinate IDs 1048576:1048576 when it has none)
#      PODVM_ROOTLESS_NPROC the net above (default 4096)
#      PODVM_TEST_IMAGE     as scripts/podman-up.sh
# Prints `export` lines: CONTAINER_HOST, PODVM_TEST_IMAGE, and
# PODVM_ROOTLESS_USER. Stop with scripts/rootless-down.sh (it leaves the
# user, its subordinate IDs and its images for the next run).
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
RUSER=${PODVM_ROOTLESS_USER:-podvm-rootless}

log() { echo "rootless-up: $*" >&2; }
die() { log "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (it makes the user and its runtime directory)"

need=""
command -v podman >/dev/null || need="podman runc catatonit"
command -v newuidmap >/dev/null || need="$need uidmap"
command -v setpriv >/dev/null || need="$need util-linux"
if [ -n "$need" ]; then
	command -v apt-get >/dev/null || die "missing:$need"
	log "installing:$need"
	export DEBIAN_FRONTEND=noninteractive
	# shellcheck disable=SC2086 # a word list
	apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends $need >&2 ||
		{ apt-get -o DPkg::Lock::Timeout=300 update -q >&2 && apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends $need >&2; }
fi

if ! id -u "$RUSER" >/dev/null 2>&1; then
	log "creating user $RUSER"
	useradd --system --create-home --home-dir "/var/lib/$RUSER" --shell /usr/sbin/nologin "$RUSER"
fi
if ! grep -q "^$RUSER:" /etc/subuid 2>/dev/null || ! grep -q "^$RUSER:" /etc/subgid 2>/dev/null; then
	log "giving $RUSER subordinate IDs 1048576:1048576"
	usermod --add-subuids 1048576-2097151 --add-subgids 1048576-2097151 "$RUSER"
fi
env=$("$REPO/scripts/as-rootless" sh "$REPO/scripts/podman-up.sh") || die "the rootless service did not come up"
echo "$env" | grep -v '^export CONTAINERS_CONF=' # the user's own, in its PODVM_STATE
echo "export PODVM_ROOTLESS_USER=$RUSER"
