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
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/capture"
	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/marks"
	"github.com/podvm/podvm/internal/targuard"
)

// This file is the exec path: a command as an exec session of the pod's
// Main container. The exec API takes argv alone, so each command runs
// under package marks' ExecScript, which sets its environment and
// working directory and tells its failure to start from its exit, and
// the copies are tar in an exec session (tarScript).
//
// Both scripts end with marks, and the driver trusts nothing without
// them: containerd and the API server drop output still in flight when an
// exec's process exits, and client-go then reports success (a reader at 4
// MiB/s lost 1-2 MiB of 25 MiB, and the exit status, in 8 runs of 8, over
// WebSocket and SPDY alike). See package marks for how they work. Once
// both marks are in, the session is given markGrace to end, then cut: a
// child the command left in the background holds its output pipes, and
// containerd ends the session only when they close.

// Exec runs p in Main of pod id, as the container's user: the exec API
// cannot run a command as another, and p.User is not looked at (the
// sandbox passes its own user, which the pod already runs as). A command
// that could not start is an error matching [exec.ErrNotFound],
// [exec.ErrPermission] or [exec.ErrDirNotFound], with started false. An
// environment variable the script's sh cannot set for the command (a
// name that is not a shell name, one a shell holds read-only, podvm_*) is
// [driver.ErrNotSupported]. A session that ended before the script's
// marks is an error matching [driver.ErrUnavailable] (the connection was
// cut) or [driver.ErrEngine] (the script itself ended early: killed, or
// it could not fork), with started true: the command may run on.
func (d *Driver) Exec(ctx context.Context, id string, p driver.Process) (int, bool, error) {
	if len(p.Argv) == 0 {
		return 0, false, fmt.Errorf("%w: kube: exec: no command", exec.ErrInvalidCommand)
	}
	if err := marks.CheckEnv("kube", p.Env); err != nil {
		return 0, false, err
	}
	argv := append([]string{"/bin/sh"}, marks.Args(p.Workdir, p.Env, p.Stdin != nil, p.Argv)...)
	s := marks.New("podvm-exec-", p.Stdin, p.Stdout, p.Stderr)
	defer s.Stop()
	ex, err := d.executor(id, "exec", &corev1.PodExecOptions{Container: Main, Command: argv, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		return 0, false, err
	}
	err = streamMarked(ctx, s, ex, p.Stop)
	code, why, complete := s.Result()
	switch {
	case s.Stopped():
		return 0, true, fmt.Errorf("vm: kube: exec in %s: %w", id, ctx.Err())
	case why != "":
		return 0, false, marks.StartError("kube", p.Argv[0], p.Workdir, why)
	case complete && s.Err() != nil:
		return code, true, fmt.Errorf("vm: kube: exec in %s: writing its output: %w", id, s.Err())
	case complete:
		return code, true, nil
	case ctx.Err() != nil:
		return 0, true, fmt.Errorf("vm: kube: exec in %s: %w", id, ctx.Err())
	}
	return 0, !refused(err), cut("exec in", id, err)
}

// refused reports an error of an exec the API server or the kubelet
// refused before it ran anything.
func refused(err error) bool {
	var status apierrors.APIStatus
	return errors.As(err, &status) || httpstream.IsUpgradeFailure(err)
}

// markGrace is how long a session whose marks are in may take to end
// before it is cut: the script ends at once, but containerd waits for
// the output pipes to close, which a child the command left in the
// background may hold. A variable for the tests.
var markGrace = 2 * time.Second

// streamMarked runs session s to its end, or to markGrace after both marks.
// When ctx ends before the marks, it cuts the session at once, unless
// stop is set: then it calls stop, which kills the command, and lets the
// session drain to its marks, stopDrain at most, so that what the
// command printed before it was stopped, still on its way, arrives
// (stopped then reports it).
func streamMarked(ctx context.Context, s *marks.Session, ex remotecommand.Executor, stop func()) error {
	parent, ended := ctx, (<-chan struct{})(nil)
	if stop != nil {
		parent, ended = context.WithoutCancel(ctx), ctx.Done()
	}
	sctx, cancel := context.WithCancel(parent)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: s.Stdin(), Stdout: s.Stdout(), Stderr: s.Stderr()})
	}()
	both := s.Both()
	var grace <-chan time.Time
	for {
		select {
		case err := <-done:
			s.Stop()
			return err
		case <-both:
			both, ended = nil, nil
			grace = time.After(markGrace)
		case <-ended:
			ended = nil
			select {
			case <-both:
				continue // the marks were in first: not stopped
			default:
			}
			s.SetStopped()
			stop()
			grace = time.After(stopDrain)
		case <-grace:
			cancel() // everything is in, or the drain took too long
			s.Stop()
			return nil
		}
	}
}

