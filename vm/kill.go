package vm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/capture"
	"github.com/podvm/podvm/internal/driver"
)

// This file is how a Run on the Podman exec path that its timeout, its
// context or a dropped connection stopped is ended inside the sandbox:
// Podman leaves an exec's command running when its client stops
// (podman#19486, #10320), so every process of a Run carries a marker in
// its environment ([markerKey]) and a second exec session runs
// [killScript] to kill them all.

// KillGrace bounds how long past its timeout, or its context's end, a
// stopped Run may take to return: the kill of its processes inside the
// sandbox, retried while a fork bomb holds every slot of the pids limit,
// must finish within it, or Run reports that it did not. Then the
// output the command printed before it was stopped, still on its way,
// is handed to the writers, a second at most (a slow live writer holds
// it), so that the partial Result holds it.
const KillGrace = 5 * time.Second

// killScript kills every process whose environment holds the marker $1
// with shell builtins alone, so it works when the pids limit leaves no
// room to fork. It SIGSTOPs each marked process and its process group (a
// group signal is atomic against fork) scan after scan until none runs:
// a stopped process cannot fork, so even a fork bomb of setsid children
// is caught whole. Then it SIGKILLs them the same way. Groups 0 and 1 and
// its own are never signalled; each phase gives up after 200 scans,
// printing what is left, and exits 1. It is POSIX sh (dash, busybox ash,
// bash; no `read -d`, no `kill --`); an environ file is read whole, its
// NULs dropped by read, and the marker's fixed-length random value cannot
// arise from two entries run together. It first finds [killCheck] in its
// own environment, so a shell that cannot read one fails the kill (exit
// 2) instead of finding nothing to kill.
const killScript = `m=$1; me=$$
has() {
  l=; while IFS= read -r x || [ -n "$x" ]; do l=$l$x; done 2>/dev/null <"$1"
  case $l in *"$2"*) return 0;; esac; return 1
}
has "/proc/$me/environ" "` + killCheck + `" || { echo "podvm-kill: cannot read process environments" >&2; exit 2; }
stat() { st=; g=; read -r s 2>/dev/null <"/proc/$p/stat" || return 1; s=${s##*) }; set -- $s; st=$1; g=$3; }
each() {
  found=; for f in /proc/[0-9]*/environ; do
    p=${f#/proc/}; p=${p%/environ}
    [ "$p" = "$me" ] && continue
    has "$f" "$m" && stat && $1
  done
}
sig() {
  [ -n "$g" ] && [ "$g" -gt 1 ] && [ "$g" != "$mine" ] && kill -$1 "-$g" 2>/dev/null
  kill -$1 "$p" 2>/dev/null
}
stop() { case $st in T|t|Z|X) ;; *) found="$found $p"; sig STOP;; esac; }
hit() { case $st in Z|X) ;; *) found="$found $p"; sig KILL;; esac; }
p=$me; stat; mine=$g
for phase in stop hit; do
  n=0
  while :; do
    each $phase
    [ -z "$found" ] && break
    n=$((n+1))
    [ $n -ge 200 ] && { echo "podvm-kill: processes of the run still there after $n scans:$found" >&2; exit 1; }
  done
done
echo "` + killDone + `"`

// killDone is what killScript prints when it is done: an exit status
// alone could be Podman's report of a session that never ran.
const killDone = "podvm-kill: done"

// killCheck is in the kill command's environment, for killScript to find.
const killCheck = "PODVM_KILL=1"

// errKillBlind: the kill script could not read the environments of
// processes, so it cannot tell the run's from others'.
var errKillBlind = errors.New("the kill script cannot read process environments")

// kill kills, inside container id, every process of the run marked with
// marker, running the kill script as user in a second exec session
// bounded by [KillGrace] (the run's ctx has ended). A failure that may
// pass (the pids limit refusing the exec, processes still appearing) is
// retried within the grace; one that cannot (no /bin/sh, no container,
// no Podman) is not.
func (s *sandbox) kill(ctx context.Context, id, user, marker, name string) error {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), KillGrace)
	defer cancel()
	script := killProcess(user, marker)
	err := s.killOnce(kctx, id, script)
	for err != nil && !permanent(err) && sleepCtx(kctx, 50*time.Millisecond) {
		err = s.killOnce(kctx, id, script)
	}
	switch {
	case err == nil:
		return nil
	case kctx.Err() != nil:
		err = fmt.Errorf("not done within %v: %w", KillGrace, err)
	}
	return fmt.Errorf("vm: %s: killing its processes in the sandbox: %w", name, err)
}

// sleepCtx waits d and reports whether ctx is still live; it returns false
// as soon as ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

// newMarker returns a fresh marker: markerKey=<random>.
func newMarker() string { return markerKey + "=" + randomHex() }

// killProcess is the exec session that kills the run marked with marker.
func killProcess(user, marker string) driver.Process {
	return driver.Process{
		Argv: []string{"/bin/sh", "-c", killScript, "podvm-kill", marker},
		Env:  []string{killCheck},
		User: user,
	}
}

// killMessageBytes caps what is kept of the kill script's stderr: only
// its error message matters.
const killMessageBytes = 64 << 10

// killOnce runs the kill script once.
func (s *sandbox) killOnce(ctx context.Context, id string, script driver.Process) error {
	out, errs := capture.New(len(killDone)+1), capture.New(killMessageBytes)
	script.Stdout, script.Stderr = out, errs
	code, _, err := s.d.Exec(ctx, id, script)
	switch {
	case err != nil:
		return err
	case code == 0 && out.String() == killDone+"\n":
		return nil
	case code == 0:
		return fmt.Errorf("%w: the kill script ended without saying it was done", ErrPodman)
	}
	if code == 2 && strings.Contains(errs.String(), "podvm-kill: cannot read process environments") {
		return fmt.Errorf("%w: %w", ErrPodman, errKillBlind)
	}
	return fmt.Errorf("%w: the kill script exited %d: %s", ErrPodman, code, strings.TrimSpace(errs.String()))
}

// permanent reports a kill failure that trying again will not mend.
func permanent(err error) bool {
	for _, target := range []error{exec.ErrNotFound, exec.ErrPermission, ErrNoSuchContainer, ErrContainerNotRunning, ErrUnavailable, ErrRemoved, errKillBlind} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
