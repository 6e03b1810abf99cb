package kube

import (
	"archive/tar"
	"bytes"
	"cmp"
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
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/capture"
	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/targuard"
)

// This file is the exec path: a command as an exec session of the pod's
// Main container. The exec API takes argv alone, so each command runs
// under execScript, which sets its environment and working directory and
// tells its failure to start from its exit, and the copies are tar in an
// exec session (tarScript).
//
// Both scripts end with marks, and the driver trusts nothing without
// them: containerd and the API server drop output still in flight when an
// exec's process exits, and client-go then reports success (a reader at 4
// MiB/s lost 1-2 MiB of 25 MiB, and the exit status, in 8 runs of 8, over
// WebSocket and SPDY alike). So once the command has exited the script
// writes MARK and "end" on stdout, after everything of the command's,
// and MARK and "exited STATUS" on stderr, and then holds the session open
// by reading its own stdin (cat, exec'd: the session's own status is 0,
// the command's travels in the mark), which the driver ends once it has
// read both marks: everything before them has arrived. What holds the
// output is the output pipes, not the process: containerd drops what is
// in flight once every writer of the session's stdout and stderr has
// closed them, so cat keeps them open (as fds 3 and 4) until it ends. A session that
// ends without them is an error, never a short result. MARK is random per
// session and is the first line of the session's stdin, read by the
// script before anything else (a shell reads a pipe a byte at a time, so
// the rest is the command's): it appears in no argv a process of the pod
// could read. It guards against chance matches and argv readers; a
// process of the sandbox running as the run's user can still meddle with
// the run's streams, as it can with any of its processes. The marks are
// written again until they go through: a command may leave the pipes
// they share non-blocking (O_NONBLOCK) and full. The hold needs the
// session's stdin: for a command that reads its own, the hold ends when
// that stdin does, and a cut after it is detected (an error), not
// prevented. Once both marks are in, the session is given markGrace to
// end, then cut: a child the command left in the background holds its
// output pipes, and containerd ends the session only when they close.

// marksPrelude begins both scripts: it reads MARK, the first line of the
// session's stdin, and defines podvm_say, which writes a mark line and
// writes it again until it goes through, and podvm_end, which writes
// both marks and then holds the session (cat, with the output pipes kept
// open as fds 3 and 4) until the driver ends its stdin.
const marksPrelude = `read -r podvm_m || exit 125
podvm_say() { until printf '%s %s\n' "$podvm_m" "$1" 2>/dev/null; do sleep 0.05 2>/dev/null || :; done; }
podvm_end() { podvm_say end; podvm_say "$1" >&2; exec cat 3>&1 4>&2 >/dev/null 2>&1; }
`

