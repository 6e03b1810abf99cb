#!/bin/sh
# Brings up an sshd on 127.0.0.1 through which podvm's tests reach the
# Podman service of scripts/podman-up.sh as ssh://, idempotently (root).
#
#   eval "$(scripts/podman-up.sh)"   # optional: run here when CONTAINER_HOST is unset
#   eval "$(scripts/ssh-up.sh)"
#   go test ./vm/
#
# Installs Debian's openssh-server without starting the system's sshd, then
# starts an sshd of its own: bound to 127.0.0.1 only, with its own host key,
# config, pid file and log, key-only login for root, local forwarding only
# (Podman's ssh client forwards to the remote podman.sock; OpenSSH ties
# unix-socket forwarding to AllowTcpForwarding, so that is "local" too, and
# nothing may listen), every command refused. It makes a client key for the tests and a HOME for them
# whose .ssh/known_hosts holds the sshd's host key, written from the key
# itself (never scanned: podvm does not trust on first use).
# Stdout carries only `export ...` lines: CONTAINER_HOST (ssh://), its
# CONTAINER_SSHKEY, HOME, PODVM_SSH_URL (TestSSHHostKey), PODVM_TEST_IMAGE,
# and GOPATH and GOCACHE pinned where they were, so that go keeps its caches
# under the new HOME. Every message goes to stderr.
#
# Env: PODVM_STATE     state directory (default <repo>/.podvm); this script's
#                      files are in its ssh/ directory
#      PODVM_SSH_PORT  the port (default 2222)
#      CONTAINER_HOST  the service to reach: unix:///path (or the ssh:// URL a
#                      previous run printed); unset: scripts/podman-up.sh's
# Stop with scripts/ssh-down.sh.
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
STATE=${PODVM_STATE:-$REPO/.podvm}
DIR=$STATE/ssh
PORT=${PODVM_SSH_PORT:-2222}
SSHD=/usr/sbin/sshd
CONF=$DIR/sshd_config
PIDFILE=$DIR/sshd.pid
LOG=$DIR/sshd.log
HOSTKEY=$DIR/ssh_host_ed25519_key
CLIENTKEY=$DIR/id_ed25519
AUTHKEYS=$DIR/authorized_keys
TESTHOME=$DIR/home

log() { echo "ssh-up: $*" >&2; }
die() { log "$*"; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root: the sshd logs in as root, who can reach the rootful service's socket"
case $PORT in '' | *[!0-9]*) die "PODVM_SSH_PORT is not a port: $PORT" ;; esac

# --- the service to reach -----------------------------------------------------

passthrough=""
case ${CONTAINER_HOST:-} in
unix://*) SOCK=${CONTAINER_HOST#unix://} ;;
ssh://*) # a previous run's URL: the same socket, on this machine
	rest=${CONTAINER_HOST#ssh://}
	SOCK=/${rest#*/}
	;;
'')
	up=$(sh "$REPO/scripts/podman-up.sh") || die "the Podman service did not come up"
	eval "$up"
	SOCK=${CONTAINER_HOST#unix://}
	passthrough=$(echo "$up" | grep -v '^export CONTAINER_HOST=' || true)
	;;
*) die "CONTAINER_HOST=$CONTAINER_HOST: want the unix:// socket of the service to reach" ;;
esac
[ -S "$SOCK" ] || die "no socket at $SOCK: bring the service up first (scripts/podman-up.sh)"

# --- sshd ---------------------------------------------------------------------

if [ ! -x "$SSHD" ]; then
	[ -r /etc/debian_version ] && command -v apt-get >/dev/null || die "no $SSHD: install OpenSSH's server (not started)"
	log "installing openssh-server, with the system's sshd kept from starting"
	export DEBIAN_FRONTEND=noninteractive
	# policy-rc.d exiting 101 forbids invoke-rc.d to start anything; any
	# existing one is put back afterwards, whatever happens.
	POLICY=/usr/sbin/policy-rc.d SAVED=$DIR/policy-rc.d.saved
	mkdir -p "$DIR"
	rm -f "$SAVED"
	[ ! -e "$POLICY" ] || cp -p "$POLICY" "$SAVED"
	restore() { if [ -e "$SAVED" ]; then mv -f "$SAVED" "$POLICY"; else rm -f "$POLICY"; fi; }
	trap restore EXIT
	trap 'exit 1' INT TERM HUP
	printf '#!/bin/sh\nexit 101\n' >"$POLICY"
	chmod 755 "$POLICY"
	if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mmin -1440 2>/dev/null | head -n 1)" ]; then
		apt-get -o DPkg::Lock::Timeout=300 update -q >&2
	fi
	apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends openssh-server >&2 ||
		{ apt-get -o DPkg::Lock::Timeout=300 update -q >&2 && apt-get -o DPkg::Lock::Timeout=300 install -y -q --no-install-recommends openssh-server >&2; }
	restore
	trap - EXIT INT TERM HUP
	[ -x "$SSHD" ] || die "openssh-server installed no $SSHD"
fi

