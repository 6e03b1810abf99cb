package podman

import (
	"cmp"
	"fmt"
	"io"
	"io/fs"
	"regexp"
	"slices"
	"strings"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/capture"
	"github.com/podvm/podvm/internal/driver"
)

// This file is where Podman's failures are recognised, for both transports
// and both Podman versions: one table of its messages (written from the
// samples in testdata/podman-stderr and testdata/libpod, which the tests
// replay) and one rule that tells its failure to start a command from the
// command's own exit status.

// MessageBytes caps what is kept of output that only matters as an error
// message.
const MessageBytes = 64 << 10

// podmanMessages are Podman's failure messages, most specific first, each
// with the error it means.
var podmanMessages = []struct {
	re  *regexp.Regexp
	err error
}{
	// runc could not start an exec's command.
	{regexp.MustCompile(`chdir to cwd \(.*\) set in config\.json failed`), exec.ErrDirNotFound},
	{regexp.MustCompile(`OCI runtime attempted to invoke a command that was not found`), exec.ErrNotFound},
	{regexp.MustCompile(`OCI permission denied`), exec.ErrPermission},
	// The container.
	{regexp.MustCompile(`no such container|no container with name or ID|container ".*" does not exist|no such exec session|container has already been removed`), driver.ErrNoSuchContainer},
	{regexp.MustCompile(`container state improper|container [^ ]+ is not running`), driver.ErrContainerNotRunning},
	{regexp.MustCompile(`that name is already in use`), driver.ErrNameInUse},
	// An image a container uses, refused by a removal without force.
	{regexp.MustCompile(`image is in use by a container`), driver.ErrImageInUse},
	// The image: absent under --pull never, or no registry gave it.
	{regexp.MustCompile(`image not known|failed to find image|no such image|initializing source docker://|did not resolve to an alias|manifest unknown`), driver.ErrImageNotFound},
	// A path given to a copy. `podman cp -` says the same of a missing
	// destination and of a file: no directory there.
	{regexp.MustCompile(`could not be found on container|destination must be a directory when copying from stdin`), fs.ErrNotExist},
	// The service.
	// podman --url ssh://: no SSH connection (a refused or dropped key
	// exchange, failed authentication).
	{regexp.MustCompile(`Cannot connect to Podman|unable to connect to Podman socket|failed to connect: ssh: `), driver.ErrUnavailable},
	// Known, with no better sentinel than driver.ErrEngine: podman-remote could
	// not deliver a Stdin the command did not read, and lost its status.
	{regexp.MustCompile(`unable to find user|Failed to write input to service`), driver.ErrEngine},
}

// recognise returns the error of the first of podmanMessages found in
// msg, or nil.
func recognise(msg string) error {
	for _, m := range podmanMessages {
		if m.re.MatchString(msg) {
			return m.err
		}
	}
	return nil
}

// StartFailure returns an error when an exec session's outcome is Podman
// failing to start the command rather than the command's own exit. Both
// transports carry Podman's message on the command's stderr, so it
// decides by content: a status Podman uses for its own failures (125;
// 126 or 127 when runc could not execute the command; 255 from the local
// CLI), nothing on stdout, and a stderr (stderrHead, whole: stderrTotal
// long) made only of Podman's own lines, which podmanMessages recognises.
// Anything else is the command's exit and stays data, a command's own
// "Error: the build failed" and 125 included.
func StartFailure(name string, code int, stdoutTotal int64, stderrHead string, stderrTotal int64) error {
	if !slices.Contains([]int{125, 126, 127, 255}, code) || stdoutTotal != 0 || stderrTotal == 0 || int64(len(stderrHead)) != stderrTotal {
		return nil
	}
	lines := strings.Split(strings.TrimSpace(stderrHead), "\n")
	if slices.ContainsFunc(lines, func(l string) bool { return !podmanLine.MatchString(l) }) {
		return nil
	}
	sentinel := recognise(stderrHead)
	if sentinel == nil || sentinel == fs.ErrNotExist {
		return nil
	}
	msg := lines[0]
	if i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "Error: ") }); i >= 0 {
		msg = lines[i]
	}
	if name != "" {
		return fmt.Errorf("%w: %s: podman exited %d: %s", sentinel, name, code, strings.TrimPrefix(msg, "Error: "))
	}
	return fmt.Errorf("%w: podman exited %d: %s", sentinel, code, strings.TrimPrefix(msg, "Error: "))
}