// execScript sets up a command as Podman's exec would and runs it:
//
//	sh -c execScript podvm-exec DIR N IN KEY=VALUE... ARGV...
//
// with MARK on the first line of its stdin. It changes to DIR when it is
// not empty and runs the command in a subshell, its stdin the session's
// when IN is not empty, else /dev/null: the subshell takes out the
// variables sh itself exports (SHLVL, PWD, OLDPWD), exports the N entries
// (the container's environment is the base), finds ARGV[0] as execve
// would (a path as it is, else in $PATH), and execs it. When it cannot,
// its stderr mark says why (env, dir, notfound, perm). The user's
// variables live in the subshell alone, so they cannot change the
// script's own (whose names, podvm_*, [Driver.Exec] refuses) or its
// PATH. No DIR or ARGV[0] is read as an option by sh, cd or exec: a
// relative DIR is given as ./DIR, and a command
// named "-..." is exec'd by the path found for it, which is then its
// argv[0] (the exec of bash and busybox takes options, dash's no "--").
// While the command runs, the script's own stderr is /dev/null (the
// command has the session's, which fd 3 saved): a shell reports a child
// killed by a signal there ("Killed"), and a failed fork. It is POSIX sh:
// busybox's ash, dash, bash.
const execScript = marksPrelude + `podvm_d=$1 podvm_n=$2 podvm_i=$3; shift 3
podvm_run() (
  podvm_no() { podvm_say "$1" >&3; exit 127; }
  unset SHLVL PWD OLDPWD
  while [ "$podvm_n" -gt 0 ]; do export "$1" || podvm_no env; shift; podvm_n=$((podvm_n-1)); done
  case $1 in
  */*) podvm_f=$1 ;;
  *) podvm_f=; set -f; podvm_o=$IFS; IFS=:
     for podvm_x in $PATH; do [ -f "${podvm_x:-.}/$1" ] && [ -x "${podvm_x:-.}/$1" ] && { podvm_f=${podvm_x:-.}/$1; break; }; done
     IFS=$podvm_o; set +f
     [ -n "$podvm_f" ] || podvm_no notfound ;;
  esac
  case $podvm_f in -*) podvm_f=./$podvm_f ;; esac
  [ -e "$podvm_f" ] || podvm_no notfound
  [ -d "$podvm_f" ] || [ ! -x "$podvm_f" ] && podvm_no perm
  case $1 in -*) shift; set -- "$podvm_f" "$@" ;; esac
  exec "$@" 2>&3 3>&-
)
case $podvm_d in ''|/*) ;; *) podvm_d=./$podvm_d ;; esac
if [ -n "$podvm_d" ]; then cd "$podvm_d" 2>/dev/null || podvm_end dir; fi
exec 3>&2 2>/dev/null
if [ -n "$podvm_i" ]; then podvm_run "$@"; else podvm_run "$@" </dev/null; fi
podvm_s=$?
exec 2>&3 3>&-
podvm_end "exited $podvm_s"`

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
	for _, kv := range p.Env {
		name, _, _ := strings.Cut(kv, "=")
		if why := unsettable(name); why != "" {
			return 0, false, fmt.Errorf("%w: kube: environment variable %q: the exec path sets the environment through sh, where %s", driver.ErrNotSupported, name, why)
		}
	}
	in := ""
	if p.Stdin != nil {
		in = "in"
	}
	argv := append([]string{"/bin/sh", "-c", execScript, "podvm-exec", p.Workdir, strconv.Itoa(len(p.Env)), in}, p.Env...)
	argv = append(argv, p.Argv...)
	s := newMarked("podvm-exec-", p.Stdin, orDiscard(p.Stdout), orDiscard(p.Stderr))
	defer s.stop()
	ex, err := d.executor(id, "exec", &corev1.PodExecOptions{Container: Main, Command: argv, Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		return 0, false, err
	}
	err = s.stream(ctx, ex, p.Stop)
	code, why, complete := s.result()
	switch {
	case s.wasStopped():
		return 0, true, fmt.Errorf("vm: kube: exec in %s: %w", id, ctx.Err())
	case why != "":
		return 0, false, startError(p.Argv[0], p.Workdir, why)
	case complete && s.werr != nil:
		return code, true, fmt.Errorf("vm: kube: exec in %s: writing its output: %w", id, s.werr)
	case complete:
		return code, true, nil
	case ctx.Err() != nil:
		return 0, true, fmt.Errorf("vm: kube: exec in %s: %w", id, ctx.Err())
	}
	return 0, !refused(err), s.cut("exec in", id, err)
}

// unsettable says why execScript cannot export a variable of this name
// for the command, or "" when it can.
func unsettable(name string) string {
	switch {
	case name == "" || name[0] >= '0' && name[0] <= '9' || strings.ContainsFunc(name, func(c rune) bool {
		return !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9')
	}):
		return "it is not a shell variable's name"
	case strings.HasPrefix(name, "podvm_"):
		return "the script's own variables are named podvm_*"
	case readOnly[name]:
		return "a shell holds it read-only (bash: setting it ends the script)"
	}
	return ""
}

