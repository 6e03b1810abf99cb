#!/bin/sh
# Builds podvm's test image with no registry: a rootfs holding a static busybox
# (Debian's busybox-static) and a link per applet, imported as a single layer.
#
# Usage: build.sh [IMAGE]   (default localhost/podvm-test:latest)
# Env:   BUSYBOX  path of a statically linked busybox (default /bin/busybox)
#        PODMAN   podman command to use (default podman)
#        ARCHIVE  write the image to this file as a docker-archive instead of
#                 importing it with $PODMAN (scripts/kube-up.sh: for a
#                 cluster node's containerd, which has no registry to pull from)
#
# Layout (merged /usr, as in current Debian images):
#   /usr/bin/busybox + one symlink per applet (sh, sleep, ps, nc, cat, head, dd...)
#   /bin, /sbin -> usr/bin, /usr/sbin -> bin
#   /etc/passwd, /etc/group with root (0) and nobody (65534); /tmp 1777; /root
set -eu

IMAGE=${1:-localhost/podvm-test:latest}
BUSYBOX=${BUSYBOX:-/bin/busybox}
PODMAN=${PODMAN:-podman}
ARCHIVE=${ARCHIVE:-}

[ -x "$BUSYBOX" ] || { echo "build.sh: $BUSYBOX not found (install busybox-static)" >&2; exit 1; }
# A dynamic busybox would need the host's libc inside the image.
if ldd "$BUSYBOX" >/dev/null 2>&1; then
	echo "build.sh: $BUSYBOX is dynamically linked (install busybox-static)" >&2
	exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
r=$tmp/rootfs
mkdir -p "$r/usr/bin" "$r/etc" "$r/root" "$r/tmp" "$r/proc" "$r/sys" "$r/dev" "$r/run"
chmod 1777 "$r/tmp"
chmod 700 "$r/root"
ln -s usr/bin "$r/bin"
ln -s usr/bin "$r/sbin"
ln -s bin "$r/usr/sbin"

cp "$BUSYBOX" "$r/usr/bin/busybox"
for a in $("$BUSYBOX" --list); do
	[ "$a" = busybox ] || ln -s busybox "$r/usr/bin/$a"
done

cat >"$r/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
PASSWD
cat >"$r/etc/group" <<'GROUP'
root:x:0:
nogroup:x:65534:
GROUP

# For a cluster: the same tree and runtime config as the import below.
if [ -n "$ARCHIVE" ]; then
	. "$(dirname "$0")/../../scripts/lib.sh"
	podvm_docker_archive "$IMAGE" "$r" '{"Env":["PATH=/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":["/bin/sh"]}' "$ARCHIVE"
	echo "build.sh: wrote $IMAGE to $ARCHIVE from $BUSYBOX" >&2
	exit 0
fi

# Owned by root in the image whoever builds it (rootless builds included).
tar -C "$r" --numeric-owner --owner=0 --group=0 -cf "$tmp/rootfs.tar" .
"$PODMAN" import --quiet \
	--change 'CMD ["/bin/sh"]' \
	--change 'ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin' \
	"$tmp/rootfs.tar" "$IMAGE" >/dev/null
echo "build.sh: built $IMAGE from $BUSYBOX" >&2
