package kube

import (
	"archive/tar"
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
//	sh -c execScript podvm-exec MARK DIR N IN KEY=VALUE... ARGV...
//
// It changes to DIR when it is not empty, takes out the variables sh
// itself exports (SHLVL, PWD, OLDPWD), exports the N entries (the
// container's environment is the base), finds ARGV[0] as execve would
// (a path as it is, else in $PATH), and execs it. When it cannot, it
// prints MARK and a word (env, dir, notfound, perm) on stderr, alone, and
// exits: MARK is random per run, so no command's own output is taken for
// it. When IN is not empty the command has a stdin: once the command has
// exited (or could not start) the script prints MARK and "exited" (or
// why), and reads its stdin to the end, which the driver then gives it. containerd ends an exec session
// only when the stdin it was given has been taken, so a command that
// leaves its stdin unread would otherwise hang it, and a stdin that never
// ends would hold it forever. It is POSIX sh: busybox's ash, dash, bash.
const execScript = `m=$1 d=$2 n=$3 i=$4; shift 4
no() { printf '%s %s\n' "$m" "$1" >&2; [ -n "$i" ] && cat >/dev/null 2>&1; exit 127; }
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
[ -z "$i" ] && exec "$@"
( exec "$@" ); s=$?
printf '%s exited\n' "$m" >&2; cat >/dev/null 2>&1; exit $s`

// Exec runs p in Main of pod id, as the container's user: the exec API
// cannot run a command as another, and p.User is not looked at (the
// sandbox passes its own user, which the pod already runs as). A command that could not
// start is an error matching [exec.ErrNotFound], [exec.ErrPermission] or
// [exec.ErrDirNotFound], with started false.
func (d *Driver) Exec(ctx context.Context, id string, p driver.Process) (int, bool, error) {
	if len(p.Argv) == 0 {
		return 0, false, fmt.Errorf("%w: kube: exec: no command", exec.ErrInvalidCommand)
	}
	mark := "podvm-exec-" + randomHex() + ":"
	in := ""
	if p.Stdin != nil {
		in = "in"
	}
	argv := append([]string{"/bin/sh", "-c", execScript, "podvm-exec", mark, p.Workdir, strconv.Itoa(len(p.Env)), in}, p.Env...)
	argv = append(argv, p.Argv...)
	var stdin *io.PipeWriter
	f := &markFilter{mark: mark, w: orDiscard(p.Stderr), line: func(string) {
		if stdin != nil {
			stdin.Close() // the command has exited, or never ran: the rest of its stdin is not wanted
		}
	}}
	stdout, stderr := &gated{w: orDiscard(p.Stdout)}, &gated{w: f}
	so := remotecommand.StreamOptions{Stdout: stdout, Stderr: stderr}
	if p.Stdin != nil {
		var r *io.PipeReader
		r, stdin = io.Pipe()
		so.Stdin = r
		go func() {
			_, err := io.Copy(stdin, p.Stdin)
			stdin.CloseWithError(err)
		}()
		defer stdin.Close()
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
	f.flush()
	if why := f.failed(); why != "" {
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

// markFilter passes stderr to w but for execScript's lines, MARK and a
// word: it takes them out, whatever the writes' boundaries, calls line
// with the word of each, and keeps the word of one that says why the
// command could not start (failed: any word but "exited"). It holds back
// only what may be the start of such a line, until it knows.
type markFilter struct {
	mark string
	w    io.Writer
	line func(word string)
	held []byte
	why  string
	err  error
}

func (f *markFilter) Write(p []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	data := append(f.held, p...)
	f.held = nil
	for len(data) > 0 {
		i := strings.Index(string(data), f.mark)
		if i < 0 {
			// Hold a tail that may be the mark's beginning.
			k := min(len(data), len(f.mark)-1)
			for ; k > 0 && !strings.HasPrefix(f.mark, string(data[len(data)-k:])); k-- {
			}
			f.pass(data[:len(data)-k])
			f.held = append([]byte(nil), data[len(data)-k:]...)
			break
		}
		f.pass(data[:i])
		line := data[i+len(f.mark):]
		j := strings.IndexByte(string(line), '\n')
		if j < 0 {
			if len(line) > 64 { // no word of execScript's is that long
				f.pass(data[i : i+len(f.mark)])
				data = line
				continue
			}
			f.held = append([]byte(nil), data[i:]...)
			break
		}
		word := strings.TrimPrefix(string(line[:j]), " ")
		if word != "exited" {
			f.why = word
		}
		if f.line != nil {
			f.line(word)
		}
		data = line[j+1:]
	}
	return len(p), f.err
}

func (f *markFilter) pass(b []byte) {
	if len(b) > 0 && f.err == nil {
		_, f.err = f.w.Write(b)
	}
}

// flush passes on what is held: the stream has ended.
func (f *markFilter) flush() {
	f.pass(f.held)
	f.held = nil
}

// failed returns the word of execScript's line saying that the command
// could not start, "" when there is none.
func (f *markFilter) failed() string { return f.why }

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
// its base name, following PATH itself when it is a symlink (a link to a
// directory is archived from inside, as "./…", which [renameDot] names
// after PATH). DIR and PATH come as printf octal escapes (octal): any
// byte reaches the script, where the exec API's argv, carried by gRPC
// strings, takes UTF-8 only. One that is not there is MARK and
// "missing" on stderr. Extraction reads stdin to its end, tar or not, so
// the exec session ends (containerd waits for the stdin it was given to
// be taken); the driver ends that stdin once MARK says the copy failed.
const tarScript = `m=$1 op=$2 p=$(printf "$3"; echo x); p=${p%x}
no() { printf '%s %s\n' "$m" "$1" >&2; [ "$op" = in ] && cat >/dev/null 2>&1; exit 2; }
case $op in
in) cd "$p" 2>/dev/null || no missing; tar -x -f -; s=$?; cat >/dev/null; exit $s ;;
out) [ -e "$p" ] || [ -L "$p" ] || no missing
   [ "$p" = / ] && { cd / && exec tar -c -f - .; }
   [ -L "$p" ] && [ -d "$p" ] && { cd "$p" && exec tar -c -f - .; }
   d=${p%/*}; cd "${d:-/}" || no missing
   [ -L "$p" ] && exec tar -c -h -f - "${p##*/}"
   exec tar -c -f - "${p##*/}" ;;
esac`

// octal spells s as printf's octal escapes.
func octal(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "\\%03o", s[i])
	}
	return b.String()
}

// tarIn is CopyIn after start: tar in an exec session.
func (d *Driver) tarIn(ctx context.Context, id, dir string, r io.Reader) error {
	return d.tar(ctx, id, "in", dir, r, nil)
}

// CopyOut writes path of pod id to w as a tar stream, by tar in an exec
// session: path is an argument, never a pattern.
func (d *Driver) CopyOut(ctx context.Context, id, p string, w io.Writer) error {
	p = path.Clean(p)
	if p == "/" {
		return d.tar(ctx, id, "out", p, nil, w)
	}
	pr, pw := io.Pipe()
	renamed := make(chan error, 1)
	go func() {
		err := renameDot(pr, w, path.Base(p))
		pr.CloseWithError(err)
		renamed <- err
	}()
	err := d.tar(ctx, id, "out", p, nil, pw)
	pw.Close()
	if rerr := <-renamed; rerr != nil && err == nil {
		err = fmt.Errorf("vm: kube: copy out %s: %w", p, rerr)
	}
	return err
}

// renameDot copies the tar stream r to w, naming base what is named "."
// in it ("./x" becomes "base/x").
func renameDot(r io.Reader, w io.Writer, base string) error {
	tr, tw := tar.NewReader(r), tar.NewWriter(w)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if h.Name == "." || h.Name == "./" {
			h.Name = base + "/"
		} else if rest, ok := strings.CutPrefix(h.Name, "./"); ok {
			h.Name = base + "/" + rest
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	return tw.Close()
}

func (d *Driver) tar(ctx context.Context, id, op, p string, r io.Reader, w io.Writer) error {
	mark := "podvm-tar-" + randomHex() + ":"
	stderr := capture.New(4 << 10)
	var stdin *io.PipeWriter
	f := &markFilter{mark: mark, w: stderr, line: func(string) {
		if stdin != nil {
			stdin.Close() // the copy failed: the rest of the archive is not wanted
		}
	}}
	out := &gated{w: orDiscard(w)}
	so := remotecommand.StreamOptions{Stdout: out, Stderr: &gated{w: f}}
	if r != nil {
		var pr *io.PipeReader
		pr, stdin = io.Pipe()
		so.Stdin = pr
		go func() {
			_, err := io.Copy(stdin, r)
			stdin.CloseWithError(err)
		}()
		defer stdin.Close()
	}
	ex, err := d.executor(id, "exec", &corev1.PodExecOptions{Container: Main, Command: []string{"/bin/sh", "-c", tarScript, "podvm-tar", mark, op, octal(p)},
		Stdin: r != nil, Stdout: true, Stderr: true})
	if err != nil {
		return err
	}
	err = ex.StreamWithContext(ctx, so)
	out.shut()
	f.flush()
	msg := strings.TrimSpace(stderr.String())
	var ce utilexec.CodeExitError
	switch {
	case f.failed() == "missing":
		return fmt.Errorf("vm: kube: copy %s %s: %w", op, p, fs.ErrNotExist)
	case err == nil:
		return nil
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