// readOnly are the variables bash, as an image's /bin/sh, holds
// read-only.
var readOnly = map[string]bool{"BASHOPTS": true, "BASH_VERSINFO": true, "EUID": true, "PPID": true, "SHELLOPTS": true, "UID": true}

// refused reports an error of an exec the API server or the kubelet
// refused before it ran anything.
func refused(err error) bool {
	var status apierrors.APIStatus
	return errors.As(err, &status) || httpstream.IsUpgradeFailure(err)
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
		return fmt.Errorf("%w: kube: an environment variable sh could not export: the exec path sets the environment through sh", driver.ErrNotSupported)
	}
	return fmt.Errorf("%w: kube: %s could not start: %s", driver.ErrEngine, name, why)
}

// markGrace is how long a session whose marks are in may take to end
// before it is cut: the script ends at once, but containerd waits for
// the output pipes to close, which a child the command left in the
// background may hold. A variable for the tests.
var markGrace = 2 * time.Second

// marked is one exec session of a script that ends with the marks (see
// the top of this file): it sends the mark as the first line of the
// session's stdin, filters the marks out of stdout and stderr, and ends
// the session's stdin once it has both. The rest of its stdin is the
// caller's (in) when there is one, copied until it ends.
type marked struct {
	out, errs *markFilter
	stdin     *io.PipeReader
	hold      *io.PipeWriter
	both      chan struct{} // closed once both marks are in
	werr      error         // the first failure of an output writer, once streamed

	mu      sync.Mutex
	ended   bool   // stdout's mark
	word    string // stderr's mark's word: "exited STATUS", or why not
	stopped bool   // ctx ended before the marks, and the command was stopped
}

func newMarked(prefix string, in io.Reader, stdout, stderr io.Writer) *marked {
	mark := prefix + randomHex() + ":"
	s := &marked{both: make(chan struct{})}
	s.stdin, s.hold = io.Pipe()
	s.out = &markFilter{mark: mark, w: stdout, line: s.saw(true)}
	s.errs = &markFilter{mark: mark, w: stderr, line: s.saw(false)}
	go func() {
		_, err := io.WriteString(s.hold, mark+"\n")
		if err == nil && in != nil {
			_, err = io.Copy(s.hold, in)
			s.hold.CloseWithError(err)
		}
	}()
	return s
}

// saw returns the line callback of stdout's filter (out) or stderr's.
func (s *marked) saw(out bool) func(string) {
	return func(word string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.ended && s.word != "" {
			return
		}
		switch {
		case out && word == "end":
			s.ended = true
		case !out && s.word == "":
			s.word = word
		}
		if s.ended && s.word != "" {
			s.hold.Close() // both marks are in: the script may end
			close(s.both)
		}
	}
}

// stream runs the session to its end, or to markGrace after both marks.
// When ctx ends before the marks, it cuts the session at once, unless
// stop is set: then it calls stop, which kills the command, and lets the
// session drain to its marks, stopDrain at most, so that what the
// command printed before it was stopped, still on its way, arrives
// (stopped then reports it).
func (s *marked) stream(ctx context.Context, ex remotecommand.Executor, stop func()) error {
	parent, ended := ctx, (<-chan struct{})(nil)
	if stop != nil {
		parent, ended = context.WithoutCancel(ctx), ctx.Done()
	}
	sctx, cancel := context.WithCancel(parent)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- ex.StreamWithContext(sctx, remotecommand.StreamOptions{Stdin: s.stdin, Stdout: s.out, Stderr: s.errs})
	}()
	both := s.both
	var grace <-chan time.Time
	for {
		select {
		case err := <-done:
			s.stop()
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
			s.mu.Lock()
			s.stopped = true
			s.mu.Unlock()
			stop()
			grace = time.After(stopDrain)
		case <-grace:
			cancel() // everything is in, or the drain took too long
			s.stop()
			return nil
		}
	}
}

// stopDrain bounds how long a session may take to bring its marks
// once its command was stopped. A variable for the tests.
var stopDrain = time.Second

