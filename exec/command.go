package exec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/podvm/podvm/internal/capture"
	"github.com/podvm/podvm/internal/envlist"
)

// DefaultMaxOutputBytes is the per-stream capture limit used when
// [Command.MaxOutputBytes] is zero: 1 MiB.
const DefaultMaxOutputBytes = 1 << 20

// Sentinel errors, checked with [errors.Is]. Errors returned by podvm wrap
// one of them and name the culprit.
var (
	// ErrInvalidCommand: the Command was refused before anything ran (empty
	// name, NUL byte, env entry without "=", negative limit).
	ErrInvalidCommand = errors.New("exec: invalid command")
	// ErrNotFound: the command does not exist or is not in PATH.
	ErrNotFound = errors.New("exec: command not found")
	// ErrPermission: the command exists but cannot be executed.
	ErrPermission = errors.New("exec: permission denied")
	// ErrDirNotFound: the working directory does not exist or is not a
	// directory.
	ErrDirNotFound = errors.New("exec: working directory not found")
	// ErrNotAllowed: a [Policy] refused the command; nothing ran.
	ErrNotAllowed = errors.New("exec: not allowed by policy")
)

// Command is a program to run and how to run it. It is an argv, never a
// shell line. The zero value of each optional field is documented on it.
type Command struct {
	// Name is the program: a path, or a name looked up in PATH. Required.
	Name string
	// Args are the arguments after the program name, passed verbatim.
	Args []string
	// Dir is the working directory. If empty, the executor's default is
	// used: the calling process's directory on the host, the sandbox's
	// workdir in a VM.
	Dir string
	// Env holds KEY=VALUE entries added to the executor's base environment,
	// replacing entries with the same key. If nil, the base environment is
	// used unchanged. For [CommandExecutor] the base is the calling
	// process's environment unless [WithBaseEnv] says otherwise; in a
	// sandbox it is the sandbox's configured environment, never the host's.
	Env []string
	// Stdin, if non-nil, is the command's standard input. If nil, the
	// command reads from an empty input. Run does not wait for Stdin to
	// end once the command has exited; a Read still blocked then returns
	// into a goroutine that ends with it. An error from Stdin, other than
	// io.EOF, is returned by Run when the copy had ended by the time Run
	// returns.
	Stdin io.Reader
	// Stdout and Stderr, if non-nil, receive the whole of each stream as
	// it is produced, in addition to the capture in [Result], even when
	// the capture is truncated. If one fails, it receives nothing more and
	// Run reports its error.
	Stdout, Stderr io.Writer
	// Timeout bounds the run. Zero means no timeout beyond the context's.
	Timeout time.Duration
	// MaxOutputBytes caps each stream's capture. Zero means
	// [DefaultMaxOutputBytes].
	MaxOutputBytes int

	// The limits below are enforced by the kernel, or refused: an
	// executor that cannot enforce one fails the run before it starts
	// with an error matching [ErrUnsupported], never ignores it. Zero
	// means no limit. For [CommandExecutor] see [Containment] for where
	// each holds.

	// MaxMemoryBytes caps the memory of the whole run (the cgroup's
	// memory.max, with no swap beyond it): past it the kernel reclaims,
	// then kills processes of the run (the command reports 137 when it is
	// the one killed). Needs the cgroup containment with the memory
	// controller.
	MaxMemoryBytes int64
	// MaxPids caps how many processes and threads the run may have at
	// once (the cgroup's pids.max): a fork beyond it fails with EAGAIN.
	// Needs the cgroup containment with the pids controller.
	MaxPids int
	// MaxCPUTime caps the CPU time of each process of the run
	// (RLIMIT_CPU, rounded up to whole seconds): at the limit the process
	// gets SIGXCPU (exit code 152 unless it handles it), a second later
	// SIGKILL. Each process has its own budget; the run's total is
	// bounded by Timeout. Needs the subreaper helper ([Init]).
	MaxCPUTime time.Duration
}

// Validate reports whether c can be run, with an error matching
// [ErrInvalidCommand] that names the offending field when it cannot.
func (c Command) Validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidCommand}, a...)...)
	}
	switch {
	case c.Name == "":
		return bad("empty name")
	case strings.IndexByte(c.Name, 0) >= 0:
		return bad("NUL byte in name %q", c.Name)
	case strings.IndexByte(c.Dir, 0) >= 0:
		return bad("NUL byte in dir %q", c.Dir)
	case c.Timeout < 0:
		return bad("negative timeout %v", c.Timeout)
	case c.MaxOutputBytes < 0:
		return bad("negative MaxOutputBytes %d", c.MaxOutputBytes)
	case c.MaxMemoryBytes < 0:
		return bad("negative MaxMemoryBytes %d", c.MaxMemoryBytes)
	case c.MaxPids < 0:
		return bad("negative MaxPids %d", c.MaxPids)
	case c.MaxCPUTime < 0:
		return bad("negative MaxCPUTime %v", c.MaxCPUTime)
	}
	for i, a := range c.Args {
		switch {
		case strings.IndexByte(a, 0) >= 0:
			return bad("NUL byte in argument %d %q", i, a)
		case len(a) > MaxArgBytes:
			return bad("argument %d is %d bytes; at most %d fit in one argument", i, len(a), MaxArgBytes)
		}
	}
	return ValidateEnv(c.Env)
}

