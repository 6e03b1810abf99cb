package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/capture"
	"github.com/podvm/podvm/internal/driver"
)

// This file is the exec path: a command as an exec session of the pod's
// Main container. The exec API takes argv alone, so each command runs
// under execScript, which sets its environment and working directory and
// tells its failure to start from its exit, and the copies are tar in an
// exec session.

// execScript sets up a command as Podman's exec would and execs it:
//
//	sh -c execScript podvm-exec MARK DIR N KEY=VALUE... ARGV...
//
// It changes to DIR when it is not empty, takes out the variables sh
// itself exports (SHLVL, PWD, OLDPWD), exports the N entries (the
// container's environment is the base), finds ARGV[0] as execve would
// (a path as it is, else in $PATH), and execs it. When it cannot, it
// prints MARK and a word (env, dir, notfound, perm) on stderr, alone, and
// exits: MARK is random per run, so no command's own output is taken for
// it. It is POSIX sh: busybox's ash, dash, bash.
const execScript = `m=$1 d=$2 n=$3; shift 3
no() { printf '%s %s\n' "$m" "$1" >&2; exit 127; }
if [ -n "$d" ]; then cd "$d" 2>/dev/null || no dir; fi
unset SHLVL PWD OLDPWD
while [ "$n" -gt 0 ]; do export "$1" 2>/dev/null || no env; shift; n=$((n-1)); done
case $1 in
*/*) f=$1 ;;
*) f=; set -f; o=$IFS; IFS=:
   for x in $PATH; do [ -f "${x:-.}/$1" ] && [ -x "${x:-.}/$1" ] && { f=${x:-.}/$1; break; }; done
   IFS=$o; set +f
   [ -n "$f" ] || no notfound ;;
esac
[ -e "$f" ] || no notfound
[ -d "$f" ] || [ ! -x "$f" ] && no perm
exec "$@"`

// Exec runs p in Main of pod id, as the container's user: the exec API
// cannot run a command as another, so a p.User is refused unless it is
// the container's (the sandbox passes its own). A command that could not
// start is an error matching [exec.ErrNotFound], [exec.ErrPermission] or
// [exec.ErrDirNotFound], with started false.
func (d *Driver) Exec(ctx context.Context, id string, p driver.Process) (int, bool, error) {
	if len(p.Argv) == 0 {
		return 0, false, fmt.Errorf("%w: kube: exec: no command", exec.ErrInvalidCommand)
	}
	mark := "podvm-exec-" + randomHex() + ":"
	argv := append([]string{"/bin/sh", "-c", execScript, "podvm-exec", mark, p.Workdir, strconv.Itoa(len(p.Env))}, p.Env...)
	argv = append(argv, p.Argv...)
	stdout := &gated{w: orDiscard(p.Stdout)}
	stderr := &gated{w: &markFilter{mark: mark, w: orDiscard(p.Stderr)}}
	so := remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr}
	if p.Stdin != nil {
		so.Stdin = p.Stdin
	}
	ex, err := d.executor(id, "exec", &corev1.PodExecOptions{Container: Main, Command: argv, Stdin: p.Stdin != nil, Stdout: true, Stderr: true})
	if err != nil {
		return 0, false, err
	}
	err = ex.StreamWithContext(ctx, so)
	// Writes that arrive after the session returned are dropped: the
	// caller reads its writers now.
	stdout.shut()
	stderr.shut()
	f := stderr.w.(*markFilter)
	f.flush()
	if why := f.matched(); why != "" {
		return 0, false, startError(p.Argv[0], p.Workdir, why)
	}
	var ce utilexec.CodeExitError
	switch {
	case err == nil:
		return 0, true, nil
	case errors.As(err, &ce):
		return ce.Code, true, nil
	case ctx.Err() != nil:
		return 0, true, fmt.Errorf("vm: kube: exec in %s: %w", id, ctx.Err())
	}
	started := stdout.n > 0 || stderr.n > 0
	return 0, started, classify("exec in", id, err)
}

// startError is the error of a command execScript could not start.
func startError(name, dir, why string) error {
	switch why {
	case "notfound":
		return fmt.Errorf("%w: kube: %s", exec.ErrNotFound, name)
	case "perm":
		return fmt.Errorf("%w: kube: %s", exec.ErrPermission, name)
	case "dir":
		return fmt.Errorf("%w: kube: %s", exec.ErrDirNotFound, dir)
	case "env":
		return fmt.Errorf("%w: kube: an environment variable whose name sh cannot export: the exec path sets the environment through sh", driver.ErrNotSupported)
	}
	return fmt.Errorf("%w: kube: %s could not start: %s", driver.ErrPodman, name, why)
}

