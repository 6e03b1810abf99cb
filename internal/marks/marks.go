// Package marks runs a command in an engine's exec session under a
// POSIX sh script that makes the session's end provable, for exec paths
// that can lose output without a word: the kube driver's (containerd and
// the API server drop output still in flight when an exec's process
// exits, and client-go then reports success) and podman-remote's before
// 5.7 (its client reads the hijacked stream from the raw connection, so
// output that came in the same read as the response's header, held by
// net/http's buffer, is dropped: containers/podman#25855, fixed by
// containers/podman#27061).
//
// The script reads MARK, the first line of the session's stdin, before
// anything else: no output can come before the caller has sent it, so
// none before the caller's side reads the stream. Once the command has
// exited, it writes MARK and "end" on stdout, after everything of the
// command's, and MARK and "exited STATUS" on stderr, and then holds the
// session open by reading its own stdin (cat, exec'd: the session's own
// status is 0, the command's travels in the mark), which the caller
// ends once it has read both marks: everything before them has arrived.
// What holds the output is the output pipes, not the process: containerd
// drops what is in flight once every writer of the session's stdout and
// stderr has closed them, so cat keeps them open (as fds 3 and 4) until
// it ends. A session that ends without them is an error, never a short
// result. MARK is random per session: it appears in no argv a process of
// the sandbox could read. It guards against chance matches and argv
// readers; a process of the sandbox running as the run's user can still
// meddle with the run's streams, as it can with any of its processes.
// The marks are written again until they go through: a command may leave
// the pipes they share non-blocking (O_NONBLOCK) and full. The hold
// needs the session's stdin: for a command that reads its own, the hold
// ends when that stdin does, and a cut after it is detected (an error),
// not prevented.
package marks

import (
	"bytes"
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/driver"
)

// Prelude begins both scripts: it reads MARK, the first line of the
// session's stdin, puts the usual directories before the session's PATH
// for the script's own tools (cat, sleep, tar: the session's PATH may
// be the caller's, which need not name them; ExecScript gives the
// command the session's back), and defines podvm_say, which writes a mark line and
// writes it again until it goes through, and podvm_end, which writes
// both marks and then holds the session (cat, with the output pipes kept
// open as fds 3 and 4) until the driver ends its stdin.
const Prelude = `read -r podvm_m || exit 125
podvm_p=${PATH-} podvm_ps=${PATH+x}
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin${PATH:+:$PATH}
podvm_say() { until printf '%s %s\n' "$podvm_m" "$1" 2>/dev/null; do sleep 0.05 2>/dev/null || :; done; }
podvm_end() { podvm_say end; podvm_say "$1" >&2; exec cat 3>&1 4>&2 >/dev/null 2>&1; }
`