// MaxArgBytes is the longest argument or env entry a command may have:
// Linux refuses to exec one of 128 KiB or more (MAX_ARG_STRLEN, the NUL
// terminator included), whatever the total size of the argument list.
const MaxArgBytes = 128<<10 - 1

// ValidateEnv checks that every entry is KEY=VALUE with a non-empty key
// and no NUL byte, returning an error matching [ErrInvalidCommand].
func ValidateEnv(env []string) error {
	for _, e := range env {
		k, _, ok := strings.Cut(e, "=")
		switch {
		case strings.IndexByte(e, 0) >= 0:
			return fmt.Errorf("%w: NUL byte in env entry %q", ErrInvalidCommand, e)
		case len(e) > MaxArgBytes:
			return fmt.Errorf("%w: env entry %.20q... is %d bytes; at most %d fit in one entry", ErrInvalidCommand, e, len(e), MaxArgBytes)
		case !ok || k == "":
			return fmt.Errorf("%w: env entry %q is not KEY=VALUE", ErrInvalidCommand, e)
		}
	}
	return nil
}

// MergeEnv returns base with the entries of over added; an entry of over
// replaces every entry of base with the same key, and the last of
// duplicates within over wins. Order: base's surviving keys first, in
// their order, then over's new keys. Neither input is modified.
func MergeEnv(base, over []string) []string { return envlist.Merge(base, over) }

// MaxOutput returns the effective per-stream capture limit of c.
func (c Command) MaxOutput() int {
	if c.MaxOutputBytes == 0 {
		return DefaultMaxOutputBytes
	}
	return c.MaxOutputBytes
}

// Result is what a command did. Stdout and Stderr hold the captured
// output: everything when it fits in the command's MaxOutputBytes,
// otherwise the first and the last part joined by a marker that states how
// many bytes were omitted.
type Result struct {
	// Stdout and Stderr are the captured streams (see [Result]).
	Stdout, Stderr string
	// ExitCode is the exit status: 128+signal when killed by a signal, -1
	// when the run timed out or was cancelled.
	ExitCode int
	// Duration is the wall time from start to the end of the run.
	Duration time.Duration
	// TimedOut reports that the timeout or the context ended the run.
	TimedOut bool
	// Truncated reports that at least one stream exceeded the cap.
	Truncated bool
	// StdoutBytes and StderrBytes count every byte each stream produced,
	// captured or not.
	StdoutBytes, StderrBytes int64
	// Usage is the run's resource usage as the kernel counted it, or nil
	// when it is not known (see [Usage] for where each executor gets it).
	Usage *Usage
}

// Usage is the resource usage of one run, as the kernel counted it. Both
// the host executor and the sandbox agent report it in this form.
//
// For [CommandExecutor], by [Containment]: under ContainCgroup, CPU times
// come from the run cgroup's cpu.stat (every process of the tree, killed
// leftovers included) and PeakRSS from its memory.peak where the cgroup
// has the memory controller (Linux 5.19+), else from rusage as below;
// under ContainSubreaper, from the helper's RUSAGE_CHILDREN once it has
// reaped the whole tree (every process of the tree; PeakRSS of the
// largest one); under ContainProcessGroup, from the rusage of the waited
// command (itself and the descendants it waited for).
type Usage struct {
	// UserCPU and SystemCPU are the CPU time spent in user and kernel
	// mode by the run's processes: the whole tree where the run was
	// contained (a cgroup, or a subreaper), else the command and the
	// descendants it waited for.
	UserCPU, SystemCPU time.Duration
	// PeakRSS is the peak resident memory in bytes: of the run's cgroup
	// as a whole where it is measured, else of its largest single process.
	PeakRSS int64
}

// StdoutTail returns the last n lines of stdout, always from the true end
// of the stream: when the capture was truncated, only lines after the
// omission marker are returned, never lines from the start.
func (r *Result) StdoutTail(n int) string {
	return capture.Tail(capture.Suffix(r.Stdout, r.StdoutBytes), n)
}

// StderrTail is [Result.StdoutTail] for stderr.
func (r *Result) StderrTail(n int) string {
	return capture.Tail(capture.Suffix(r.Stderr, r.StderrBytes), n)
}

// Executor runs commands. Implementations keep the contract described in
// the package documentation. Run returns a non-nil Result whenever the
// command started, even when it also returns an error (a timeout, a failed
// Stdout writer).
type Executor interface {
	Run(ctx context.Context, cmd Command) (*Result, error)
}

//go:generate go tool mockgen -destination execmock/execmock.go -package execmock -typed . Executor
