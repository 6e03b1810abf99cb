#!/bin/sh
# Brings up a real one-node Kubernetes for podvm's tests, from a fresh Debian
# machine (root), idempotently:
#
#   eval "$(scripts/kube-up.sh)"   # KUBECONFIG then names the cluster
#
# What runs: containerd (Debian's 1.6) with runc and the CNI bridge plugin,
# etcd (Debian's 3.4), and kube-apiserver, kube-controller-manager,
# kube-scheduler and kubelet built from the Go module proxy: a real API server
# and a real kubelet running real containers. The API server listens on
# 127.0.0.1:6443 only; the kubelet on this host's address, port 10250. One
# cluster per machine: the ports are fixed.
#
# How:
#  - apt installs runc, containernetworking-plugins, busybox-static, iptables,
#    openssl, curl (and gcc, once, for the pause image). containerd and etcd
#    are `apt-get -o DPkg::Lock::Timeout=300 download`ed and unpacked with `dpkg-deb -x`: installing them
#    would start system services.
#  - testdata/kube/build is a wrapper module that requires k8s.io/kubernetes
#    and replaces its k8s.io/* staging modules with their published versions;
#    the five commands (kubectl too) build from it with CGO_ENABLED=0 and a
#    pinned build date, so that the Go build cache stays valid. A cold build
#    takes 8 to 16 minutes on two cores; it runs only when the binary cache
#    lacks the binaries, which a fresh clone (CI) then reuses.
#  - No registry: the pause image is compiled from Kubernetes' own pause.c
#    (in the module), the test image is testdata/image/build.sh's (busybox:
#    sh, tar, cat...), both written as docker-archives and imported into
#    containerd's k8s.io namespace. Pods use them with imagePullPolicy Never.
#  - This host's quirks: no CAP_SYS_RESOURCE, so runc cannot lower
#    oom_score_adj (containerd restrict_oom_score_adj, kubelet oomScoreAdj 0);
#    cgroup v1 hybrid with a PID 1 that is not systemd (cgroupDriver
#    cgroupfs, failCgroupV1 false).
#
# What the cluster enforces, and what it does not:
#  - memory and CPU limits: yes (cgroup v1 memory and cpu controllers,
#    cgroupfs): over its memory limit a container is OOMKilled (exit 137).
#  - process count: only per pod and node-wide, never per container: the
#    kubelet's podPidsLimit (PODVM_KUBE_POD_PIDS_LIMIT, pids cgroup of the
#    pod). A pod spec cannot ask for a pids limit of its own.
#  - NetworkPolicy: NO. The API accepts NetworkPolicy objects, but the only
#    network plugin is the CNI bridge, which ignores them
#    (PODVM_KUBE_NETWORKPOLICY=unenforced): a deny-all policy does not stop
#    a pod's traffic here.
#  - Network: pods share bridge podvmkube0 (10.244.0.0/16), and reach each
#    other and the node at the bridge's address, 10.244.0.1
#    (PODVM_KUBE_POD_GATEWAY: a test's listener there is a target every pod
#    can reach unless a policy holds). Nothing else: pods have no default
#    route, so no packet of theirs leaves the machine. No kube-proxy
#    (Service IPs, 10.96.0.0/24, lead nowhere), no cluster DNS (pods get
#    the host's resolv.conf, whose servers they cannot reach).
#  - activeDeadlineSeconds, securityContext (readOnlyRootFilesystem,
#    capabilities, runAsUser, allowPrivilegeEscalation): enforced by the
#    kubelet and runc as on any cluster. A deadline kills like a delete:
#    SIGTERM, then SIGKILL after terminationGracePeriodSeconds (default 30;
#    a PID 1 ignores SIGTERM). hostPath volumes work (this host is the
#    node). No admission policy beyond the defaults (PodSecurity admits
#    everything: no namespace labels).
#  - Logs: containerd writes every byte a container prints, attached or not,
#    to its log under pod-logs/ (CRI has no "none" log driver); the kubelet
#    rotates it at 10 MiB, two files per container.
#  - RuntimeClass: one, "runc" (PODVM_KUBE_RUNTIME_CLASS), the only handler.
#
# Stdout carries only `export ...` lines (KUBECONFIG, PODVM_KUBE_IMAGE,
# PODVM_KUBE_NAMESPACE, the PODVM_KUBE_* facts above, PODVM_KUBE_VERSION and
# PODVM_KUBECTL, the cluster's own kubectl); every message goes to stderr. With
# the binaries cached, from nothing to a Ready node takes about 15 s; with
# the cluster up, under a second.
#
# State, per clone, in $PODVM_STATE/kube (default <repo>/.podvm/kube):
#   pki/, *.kubeconfig  a CA, certificates, kubeconfigs (admin.kubeconfig)
#   containerd/, etcd/, kubelet/, pod-logs/, cni/   the components' data
#   images/             the docker-archives imported into containerd
#   logs/, pids/        one log and one PID file per component
#   saved.*             host settings that scripts/kube-down.sh restores
# The binaries, per Kubernetes and Go version, outside the clone:
#   $PODVM_KUBE_CACHE/<k8s>-<go>/bin (default /var/cache/podvm/kube), with
#   pause.tar and build.log; $PODVM_KUBE_CACHE/debian: containerd and etcd.
# Env: PODVM_STATE, PODVM_KUBE_CACHE as above;
#      PODVM_KUBE_IMAGE      test image (default localhost/podvm-test:latest)
#      PODVM_KUBE_NAMESPACE  namespace for tests (default podvm-test)
#      GO                    go command (default go, else /usr/local/go/bin/go)
# Stop with scripts/kube-down.sh (which keeps the caches); check with
# scripts/kube-smoke.sh.
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
STATE=${PODVM_STATE:-$REPO/.podvm}
CACHE=${PODVM_KUBE_CACHE:-/var/cache/podvm/kube}
IMAGE=${PODVM_KUBE_IMAGE:-localhost/podvm-test:latest}
NAMESPACE=${PODVM_KUBE_NAMESPACE:-podvm-test}
MOD=$REPO/testdata/kube/build
KVER=$(grep -o 'k8s.io/kubernetes v[0-9.]*' "$MOD/go.mod" | head -n 1 | cut -dv -f2)
PODS_CIDR=10.244.0.0/16 # Podman's networks: 10.88.0.0/16, podvm5br0 10.95.0.0/16
GATEWAY=${PODS_CIDR%.*/*}.1
SERVICES_CIDR=10.96.0.0/24 # no kube-proxy: only the API server's own Service uses it
BRIDGE=podvmkube0
NETNAME=podvm-kube
PIDS_LIMIT=4096 # per pod (kubelet podPidsLimit)
RUNTIME_CLASS=runc

log() { echo "kube-up: $*" >&2; }
die() { log "$*"; exit 1; }
T0=$(date +%s.%N)
elapsed() { awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1fs", b - a }'; }

[ "$(id -u)" = 0 ] || die "must run as root (containerd, kubelet, cgroups, iptables)"
[ -n "$KVER" ] || die "no k8s.io/kubernetes version in $MOD/go.mod"

GO=$(command -v "${GO:-go}" || command -v /usr/local/go/bin/go) || die "go not found (set GO)"
GOVER=$("$GO" env GOVERSION)
KC=$CACHE/$KVER-$GOVER
BIN=$KC/bin
DEB=$CACHE/debian
export PATH="$BIN:$DEB/usr/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
unset KUBECONFIG # ours is passed explicitly

mkdir -p "$STATE/kube"
K=$(cd "$STATE/kube" && pwd -P)
SOCK=$K/containerd.sock
# sun_path holds 108 bytes; containerd adds ".ttrpc".
[ "${#SOCK}" -lt 95 ] || die "socket path too long ($SOCK): set PODVM_STATE to a shorter directory"

# One run at a time (kube-down.sh too). What we start gets 9>&-.
exec 9>"$K/lock"
flock 9

NODE=$(hostname | tr 'A-Z' 'a-z')

kc() { kubectl --kubeconfig "$K/admin.kubeconfig" "$@"; }
COMPONENTS="containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet"
# The PID of component $1, if it is alive and still ours (its command line
# names our state directory: not a reused PID).
pid_of() {
	pid=$(cat "$K/pids/$1.pid" 2>/dev/null) || return 1
	tr '\0' '\n' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF "$K/" || return 1
	echo "$pid"
}
print_env() {
	echo "export KUBECONFIG=$K/admin.kubeconfig"
	echo "export PODVM_KUBE_IMAGE=$IMAGE"
	echo "export PODVM_KUBE_NAMESPACE=$NAMESPACE"
	echo "export PODVM_KUBE_RUNTIME_CLASS=$RUNTIME_CLASS"
	echo "export PODVM_KUBE_NETWORKPOLICY=unenforced"
	echo "export PODVM_KUBE_POD_GATEWAY=$GATEWAY"
	echo "export PODVM_KUBE_POD_PIDS_LIMIT=$PIDS_LIMIT"
	echo "export PODVM_KUBE_VERSION=$KVER"
	echo "export PODVM_KUBECTL=$BIN/kubectl"
	# An image with no shell, tar or cat, present on the node: the pause
	# image, for the tests of an image podvm's pods cannot run.
	echo "export PODVM_KUBE_SHELLLESS_IMAGE=$(cat "$KC/pause.ref" 2>/dev/null)"
}
ready() {
	for c in $COMPONENTS; do pid_of "$c" >/dev/null || return 1; done
	[ "$(kc get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ] &&
		kc -n "$NAMESPACE" get serviceaccount default >/dev/null 2>&1 &&
		ctr -a "$SOCK" -n k8s.io images ls -q 2>/dev/null | grep -qxF "$IMAGE"
}

# Fast path: everything already up.
if [ -x "$BIN/kubelet" ] && [ -f "$K/admin.kubeconfig" ] && ready; then
	print_env
	exit 0
fi

# --- packages -----------------------------------------------------------------

static_busybox() { [ -x /bin/busybox ] && ! ldd /bin/busybox >/dev/null 2>&1; }
need=
command -v runc >/dev/null || need="$need runc"
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] && [ -x /usr/lib/cni/loopback ] ||
	need="$need containernetworking-plugins"
static_busybox || need="$need busybox-static"
for t in iptables openssl curl; do command -v $t >/dev/null || need="$need $t"; done
command -v ip >/dev/null || need="$need iproute2"
command -v flock >/dev/null || need="$need util-linux"
[ -f "$KC/pause.tar" ] || command -v gcc >/dev/null || need="$need gcc libc6-dev"
apt_lists_fresh() { [ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mmin -1440 2>/dev/null | head -n 1)" ]; }
if [ -n "$need" ]; then
	[ -r /etc/debian_version ] && command -v apt-get >/dev/null ||
		die "missing:$need (Debian's package names); install them and run again"
	log "installing:$need"
	export DEBIAN_FRONTEND=noninteractive
	apt_lists_fresh || apt-get -o DPkg::Lock::Timeout=300 update -q >&2
	# shellcheck disable=SC2086 # a word list
	apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends $need >&2 ||
		{ apt-get -o DPkg::Lock::Timeout=300 update -q >&2 && apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends $need >&2; }
fi

# containerd and etcd, unpacked, not installed: no service starts.
if [ ! -x "$DEB/usr/bin/containerd" ] || [ ! -x "$DEB/usr/bin/etcd" ]; then
	log "fetching Debian's containerd and etcd-server into $DEB"
	rm -rf "$DEB.new"
	mkdir -p "$DEB.new/debs"
	# _apt cannot write here: download as root.
	dl() { (cd "$DEB.new/debs" && apt-get -o DPkg::Lock::Timeout=300 download -q -o APT::Sandbox::User=root containerd etcd-server >&2); }
	dl || { apt-get -o DPkg::Lock::Timeout=300 update -q >&2 && dl; } ||
		die "apt-get -o DPkg::Lock::Timeout=300 download containerd etcd-server failed"
	for d in "$DEB.new"/debs/*.deb; do dpkg-deb -x "$d" "$DEB.new"; done
	rm -rf "$DEB.new/debs" "$DEB"
	mv "$DEB.new" "$DEB"
fi

# --- Kubernetes binaries ----------------------------------------------------------

CMDS="kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl"
have_bins() { for c in $CMDS; do [ -x "$BIN/$c" ] || return 1; done; }
if ! have_bins; then
	mkdir -p "$KC"
	exec 8>"$KC/lock" # one build per cache, whichever clone asks
	flock 8
	if ! have_bins; then
		log "building Kubernetes $KVER with $GOVER into $BIN (8 to 16 minutes on two cores; log: $KC/build.log)"
		maj=${KVER%%.*} min=${KVER#*.}
		min=${min%%.*}
		# A fixed build date and commit: the same flags every time, so that a
		# rebuild (another cache directory) reuses Go's build cache.
		ld="-s -w"
		for kv in gitVersion=v$KVER gitMajor=$maj gitMinor=$min gitTreeState=clean \
			gitCommit=module-v$KVER buildDate=1970-01-01T00:00:00Z; do
			ld="$ld -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
		done
		pkgs=
		for c in $CMDS; do pkgs="$pkgs k8s.io/kubernetes/cmd/$c"; done
		rm -rf "$BIN.new"
		mkdir -p "$BIN.new"
		# nice: the machine is shared with test runs.
		# shellcheck disable=SC2086 # a word list
		if ! (cd "$MOD" && env CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false" \
			nice -n 10 "$GO" build -trimpath -ldflags "$ld" -o "$BIN.new/" $pkgs) >"$KC/build.log" 2>&1 9>&- 8>&-; then
			tail -n 20 "$KC/build.log" >&2
			die "build failed (log: $KC/build.log)"
		fi
		rm -rf "$BIN"
		mv "$BIN.new" "$BIN"
		log "built in $(elapsed): $(du -sh "$BIN" | cut -f1)"
	fi
	exec 8>&-
fi

# --- images -----------------------------------------------------------------------

# pause, from the pause.c of the module we built from, tagged as its Makefile does.
if [ ! -f "$KC/pause.tar" ] || [ ! -f "$KC/pause.ref" ]; then
	src=$(cd "$MOD" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly "$GO" mod download -json k8s.io/kubernetes |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')/build/pause/linux/pause.c
	[ -f "$src" ] || die "no pause.c in the k8s.io/kubernetes module ($src)"
	PAUSE_TAG=$(sed -n 's/^TAG ?= *//p' "${src%/linux/pause.c}/Makefile")
	PAUSE_IMAGE=localhost/podvm-pause:$PAUSE_TAG
	r=$(mktemp -d)
	gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_TAG-podvm" -o "$r/pause" "$src"
	strip "$r/pause"
	# shellcheck source=lib.sh
	. "$REPO/scripts/lib.sh"
	podvm_docker_archive "$PAUSE_IMAGE" "$r" '{"Entrypoint":["/pause"]}' "$KC/pause.tar"
	echo "$PAUSE_IMAGE" >"$KC/pause.ref"
	rm -rf "$r"
	log "built $PAUSE_IMAGE from $src"
fi
PAUSE_IMAGE=$(cat "$KC/pause.ref")

# --- start from a clean slate -----------------------------------------------------

# The kubelet's address: the one this host uses outward (no packet is sent).
NODE_IP=$(ip -4 route get 1.1.1.1 2>/dev/null | awk '{ for (i = 1; i < NF; i++) if ($i == "src") { print $(i + 1); exit } }') || NODE_IP=
[ -n "$NODE_IP" ] || NODE_IP=$(hostname -I | awk '{ print $1 }')
[ -n "$NODE_IP" ] || die "no IPv4 address for the kubelet"

# Whatever is left of an earlier run (a component died, the machine was
# not brought down): stop it and clear the state.
PODVM_KUBE_LOCKED=1 "$REPO/scripts/kube-down.sh" 9>&-
for port in 2379 2380 2381 6443 10248 10250 10257 10259; do
	if ss -Hltn "sport = :$port" | grep -q .; then
		die "port $port is in use: another cluster runs on this machine (scripts/kube-down.sh of its clone stops it)"
	fi
done
mkdir -p "$K/logs" "$K/pids" "$K/images" "$K/pki" "$K/cni/net.d"
# What kube-down.sh needs to know, without Go at hand.
cat >"$K/down.env" <<EOF
BIN=$BIN
DEB=$DEB
BRIDGE=$BRIDGE
NETNAME=$NETNAME
EOF

# Host settings that the kubelet and the bridge change: restored by kube-down.sh.
for k in vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops \
	kernel/keys/root_maxkeys kernel/keys/root_maxbytes net/ipv4/ip_forward; do
	echo "$k $(cat "/proc/sys/$k")"
done >"$K/saved.sysctl"
ls /var/run/netns 2>/dev/null | sort >"$K/saved.netns" || true
for p in /run/containerd /var/lib/cni /var/run/netns /var/lib/kubelet /var/log/pods /var/log/containers /etc/kubernetes; do
	[ -e "$p" ] || echo "$p"
done >"$K/saved.absent"

start() { # NAME CMD...: in its own session, its PID in pids/NAME.pid
	name=$1
	shift
	# An earlier run's PID file would read as this one dead until the
	# new one is in place.
	rm -f "$K/pids/$name.pid"
	# shellcheck disable=SC2016 # expanded by the inner sh
	# The PID file appears whole (renamed into place): wait_for reads it
	# while this starts, and an empty one would read as a dead process.
	setsid sh -c 'echo $$ >"$0.new" && mv "$0.new" "$0" && exec "$@"' "$K/pids/$name.pid" "$@" >"$K/logs/$name.log" 2>&1 </dev/null 9>&- &
}
wait_for() { # NAME SECONDS CMD...: until CMD succeeds, while NAME runs
	name=$1 n=$(($2 * 10))
	shift 2
	until "$@" >/dev/null 2>&1; do
		n=$((n - 1))
		# Alive by kill -0, not pid_of: a process that execs has, for an
		# instant, no command line to read, and would look dead.
		if [ $n -le 0 ] || { [ -f "$K/pids/$name.pid" ] && ! kill -0 "$(cat "$K/pids/$name.pid")" 2>/dev/null; }; then
			tail -n 20 "$K/logs/$name.log" >&2
			die "$name is not ready (log: $K/logs/$name.log)"
		fi
		sleep 0.1
	done
	log "$name ready at $(elapsed)"
}

# --- certificates and kubeconfigs ---------------------------------------------------

log "certificates for node $NODE ($NODE_IP)"
PKI=$K/pki
(
	cd "$PKI"
	openssl ecparam -name prime256v1 -genkey -noout -out ca.key
	openssl req -x509 -new -key ca.key -subj /CN=podvm-kube-ca -days 3650 -out ca.crt
	cert() { # NAME SUBJECT EXTENSIONS
		openssl ecparam -name prime256v1 -genkey -noout -out "$1.key"
		openssl req -new -key "$1.key" -subj "$2" -out "$1.csr"
		printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n%s\n' "$3" >"$1.ext"
		openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile "$1.ext" -out "$1.crt"
		rm -f "$1.csr" "$1.ext"
	}
	svc_ip=${SERVICES_CIDR%.*/*}.1
	cert apiserver /CN=kube-apiserver "extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:$svc_ip,IP:$NODE_IP"
	cert kubelet-serving "/CN=$NODE" "extendedKeyUsage=serverAuth
subjectAltName=DNS:$NODE,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP"
	cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" extendedKeyUsage=clientAuth
	cert admin "/O=system:masters/CN=podvm-admin" extendedKeyUsage=clientAuth
	cert controller-manager /CN=system:kube-controller-manager extendedKeyUsage=clientAuth
	cert scheduler /CN=system:kube-scheduler extendedKeyUsage=clientAuth
	cert kubelet "/O=system:nodes/CN=system:node:$NODE" extendedKeyUsage=clientAuth
	openssl genrsa -out sa.key 2048
	openssl rsa -in sa.key -pubout -out sa.pub
) >"$K/logs/pki.log" 2>&1 || { cat "$K/logs/pki.log" >&2; die "openssl failed"; }
for u in admin controller-manager scheduler kubelet; do
	ns= # kubectl's default namespace: the tests'
	[ $u != admin ] || ns=", namespace: $NAMESPACE"
	cat >"$K/$u.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: podvm
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority: $PKI/ca.crt
users:
- name: $u
  user:
    client-certificate: $PKI/$u.crt
    client-key: $PKI/$u.key
contexts:
- name: podvm
  context: {cluster: podvm, user: $u$ns}
current-context: podvm
EOF
done

# --- containerd and etcd --------------------------------------------------------------

# isGateway: the bridge gets $GATEWAY, so pods reach the node; no
# isDefaultGateway, no ipMasq: they reach nothing beyond it.
cat >"$K/cni/net.d/10-$NETNAME.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "$NETNAME", "plugins": [
  {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$PODS_CIDR"}]], "dataDir": "$K/cni/ipam"}}]}
EOF
cat >"$K/containerd.toml" <<EOF
version = 2
root = "$K/containerd/root"
state = "$K/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "$SOCK"
[ttrpc]
  address = "$SOCK.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$K/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # No CAP_SYS_RESOURCE here: runc init fails to lower oom_score_adj (-998
  # for the pause container) with "can't get final child's PID from pipe".
  restrict_oom_score_adj = true
  enable_cdi = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "$RUNTIME_CLASS"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.$RUNTIME_CLASS]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.$RUNTIME_CLASS.options]
        SystemdCgroup = false
        Root = "$K/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$K/cni/net.d"
EOF
start containerd containerd --config "$K/containerd.toml"
start etcd etcd --name podvm --data-dir "$K/etcd" \
	--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
	--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
	--initial-cluster podvm=http://127.0.0.1:2380 --listen-metrics-urls http://127.0.0.1:2381
wait_for containerd 30 ctr -a "$SOCK" version
ARCHIVE=$K/images/test.tar sh "$REPO/testdata/image/build.sh" "$IMAGE" 2>>"$K/logs/images.log" 9>&- ||
	{ cat "$K/logs/images.log" >&2; die "test image build failed"; }
for a in "$KC/pause.tar" "$K/images/test.tar"; do
	ctr -a "$SOCK" -n k8s.io images import "$a" >>"$K/logs/images.log" 2>&1 ||
		{ cat "$K/logs/images.log" >&2; die "ctr images import $a failed"; }
done
log "images $PAUSE_IMAGE and $IMAGE imported at $(elapsed)"
wait_for etcd 30 curl -sf http://127.0.0.1:2379/health

# --- control plane ----------------------------------------------------------------------

start kube-apiserver kube-apiserver \
	--etcd-servers=http://127.0.0.1:2379 \
	--bind-address=127.0.0.1 --secure-port=6443 \
	--tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
	--client-ca-file="$PKI/ca.crt" \
	--kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
	--kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
	--kubelet-certificate-authority="$PKI/ca.crt" \
	--kubelet-preferred-address-types=InternalIP,Hostname \
	--service-account-issuer=https://kubernetes.default.svc.cluster.local \
	--service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
	--service-cluster-ip-range=$SERVICES_CIDR \
	--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
	--allow-privileged=true --profiling=false
wait_for kube-apiserver 120 curl -sfk https://127.0.0.1:6443/readyz
start kube-controller-manager kube-controller-manager \
	--kubeconfig="$K/controller-manager.kubeconfig" \
	--authentication-kubeconfig="$K/controller-manager.kubeconfig" \
	--authorization-kubeconfig="$K/controller-manager.kubeconfig" \
	--bind-address=127.0.0.1 --secure-port=10257 --leader-elect=false --cert-dir="$K/kcm-certs" \
	--use-service-account-credentials=true --service-account-private-key-file="$PKI/sa.key" \
	--root-ca-file="$PKI/ca.crt" --cluster-signing-cert-file="$PKI/ca.crt" \
	--cluster-signing-key-file="$PKI/ca.key" --service-cluster-ip-range=$SERVICES_CIDR --profiling=false
start kube-scheduler kube-scheduler \
	--kubeconfig="$K/scheduler.kubeconfig" \
	--authentication-kubeconfig="$K/scheduler.kubeconfig" --authorization-kubeconfig="$K/scheduler.kubeconfig" \
	--bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false --profiling=false

# --- kubelet ------------------------------------------------------------------------------

# Eviction thresholds low: a busy shared disk must not make the kubelet evict
# test pods. Image GC off: the images cannot be pulled again.
cat >"$K/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
oomScoreAdj: 0
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
podLogsDir: $K/pod-logs
volumePluginDir: $K/kubelet-plugins
maxPods: 250
podPidsLimit: $PIDS_LIMIT
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%", imagefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
containerLogMaxSize: 10Mi
containerLogMaxFiles: 2
rotateCertificates: false
EOF
start kubelet kubelet --config="$K/kubelet.yaml" --kubeconfig="$K/kubelet.kubeconfig" \
	--root-dir="$K/kubelet" --hostname-override="$NODE" --node-ip="$NODE_IP"

# What the tests use; their namespace gets its ServiceAccount from the
# controller-manager.
kc apply -f - >"$K/logs/apply.log" 2>&1 <<EOF || { cat "$K/logs/apply.log" >&2; die "kubectl apply failed"; }
apiVersion: v1
kind: Namespace
metadata: {name: $NAMESPACE}
---
apiVersion: node.k8s.io/v1
kind: RuntimeClass
metadata: {name: $RUNTIME_CLASS}
handler: $RUNTIME_CLASS
EOF
node_ready() { [ "$(kc get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
wait_for kubelet 120 node_ready
wait_for kube-controller-manager 60 kc -n "$NAMESPACE" get serviceaccount default
ready || die "the cluster came up but does not look ready (logs: $K/logs)"
log "cluster up in $(elapsed): node $NODE, Kubernetes $KVER"
print_env
