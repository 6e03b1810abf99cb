package vm

import (
	"crypto/rand"
	"encoding/hex"
	"sync"

	"github.com/podvm/podvm/exec"
)

// markerKey is the environment variable that tags every process of one
// Run, so that a timeout can find and kill the command's whole tree inside
// the sandbox: children inherit it, on every Podman version, with no exec
// force-remove needed.
const markerKey = "PODVM_RUN"

// execSpec is what both backends hand to Podman for one Run.
type execSpec struct {
	Argv    []string
	Env     []string // the command's env plus the marker; the config's is the container's
	Workdir string
	User    string
	Marker  string // markerKey=<random>
}

func newExecSpec(cfg Config, cmd exec.Command) execSpec {
	var b [12]byte
	_, _ = rand.Read(b[:])
	marker := markerKey + "=" + hex.EncodeToString(b[:])
	dir := cmd.Dir
	if dir == "" {
		dir = cfg.Workdir
	}
	return execSpec{
		Argv:    append([]string{cmd.Name}, cmd.Args...),
		Env:     append(exec.MergeEnv(nil, cmd.Env), marker),
		Workdir: dir,
		User:    cfg.User,
		Marker:  marker,
	}
}

// killScript kills, as often as needed, every process whose environment
// holds the marker $1. It loops because a fork bomb keeps spawning while
// it scans; grep exits 1 only when it found none and nothing raced it. It
// uses the shell's own kill, so it still works when the pids limit is
// reached and forks fail.
const killScript = `m=$1; n=0
while [ $n -lt 200 ]; do
  p=$(grep -lsxzF "$m" /proc/[0-9]*/environ); rc=$?
  [ $rc -eq 1 ] && exit 0
  for f in $p; do f=${f#/proc/}; kill -9 ${f%/environ} 2>/dev/null; done
  n=$((n+1))
done
exit 1`

// killCommand is the command that kills what spec started, run in the
// sandbox as the same user so that it may read and signal its processes.
func (s execSpec) killCommand() exec.Command {
	return exec.Command{Name: "/bin/sh", Args: []string{"-c", killScript, "podvm-kill", s.Marker}}
}

// state is the lifecycle both backends share: not created, created,
// removed. It is safe for concurrent use.
type state struct {
	mu      sync.RWMutex
	id      string
	removed bool
}

// container returns the container ID, or ErrNotCreated / ErrRemoved.
func (s *state) container() (string, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	switch {
	case s.removed:
		return "", ErrRemoved
	case s.id == "":
		return "", ErrNotCreated
	}
	return s.id, nil
}

// ID returns the container ID, "" before Create.
func (s *state) ID() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.id
}