// LostStream returns an error when podman exited 125 (code) because its
// stream to the service broke, which stderrTail, the end of its stderr,
// shows by Podman's own lines last (in any order), one of them about the
// broken stream: podman-remote then reports that instead of the
// command's status, and may have lost output (containers/podman#25855).
// A 125 without such lines is data, and so is one whose lines say that
// the command could not start (Podman 5's remote CLI reports the broken
// stream after that too): [StartFailure] tells which.
func LostStream(name string, code int, stderrTail string) error {
	if code != 125 {
		return nil
	}
	own := ownLines(stderrTail)
	switch recognise(strings.Join(own, "\n")) {
	case exec.ErrNotFound, exec.ErrPermission, exec.ErrDirNotFound:
		return nil
	}
	for _, l := range own {
		if brokenStream.MatchString(l) {
			return fmt.Errorf("%w: %s: podman lost the command's exit status and maybe its output: its stream to the service broke (%s)",
				driver.ErrEngine, name, strings.TrimPrefix(l, "Error: "))
		}
	}
	return nil
}

// ownLines are Podman's own lines at the end of stderrTail, after the
// command's.
func ownLines(stderrTail string) []string {
	lines := strings.Split(strings.TrimRight(stderrTail, "\n"), "\n")
	i := len(lines)
	for i > 0 && podmanLine.MatchString(lines[i-1]) {
		i--
	}
	return lines[i:]
}

// brokenStream is a line of podman-remote's when its exec stream broke.
var brokenStream = regexp.MustCompile(`^Error: (read|write) unix(packet)? [^ ]*: (read|write): (connection reset by peer|broken pipe|use of closed network connection)$|level=error msg="Failed to write input to service`)

// podmanLine is a line Podman itself prints on a failure: its error, the
// CLI's notice that it cannot connect, a podman-remote log line.
var podmanLine = regexp.MustCompile(`^(Error: |Cannot connect to Podman|time="[^"]*" level=(error|warning) msg=)`)

// CLIError is a podman invocation that failed: the [CLI] driver's errors
// wrap one, next to the sentinel it was mapped to, so that [errors.As]
// reaches what podman said.
type CLIError struct {
	// Op is podman's subcommand: "run", "exec", "cp", "rm".
	Op string
	// ExitCode is podman's exit status.
	ExitCode int
	// Stderr is podman's standard error, as captured.
	Stderr string
}

// Error returns podman's error lines, without their "Error: " prefixes.
func (e *CLIError) Error() string {
	var msgs []string
	for _, l := range strings.Split(e.Stderr, "\n") {
		if m, ok := strings.CutPrefix(strings.TrimSpace(l), "Error: "); ok {
			msgs = append(msgs, m)
		}
	}
	if len(msgs) == 0 {
		msgs = append(msgs, strings.TrimSpace(e.Stderr))
	}
	return fmt.Sprintf("podman %s exited %d: %s", e.Op, e.ExitCode, strings.Join(msgs, "; "))
}

// classify wraps native, Podman's failure of op on what (which may be
// empty), with the sentinel msg is recognised as, driver.ErrEngine when none.
func classify(op, what, msg string, native error) error {
	return wrap(cmp.Or(recognise(msg), driver.ErrEngine), op, what, native)
}

// wrap wraps err, the failure of op on what (which may be empty), with
// sentinel when it is not nil.
func wrap(sentinel error, op, what string, err error) error {
	if what != "" {
		op += " " + what
	}
	if sentinel == nil {
		return fmt.Errorf("vm: %s: %w", op, err)
	}
	return fmt.Errorf("%w: %s: %w", sentinel, op, err)
}

// sniffBytes is how much of an exec's stderr is kept, besides what the
// caller gets, to tell Podman's failure to start the command.
const sniffBytes = 4 << 10

// startWatch sees an exec session's output on its way to the caller, to
// tell, once the session ended, Podman's failure to start the command
// from the command's own exit ([StartFailure]).
type startWatch struct {
	stdout int64
	out    io.Writer
	stderr *capture.Buffer
}

// watchStart puts a startWatch on p's output.
func watchStart(p *driver.Process) *startWatch {
	w := &startWatch{out: p.Stdout, stderr: capture.New(sniffBytes)}
	if w.out == nil {
		w.out = io.Discard
	}
	p.Stdout = w
	if p.Stderr == nil {
		p.Stderr = w.stderr
	} else {
		p.Stderr = io.MultiWriter(p.Stderr, w.stderr)
	}
	return w
}

func (w *startWatch) Write(b []byte) (int, error) {
	w.stdout += int64(len(b))
	return w.out.Write(b)
}

// execWatched runs exec, Podman's exec of p, and reports Podman's failure
// to start the command as an error, the session not started: each driver
// tells its engine's own failures, and the caller never reads Podman's
// stderr.
func execWatched(p driver.Process, exec func(driver.Process) (int, bool, error)) (int, bool, error) {
	w := watchStart(&p)
	code, started, err := exec(p)
	if err == nil {
		if ferr := StartFailure("", code, w.stdout, w.stderr.String(), w.stderr.Total()); ferr != nil {
			return code, false, ferr
		}
	}
	return code, started, err
}