// stop drops what is written from now on (the caller reads its writers
// once the call returned), passes on what the filters held, and ends the
// session's stdin.
func (s *marked) stop() {
	s.hold.Close()
	for _, f := range []*markFilter{s.out, s.errs} {
		f.shut()
	}
	s.werr = cmp.Or(s.out.err, s.errs.err)
}

// wasStopped reports that ctx ended before the marks and the command
// was stopped.
func (s *marked) wasStopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

// result returns the script's status and its word when it was not
// "exited", and whether both marks arrived.
func (s *marked) result() (code int, why string, complete bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rest, exited := strings.CutPrefix(s.word, "exited ")
	if !exited {
		return 0, s.word, s.word != ""
	}
	code, err := strconv.Atoi(rest)
	return code, "", s.ended && err == nil
}

// cut is the error of a session that ended, with err, before its marks.
// The script's session ends with cat's status, 0, once it has written
// them: another status is the script's own end (killed, or a failed
// fork).
func (s *marked) cut(what, id string, err error) error {
	var ce utilexec.CodeExitError
	switch {
	case err == nil:
		return fmt.Errorf("%w: kube: %s %s: the session ended without the script's end marks: output or the exit status may be lost", driver.ErrUnavailable, what, id)
	case errors.As(err, &ce):
		return fmt.Errorf("%w: kube: %s %s: the script ended (status %d) before the command's end: killed, or it could not fork", driver.ErrEngine, what, id, ce.Code)
	}
	return classify(what, id, err)
}

// markFilter passes a stream to w but for the scripts' lines, MARK and a
// word: it takes them out, whatever the writes' boundaries, and calls
// line with the word of each. It holds back only what may be the start
// of such a line, until it knows. A failing w does not stop it: it keeps
// the error, drops what follows and still finds the marks (the session
// must reach them to end). Once shut it drops everything.
type markFilter struct {
	mark string
	w    io.Writer
	line func(word string)

	mu     sync.Mutex
	held   []byte
	err    error // w's first
	closed bool
}

func (f *markFilter) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return len(p), nil
	}
	data := append(f.held, p...)
	f.held = nil
	for len(data) > 0 {
		i := bytes.Index(data, []byte(f.mark))
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
		j := bytes.IndexByte(line, '\n')
		if j < 0 {
			if len(line) > 64 { // no word of the scripts' is that long
				f.pass(data[i : i+len(f.mark)])
				data = line
				continue
			}
			f.held = append([]byte(nil), data[i:]...)
			break
		}
		if f.line != nil {
			f.line(strings.TrimPrefix(string(line[:j]), " "))
		}
		data = line[j+1:]
	}
	return len(p), nil
}

func (f *markFilter) pass(b []byte) {
	if len(b) > 0 && f.err == nil {
		_, f.err = f.w.Write(b)
	}
}

// shut passes on what is held (the stream has ended) and drops what
// comes after.
func (f *markFilter) shut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.pass(f.held)
		f.held, f.closed = nil, true
	}
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
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
const tarScript = marksPrelude + `op=$1 p=$(printf "$2"; echo x); p=${p%x}
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
	s := newMarked("podvm-tar-", r, orDiscard(w), stderr)
	defer s.stop()
	ex, err := d.executor(id, "exec", &corev1.PodExecOptions{Container: Main, Command: []string{"/bin/sh", "-c", tarScript, "podvm-tar", op, octal(p)},
		Stdin: true, Stdout: true, Stderr: true})
	if err != nil {
		return err
	}
	err = s.stream(ctx, ex, nil)
	code, why, complete := s.result()
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
	case complete && s.werr != nil:
		return fmt.Errorf("vm: kube: copy %s %s: %w", op, p, s.werr)
	case complete:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("vm: kube: copy %s %s: %w", op, p, ctx.Err())
	}
	return s.cut("copy "+op, p, err)
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