// ExecScript sets up a command as Podman's exec would and runs it:
//
//	sh -c ExecScript podvm-exec DIR N IN KEY=VALUE... ARGV...
//
// with MARK on the first line of its stdin. It changes to DIR when it is
// not empty and runs the command in a subshell, its stdin the session's
// when IN is not empty, else /dev/null: the subshell gives back the
// session's PATH, takes out the variables sh itself exports (SHLVL,
// PWD, OLDPWD), exports the N entries
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
const ExecScript = Prelude + `podvm_d=$1 podvm_n=$2 podvm_i=$3; shift 3
podvm_run() (
  podvm_no() { podvm_say "$1" >&3; exit 127; }
  if [ -n "$podvm_ps" ]; then PATH=$podvm_p; else unset PATH; fi
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

// Args are the arguments of sh that run argv under ExecScript, after
// "sh": in directory dir ("" for the session's), with env exported over
// the session's environment, and the session's stdin as the command's
// when stdin is set (else /dev/null).
func Args(dir string, env []string, stdin bool, argv []string) []string {
	in := ""
	if stdin {
		in = "in"
	}
	a := append([]string{"-c", ExecScript, "podvm-exec", dir, strconv.Itoa(len(env)), in}, env...)
	return append(a, argv...)
}

// CheckEnv refuses, with [driver.ErrNotSupported], an environment whose
// variable ExecScript cannot set for the command ([Unsettable]); engine
// names the exec path ("kube").
func CheckEnv(engine string, env []string) error {
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if why := Unsettable(name); why != "" {
			return fmt.Errorf("%w: %s: environment variable %q: the exec path sets the environment through sh, where %s", driver.ErrNotSupported, engine, name, why)
		}
	}
	return nil
}

// Unsettable says why ExecScript cannot export a variable of this name
// for the command, or "" when it can.
func Unsettable(name string) string {
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

// StartError is the error of a command ExecScript could not start, why
// being its stderr's word: engine names the exec path ("kube").
func StartError(engine, name, dir, why string) error {
	switch why {
	case "notfound":
		return fmt.Errorf("%w: %s: %s", exec.ErrNotFound, engine, name)
	case "perm":
		return fmt.Errorf("%w: %s: %s", exec.ErrPermission, engine, name)
	case "dir":
		return fmt.Errorf("%w: %s: %s", exec.ErrDirNotFound, engine, dir)
	case "env":
		return fmt.Errorf("%w: %s: an environment variable sh could not export: the exec path sets the environment through sh", driver.ErrNotSupported, engine)
	}
	return fmt.Errorf("%w: %s: %s could not start: %s", driver.ErrEngine, engine, name, why)
}

// Session is one exec session of a script that ends with the marks (see
// the package's comment): it sends the mark as the first line of the
// session's stdin, filters the marks out of stdout and stderr, and ends
// the session's stdin once it has both. The rest of its stdin is the
// caller's (in) when there is one, copied until it ends. The caller runs
// the session with [Session.Stdin], [Session.Stdout] and
// [Session.Stderr] as its streams, calls [Session.Stop] once it ended,
// and reads how with [Session.Result].
type Session struct {
	out, errs *filter
	stdin     *io.PipeReader
	hold      *io.PipeWriter
	both      chan struct{} // closed once both marks are in
	werr      error         // the first failure of an output writer, once streamed

	mu      sync.Mutex
	ended   bool        // stdout's mark
	word    string      // stderr's mark's word: "exited STATUS", or why not
	stopped bool        // ctx ended before the marks, and the command was stopped
	wait    *time.Timer // once one mark is in: the other's stall, which cuts the session
	writing int         // the filters' Writes in flight: a caller's writer may block
	over    bool        // both marks are in, or Stop: the timer is not armed again
}

// MarkWait bounds how long, once one mark is in, the session's output
// may stand still without bringing the other: the script writes them one
// after the other, so only a stream that lost its mark stalls that long.
// Then the session's stdin is ended, which ends the script, and
// [Session.Result] reports the marks incomplete. A Write to the caller's
// writer in flight is not a stall: a writer that never returns holds the
// session until the caller's ctx ends.
var MarkWait = 2 * time.Second

// New returns the session of a script whose marks begin with prefix
// ("podvm-exec-"), its output going to stdout and stderr (nil: dropped).
func New(prefix string, in io.Reader, stdout, stderr io.Writer) *Session {
	mark := prefix + randomHex() + ":"
	s := &Session{both: make(chan struct{})}
	s.stdin, s.hold = io.Pipe()
	s.out = &filter{mark: mark, w: orDiscard(stdout), line: s.saw(true), moved: s.moved}
	s.errs = &filter{mark: mark, w: orDiscard(stderr), line: s.saw(false), moved: s.moved}
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
func (s *Session) saw(out bool) func(string) {
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
		switch {
		case s.ended && s.word != "":
			s.hold.Close() // both marks are in: the script may end
			close(s.both)
			s.over = true
			if s.wait != nil {
				s.wait.Stop()
			}
		case s.wait == nil && !s.over:
			s.wait = time.AfterFunc(MarkWait, s.stalled)
		}
	}
}

// stalled ends the session's stdin once its output stood still MarkWait
// after the first mark, unless a Write is still in flight (the caller's
// writer is slow, not the stream): then it waits again.
func (s *Session) stalled() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.over {
		return
	}
	if s.writing > 0 {
		s.wait.Reset(MarkWait)
		return
	}
	s.hold.Close()
}

// moved is the filters' news of output, at the start (by 1) and the end
// (by -1) of each Write: it holds off the cut of a session whose second
// mark is still on its way behind it.
func (s *Session) moved(by int) {
	s.mu.Lock()
	s.writing += by
	if s.wait != nil && !s.over {
		s.wait.Reset(MarkWait)
	}
	s.mu.Unlock()
}

// Stdin is what the session's stdin reads: MARK's line, then the
// caller's stdin, until both marks are in (or Stop).
func (s *Session) Stdin() io.Reader { return s.stdin }

// Stdout is the writer of the session's stdout: the marks are taken out.
func (s *Session) Stdout() io.Writer { return s.out }

// Stderr is the writer of the session's stderr: the marks are taken out.
func (s *Session) Stderr() io.Writer { return s.errs }

// Both is closed once both marks are in: everything before them has
// arrived, and the session's stdin has ended.
func (s *Session) Both() <-chan struct{} { return s.both }

// SetStopped records that the caller's ctx ended before the marks and
// the command was stopped.
func (s *Session) SetStopped() {
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
}

// Err is the first failure of an output writer, once stopped.
func (s *Session) Err() error { return s.werr }

// Stop drops what is written from now on (the caller reads its writers
// once the call returned), passes on what the filters held, and ends the
// session's stdin.
func (s *Session) Stop() {
	s.mu.Lock()
	s.over = true
	if s.wait != nil {
		s.wait.Stop()
	}
	s.mu.Unlock()
	s.hold.Close()
	for _, f := range []*filter{s.out, s.errs} {
		f.shut()
	}
	s.werr = cmp.Or(s.out.err, s.errs.err)
}

// Stopped reports that ctx ended before the marks and the command was
// stopped ([Session.SetStopped]).
func (s *Session) Stopped() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopped
}

// Result returns the script's status and its word when it was not
// "exited", and whether both marks arrived.
func (s *Session) Result() (code int, why string, complete bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rest, exited := strings.CutPrefix(s.word, "exited ")
	if !exited {
		return 0, s.word, s.word != ""
	}
	code, err := strconv.Atoi(rest)
	return code, "", s.ended && err == nil
}

// filter passes a stream to w but for the scripts' lines, MARK and a
// word: it takes them out, whatever the writes' boundaries, and calls
// line with the word of each. It holds back only what may be the start
// of such a line, until it knows. A failing w does not stop it: it keeps
// the error, drops what follows and still finds the marks (the session
// must reach them to end). Once shut it drops everything.
type filter struct {
	mark  string
	w     io.Writer
	line  func(word string)
	moved func(by int) // a Write begins (1) or ends (-1); nil: no one asks

	mu     sync.Mutex
	held   []byte
	err    error // w's first
	closed bool
}

func (f *filter) Write(p []byte) (int, error) {
	if f.moved != nil {
		f.moved(1)
		defer f.moved(-1)
	}
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

func (f *filter) pass(b []byte) {
	if len(b) > 0 && f.err == nil {
		_, f.err = f.w.Write(b)
	}
}

// shut passes on what is held (the stream has ended) and drops what
// comes after.
func (f *filter) shut() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.pass(f.held)
		f.held, f.closed = nil, true
	}
}

func randomHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}
