#!/bin/sh
# Stops the sshd that scripts/ssh-up.sh started, by the PID in its pid file,
# with the connections it is serving: its children. Other sshd processes (the
# system's) are left alone. Idempotent. The keys, the config and the tests'
# HOME are kept, so a later ssh-up.sh serves the same host key.
set -eu

REPO=$(cd "$(dirname "$0")/.." && pwd -P)
STATE=${PODVM_STATE:-$REPO/.podvm}
DIR=$STATE/ssh
CONF=$DIR/sshd_config
PIDFILE=$DIR/sshd.pid

log() { echo "ssh-down: $*" >&2; }

# Is $1 still our sshd? (Not a reused PID, not a zombie: both have another or
# an empty command line.)
ours() { tr '\0' ' ' 2>/dev/null <"/proc/$1/cmdline" | grep -qF -- "-f $CONF "; }

# The PIDs whose parent is $1: the sshd's connections.
children() {
	for s in /proc/[0-9]*/stat; do
		# Field 4 is the parent; the command, field 2, may hold spaces.
		sed -n 's/^\([0-9]*\) (.*) [A-Za-z] \([0-9]*\) .*/\1 \2/p' "$s" 2>/dev/null
	done | awk -v p="$1" '$2 == p { print $1 }'
}

if pid=$(cat "$PIDFILE" 2>/dev/null) && ours "$pid"; then
	log "stopping sshd, pid $pid"
	conns=$(children "$pid")
	kill "$pid"
	# shellcheck disable=SC2086 # a list of PIDs
	[ -z "$conns" ] || kill $conns 2>/dev/null || true
	i=0
	while ours "$pid"; do # not our child: poll rather than wait
		i=$((i + 1))
		[ $i -le 50 ] || { kill -9 "$pid" 2>/dev/null || true; break; }
		sleep 0.1
	done
fi
rm -f "$PIDFILE"