// markFilter passes stderr to w unless it starts with mark: then it holds
// it, for matched. It decides once it has len(mark) bytes, or at flush.
type markFilter struct {
	mark string
	w    io.Writer
	head []byte // held while undecided, and the whole line when marked
	done bool   // decided, and not marked
	err  error
}

func (f *markFilter) Write(p []byte) (int, error) {
	if f.done {
		if f.err != nil {
			return 0, f.err
		}
		return f.w.Write(p)
	}
	f.head = append(f.head, p...)
	if len(f.head) < len(f.mark) {
		if !strings.HasPrefix(f.mark, string(f.head)) {
			f.flush()
		}
		return len(p), f.err
	}
	if !strings.HasPrefix(string(f.head), f.mark) {
		f.flush()
	}
	if len(f.head) > 256 {
		f.flush() // no line of execScript's is that long
	}
	return len(p), f.err
}

// flush passes on what is held unless it is execScript's line.
func (f *markFilter) flush() {
	if f.done || f.matched() != "" {
		return
	}
	f.done = true
	if len(f.head) > 0 {
		_, f.err = f.w.Write(f.head)
	}
	f.head = nil
}

// matched returns the word of execScript's line, "" when there is none.
func (f *markFilter) matched() string {
	line, ok := strings.CutPrefix(string(f.head), f.mark+" ")
	if f.done || !ok || !strings.HasSuffix(line, "\n") || strings.Count(line, "\n") != 1 {
		return ""
	}
	return strings.TrimSuffix(line, "\n")
}

// gated drops writes once shut, and counts the bytes it passed.
type gated struct {
	mu     sync.Mutex
	w      io.Writer
	n      int64
	closed bool
}

func (g *gated) Write(p []byte) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return len(p), nil
	}
	g.n += int64(len(p))
	return g.w.Write(p)
}

func (g *gated) shut() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// tarScript is the copies' exec: `sh -c tarScript podvm-tar MARK in DIR`
// extracts stdin into DIR; `... MARK out PATH` archives PATH, named after
// its base name. A DIR or PATH that is not there is MARK and "missing" on
// stderr.
const tarScript = `m=$1 op=$2 p=$3
no() { printf '%s %s\n' "$m" "$1" >&2; exit 2; }
case $op in
in) cd "$p" 2>/dev/null || no missing; exec tar -x -f - ;;
out) [ -e "$p" ] || [ -L "$p" ] || no missing
   case $p in /) cd / && exec tar -c -f - . ;; esac
   cd "$(dirname "$p")" && exec tar -c -f - "$(basename "$p")" ;;
esac`

// tarIn is CopyIn after start: tar in an exec session.
func (d *Driver) tarIn(ctx context.Context, id, dir string, r io.Reader) error {
	return d.tar(ctx, id, "in", dir, r, nil)
}

// CopyOut writes path of pod id to w as a tar stream, by tar in an exec
// session: path is an argument, never a pattern. A symlink at path is
// archived as the link.
func (d *Driver) CopyOut(ctx context.Context, id, p string, w io.Writer) error {
	return d.tar(ctx, id, "out", path.Clean(p), nil, w)
}

func (d *Driver) tar(ctx context.Context, id, op, p string, r io.Reader, w io.Writer) error {
	mark := "podvm-tar-" + randomHex() + ":"
	stderr := capture.New(4 << 10)
	out := &gated{w: orDiscard(w)}
	so := remotecommand.StreamOptions{Stdin: r, Stdout: out, Stderr: stderr}
	ex, err := d.executor(id, "exec", &corev1.PodExecOptions{Container: Main, Command: []string{"/bin/sh", "-c", tarScript, "podvm-tar", mark, op, p},
		Stdin: r != nil, Stdout: true, Stderr: true})
	if err != nil {
		return err
	}
	err = ex.StreamWithContext(ctx, so)
	out.shut()
	msg := strings.TrimSpace(stderr.String())
	var ce utilexec.CodeExitError
	switch {
	case err == nil:
		return nil
	case strings.HasPrefix(msg, mark+" missing"):
		return fmt.Errorf("vm: kube: copy %s %s: %w", op, p, fs.ErrNotExist)
	case errors.As(err, &ce):
		return fmt.Errorf("%w: kube: copy %s %s: tar exited %d: %s", driver.ErrPodman, op, p, ce.Code, msg)
	case ctx.Err() != nil:
		return fmt.Errorf("vm: kube: copy %s %s: %w", op, p, ctx.Err())
	}
	return classify("copy "+op, p, err)
}

func randomHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