// stopDrain bounds how long a session may take to bring its marks
// once its command was stopped. A variable for the tests.
var stopDrain = time.Second

// cut is the error of a session that ended, with err, before its marks.
// The script's session ends with cat's status, 0, once it has written
// them: another status is the script's own end (killed, or a failed
// fork).
func cut(what, id string, err error) error {
	var ce utilexec.CodeExitError
	switch {
	case err == nil:
		return fmt.Errorf("%w: kube: %s %s: the session ended without the script's end marks: output or the exit status may be lost", driver.ErrUnavailable, what, id)
	case errors.As(err, &ce):
		return fmt.Errorf("%w: kube: %s %s: the script ended (status %d) before the command's end: killed, or it could not fork", driver.ErrEngine, what, id, ce.Code)
	}
	return classify(what, id, err)
}

// tarScript is the copies' exec: `sh -c tarScript podvm-tar in DIR`
// extracts stdin into DIR; `... out PATH` archives PATH, named after its
// base name, following PATH itself when it is a symlink (a link to a
// directory is archived from inside, as "./…", which [renameDot] names
// after PATH). tar gets the base name after "--", so a name that begins
// with "-" is never one of its options (busybox and GNU tar alike). A
// PATH that is a device, a fifo or a socket is an empty archive, as
// Podman's copies leave them out. DIR
// and PATH come as printf octal escapes (octal): any
// byte reaches the script, where the exec API's argv, carried by gRPC
// strings, takes UTF-8 only. MARK is the first line of stdin, and the
// script ends with the marks, as execScript does: its stderr's word is
// "exited STATUS", tar's, or "missing" when DIR or PATH is not there.
// Extraction reads what follows the archive until the driver ends its
// stdin, so that the session ends (containerd waits for the stdin it
// was given to be taken).
const tarScript = marks.Prelude + `op=$1 p=$(printf "$2"; echo x); p=${p%x}
case $op in
in) cd "$p" 2>/dev/null || podvm_end missing
   podvm_i=0
   while IFS= read -r l && [ -n "$l" ]; do
     q=${l#??}; podvm_i=$((podvm_i+1))
     case $l in [NR]*) q=$(printf "$q"; echo x); q=${q%x} ;; esac
     [ -L "./$q" ] || continue
     case $l in [nN]*) podvm_end "unsafe $podvm_i" ;; *) rm -f "./$q" || podvm_end "unsafe $podvm_i" ;; esac
   done
   tar -x -f - ;;
out) [ -e "$p" ] || [ -L "$p" ] || podvm_end missing
   if [ -b "$p" ] || [ -c "$p" ] || [ -p "$p" ] || [ -S "$p" ]; then head -c 1024 /dev/zero # an empty archive
   elif [ "$p" = / ]; then cd / && tar -c -f - .
   elif [ -L "$p" ] && [ -d "$p" ]; then cd "$p" && tar -c -f - .
   else d=${p%/*}; cd "${d:-/}" || podvm_end missing
     if [ -L "$p" ]; then tar -c -h -f - -- "${p##*/}"; else tar -c -f - -- "${p##*/}"; fi
   fi ;;
esac
podvm_end "exited $?"`

// octal spells s as printf's octal escapes.
func octal(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, "\\%03o", s[i])
	}
	return b.String()
}