mkdir -p "$DIR" "$TESTHOME/.ssh"
chmod 700 "$DIR" "$TESTHOME" "$TESTHOME/.ssh"
mkdir -p /run/sshd # privilege separation directory, compiled in
chmod 755 /run/sshd

[ -f "$HOSTKEY" ] || ssh-keygen -q -t ed25519 -N '' -C "podvm-test-sshd" -f "$HOSTKEY" </dev/null >&2
[ -f "$CLIENTKEY" ] || ssh-keygen -q -t ed25519 -N '' -C "podvm-test-client" -f "$CLIENTKEY" </dev/null >&2
# Forwarding only; a session runs /bin/false whatever it asks.
echo "restrict,port-forwarding,command=\"/bin/false\" $(cat "$CLIENTKEY.pub")" >"$AUTHKEYS.new"
mv -f "$AUTHKEYS.new" "$AUTHKEYS"
chmod 600 "$AUTHKEYS"
echo "[127.0.0.1]:$PORT $(cut -d' ' -f1,2 "$HOSTKEY.pub")" >"$TESTHOME/.ssh/known_hosts.new"
mv -f "$TESTHOME/.ssh/known_hosts.new" "$TESTHOME/.ssh/known_hosts"

cat >"$CONF.new" <<CONF
# podvm's test sshd (scripts/ssh-up.sh): loopback only, key-only root login,
# forwarding to unix sockets only.
ListenAddress 127.0.0.1:$PORT
HostKey $HOSTKEY
PidFile $PIDFILE
AuthorizedKeysFile $AUTHKEYS
AllowUsers root
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
# Podman's ssh client opens a direct-streamlocal channel to the socket.
# OpenSSH grants that only with AllowTcpForwarding's local permission too
# (session.c, do_authenticated: "no" disables all local forwarding), so
# local it is; nothing may listen, on TCP or on a socket.
AllowStreamLocalForwarding local
AllowTcpForwarding local
PermitListen none
AllowAgentForwarding no
X11Forwarding no
PermitTunnel no
PermitTTY no
PermitUserRC no
GatewayPorts no
# Off: sshd would refuse the key when any directory above $DIR is writable
# by others, the sticky /tmp included (a clone there, as CI may make);
# $DIR itself is root's, mode 0700, and the files in it root's 0600.
StrictModes no
LoginGraceTime 30
# Each podman --url ssh:// run is an SSH connection of its own, and the
# suite runs many at once: the default (10:30:100) drops some.
MaxStartups 200
LogLevel INFO
CONF

# The PID in sshd.pid, if it is still our sshd (and not a reused PID).
sshd_pid() {
	pid=$(cat "$PIDFILE" 2>/dev/null) || return 1
	tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "-f $CONF " || return 1
	echo "$pid"
}

# Does our sshd answer with our host key?
answers() {
	ssh-keyscan -T 2 -t ed25519 -p "$PORT" 127.0.0.1 2>/dev/null | cut -d' ' -f2,3 |
		grep -qxF "$(cut -d' ' -f1,2 "$HOSTKEY.pub")"
}

if pid=$(sshd_pid) && cmp -s "$CONF.new" "$CONF" && answers; then
	rm -f "$CONF.new"
else
	if pid=$(sshd_pid); then
		log "restarting sshd, pid $pid"
		kill "$pid"
		i=0
		while kill -0 "$pid" 2>/dev/null; do
			i=$((i + 1))
			[ $i -le 50 ] || die "sshd $pid did not stop"
			sleep 0.1
		done
	fi
	mv -f "$CONF.new" "$CONF"
	"$SSHD" -t -f "$CONF" >&2 || die "sshd refuses $CONF"
	rm -f "$PIDFILE"
	log "starting sshd on 127.0.0.1:$PORT (log: $LOG)"
	# sshd daemonizes itself and writes the pid file; -E: its log, not syslog.
	"$SSHD" -f "$CONF" -E "$LOG" </dev/null >&2 9>&-
	i=0
	until answers; do
		i=$((i + 1))
		if [ $i -gt 50 ]; then
			tail -n 20 "$LOG" >&2
			die "sshd did not answer on 127.0.0.1:$PORT (log: $LOG)"
		fi
		sleep 0.2
	done
	log "sshd up, pid $(cat "$PIDFILE")"
fi

# --- the environment ----------------------------------------------------------

URL=ssh://root@127.0.0.1:$PORT$SOCK
if command -v go >/dev/null; then
	# Before HOME moves: go's defaults live under it.
	echo "export GOPATH=$(go env GOPATH) GOCACHE=$(go env GOCACHE)"
fi
[ -z "$passthrough" ] || echo "$passthrough"
if [ -z "$passthrough" ] && [ -n "${PODVM_TEST_IMAGE:-}" ]; then
	echo "export PODVM_TEST_IMAGE=$PODVM_TEST_IMAGE"
fi
echo "export CONTAINER_HOST=$URL PODVM_SSH_URL=$URL CONTAINER_SSHKEY=$CLIENTKEY HOME=$TESTHOME"
