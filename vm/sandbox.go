package vm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

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

// killScript kills every process whose environment holds the marker $1,
// using nothing but shell builtins, so it works when the pids limit is
// reached and nothing can fork. Each exec session is a process group of
// its own, and killing a whole group is atomic against fork (a fork racing
// the signal fails), so a fork bomb dies with its group in one kill; the
// marked processes themselves are killed too, for any that left the group.
// It ends only when a scan finds no marked process left. Group IDs 0 and
// 1 (a leader outside the sandbox's PID namespace, or init) and its own
// are never signalled.
//
// It is POSIX sh, for dash, busybox ash and bash alike: `read -d` and
// `kill --` are not. An environ file is read whole, its NUL separators
// dropped by read, and searched for the marker, whose fixed-length random
// value cannot arise from two entries run together. The script first
// finds [killCheck] in its own environment, so a shell that cannot read
// one fails the kill instead of finding nothing to kill.
const killScript = `m=$1; me=$$
has() {
  l=; while IFS= read -r x || [ -n "$x" ]; do l=$l$x; done 2>/dev/null <"$1"
  case $l in *"$2"*) return 0;; esac; return 1
}
has "/proc/$me/environ" "` + killCheck + `" || { echo "podvm-kill: cannot read process environments" >&2; exit 2; }
each() {
  for f in /proc/[0-9]*/environ; do
    p=${f#/proc/}; p=${p%/environ}
    [ "$p" = "$me" ] && continue
    has "$f" "$m" && $1
  done
}
group() { g=; read -r s 2>/dev/null <"/proc/$p/stat" || return 0; s=${s##*) }; set -- $s; g=$3; }
hit() {
  found=1; group
  [ -n "$g" ] && [ "$g" -gt 1 ] && [ "$g" != "$mine" ] && kill -9 "-$g" 2>/dev/null
  kill -9 "$p" 2>/dev/null
}
p=$me; group; mine=$g
n=0
while [ $n -lt 1000 ]; do
  found=0; each hit
  [ $found = 0 ] && exit 0
  n=$((n+1))
done
echo "podvm-kill: marked processes keep appearing" >&2
exit 1`

// killCheck is in the kill command's environment, for killScript to find.
const killCheck = "PODVM_KILL=1"

// killTimeout bounds the kill of a stopped run, its retries included.
const killTimeout = 10 * time.Second

// retryKill calls once until it succeeds, fails for good, or ctx ends.
// Under a fork bomb the pids limit can refuse the kill's own exec; a slot
// frees up as the bomb's forks fail and its processes exit, so trying
// again works. No /bin/sh in the image, no container or no Podman will
// not get better.
func retryKill(ctx context.Context, once func(context.Context) error) error {
	for {
		err := once(ctx)
		if err == nil || ctx.Err() != nil || permanent(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// killSpec is the exec that kills what spec started, run in the sandbox
// as the same user so that it may read and signal its processes.
func (s execSpec) killSpec() execSpec {
	return execSpec{
		Argv: []string{"/bin/sh", "-c", killScript, "podvm-kill", s.Marker},
		Env:  []string{killCheck},
		User: s.User,
	}
}

func permanent(err error) bool {
	for _, target := range []error{exec.ErrNotFound, exec.ErrPermission, ErrNoSuchContainer, ErrContainerNotRunning, ErrUnavailable, ErrRemoved} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
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

// setID records the container once Create succeeded.
func (s *state) setID(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.id = id
}

// markRemoved makes every later use fail with ErrRemoved.
func (s *state) markRemoved() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removed = true
}

// isRemoved reports whether markRemoved was called.
func (s *state) isRemoved() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.removed
}

// ended reports a run that Remove cut short as such. A run refused
// before it started (an invalid command, or ErrRemoved already) is left
// as it is. A run during which Remove began, and that ended by an error,
// by a signal (the 137 of a process the removal killed) or with podman's
// own failure status 125 (Podman 5's CLI, when the container went
// mid-exec), was ended by Remove; any other exit status stays data.
func (s *state) ended(name string, res *exec.Result, err error) (*exec.Result, error) {
	if !s.isRemoved() || errors.Is(err, exec.ErrInvalidCommand) || errors.Is(err, ErrRemoved) {
		return res, err
	}
	if err == nil && (res == nil || res.ExitCode <= 128 && res.ExitCode != 125) {
		return res, err
	}
	return res, errors.Join(fmt.Errorf("vm: %s: %w while it ran", name, ErrRemoved), err)
}

// ID returns the container ID, "" before Create.
func (s *state) ID() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.id
}