// tarIn is CopyIn after start: tar in an exec session. The archive is
// spooled to a temporary file of the host first, removed when tarIn
// returns, so that the script can be told, before the archive, which of
// the paths it is about to extract through must not be symlinks
// ([planted]).
func (d *Driver) tarIn(ctx context.Context, id, dir string, r io.Reader) error {
	f, err := os.CreateTemp("", "podvm-kube-in-")
	if err != nil {
		return fmt.Errorf("vm: kube: copy in %s: spooling the archive: %w", dir, err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	checks, err := planted(io.TeeReader(r, f))
	if err == nil {
		_, err = io.Copy(f, r) // what follows the archive's end
	}
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		return fmt.Errorf("vm: kube: copy in %s: %w", dir, err)
	}
	err = d.tar(ctx, id, "in", dir, io.MultiReader(strings.NewReader(checkLines(checks)), f), nil)
	if i, ok := unsafeAt(err); ok && i > 0 && i <= len(checks) {
		return fmt.Errorf("%w %q: a symlink the sandbox planted under %s, which the copy would follow", targuard.ErrUnsafe, checks[i-1].path, dir)
	}
	return err
}

// check is a path the tar script looks at before it extracts: kind "n"
// when it must not be a symlink (an entry would be extracted through
// it), "r" when a symlink there is removed (a directory entry takes its
// place, as the agent's copies do).
type check struct{ kind, path string }

// checkLines are the lines that tell the tar script the checks: the
// kind and the path, a line each, the path as it is, or, when it holds
// a newline, in printf's octal escapes and the kind in capitals; then an
// empty line.
func checkLines(checks []check) string {
	var b strings.Builder
	for _, c := range checks {
		kind, p := c.kind, c.path
		if strings.Contains(p, "\n") {
			kind, p = strings.ToUpper(kind), octal(p)
		}
		b.WriteString(kind + " " + p + "\n")
	}
	b.WriteString("\n")
	return b.String()
}

// planted reads the tar stream r and returns the checks that keep its
// extraction beneath its directory, in the archive's order: each
// directory entry replaces a symlink in its place, and every parent of
// an entry (and of a hard link's target) that no directory entry before
// it dirsMade must not be a symlink. A link planted between the checks and the extraction is
// still followed (within the sandbox: tar runs there).
func planted(r io.Reader) ([]check, error) {
	tr := tar.NewReader(r)
	dirsMade := map[string]bool{".": true}
	seen := map[string]bool{}
	var checks []check
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return checks, nil
		}
		if err != nil {
			return nil, err
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "/"))
		names := []string{name}
		if h.Typeflag == tar.TypeLink { // its target is reached by its path too
			names = append(names, path.Clean(strings.TrimPrefix(h.Linkname, "/")))
		}
		for _, n := range names {
			for i := range len(n) {
				if q := n[:i]; n[i] == '/' && !dirsMade[q] && !seen[q] {
					seen[q] = true
					checks = append(checks, check{"n", q})
				}
			}
		}
		if h.Typeflag == tar.TypeDir && !dirsMade[name] {
			dirsMade[name] = true
			checks = append(checks, check{"r", name})
		}
	}
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
		if err == nil {
			// What follows the archive's end (GNU tar pads it to 10
			// KiB) is read too, or the marks behind it never come.
			_, err = io.Copy(io.Discard, pr)
		}
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
	stderr := capture.New(4 << 10)
	s := marks.New("podvm-tar-", r, w, stderr)
	defer s.Stop()
	ex, err := d.executor(id, "exec", &corev1.PodExecOptions{Container: Main, Command: []string{"/bin/sh", "-c", tarScript, "podvm-tar", op, octal(p)},
		Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		return err
	}
	err = streamMarked(ctx, s, ex, nil)
	code, why, complete := s.Result()
	switch {
	case why == "missing":
		return fmt.Errorf("vm: kube: copy %s %s: %w", op, p, fs.ErrNotExist)
	case strings.HasPrefix(why, "unsafe "):
		return &unsafeError{why}
	case complete && code != 0:
		return fmt.Errorf("%w: kube: copy %s %s: tar exited %d: %s", driver.ErrEngine, op, p, code, strings.TrimSpace(stderr.String()))
	case complete && op == "in" && strings.Contains(stderr.String(), "tar: can't "):
		// busybox tar says what it could not make ("can't make dir x:
		// Read-only file system") and goes on, to exit 0.
		return fmt.Errorf("%w: kube: copy %s %s: %s", driver.ErrEngine, op, p, strings.TrimSpace(stderr.String()))
	case complete && s.Err() != nil:
		return fmt.Errorf("vm: kube: copy %s %s: %w", op, p, s.Err())
	case complete:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("vm: kube: copy %s %s: %w", op, p, ctx.Err())
	}
	return cut("copy "+op, p, err)
}

// unsafeError is the tar script's refusal of its check number N, said
// "unsafe N", which [Driver.tarIn] names.
type unsafeError struct{ word string }

func (e *unsafeError) Error() string { return "vm: kube: copy in: " + e.word }

// unsafeAt returns the number of the check the tar script refused.
func unsafeAt(err error) (int, bool) {
	var u *unsafeError
	if !errors.As(err, &u) {
		return 0, false
	}
	i, err := strconv.Atoi(strings.TrimPrefix(u.word, "unsafe "))
	return i, err == nil
}

func randomHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
