package vm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/capture"
	"github.com/podvm/podvm/internal/deadline"
	"github.com/podvm/podvm/internal/driver"
)

// Run runs cmd in the sandbox and waits for it, keeping the [VM.Run]
// contract: through podvm's agent (agent.go), or, with
// [Config.PodmanExec], as a Podman exec session. Its output is split into
// stdout and stderr as it arrives, into captures capped at
// cmd.MaxOutput() and the live writers; Stdin is streamed, then closed.
// The exit status is read once the output has been drained and the
// command has ended. A non-zero exit is data, 125 to 127 included; when
// the command could not start, Run returns a nil Result and an error
// matching [exec.ErrNotFound], [exec.ErrPermission] or
// [exec.ErrDirNotFound]. Other failures match [ErrNoSuchContainer],
// [ErrContainerNotRunning], [ErrUnavailable] or [ErrPodman]; per-command
// limits (Command.MaxMemoryBytes and the like) are refused with
// [exec.ErrUnsupported]: the sandbox's Config bounds every run.
//
// Through the agent, argv, env and output are carried byte for byte and
// Result.Usage is filled. A Podman exec session carries argv, env and the
// working directory as JSON strings, so on that path a command with bytes
// that are not UTF-8 in them is refused with [exec.ErrInvalidCommand]
// before anything runs, never altered, and Result.Usage is nil.
//
// When the timeout or ctx stops the run, every process the command
// started is killed inside the sandbox and Run returns the partial Result
// with TimedOut set and an error matching [context.DeadlineExceeded] or
// [context.Canceled], within the timeout plus [KillGrace]; a kill that
// could not finish is part of the error.
func (s *sandbox) Run(ctx context.Context, cmd exec.Command) (*exec.Result, error) {
	res, err := s.run(ctx, cmd)
	return s.blameRemove(cmd.Name, res, err)
}

// run is Run but for a Remove during the run.
func (s *sandbox) run(ctx context.Context, cmd exec.Command) (*exec.Result, error) {
	if err := checkRun(cmd); err != nil {
		return nil, err
	}
	st, err := s.container()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("vm: %s: %w", cmd.Name, err)
	}
	if st.agent != nil {
		return s.runAgent(ctx, st.agent, cmd)
	}
	if err := validUTF8(cmd); err != nil {
		return nil, err
	}
	runCtx, cancel := deadline.Start(ctx, cmd.Timeout)
	defer cancel()

	start := time.Now()
	stdout := capture.NewStream(cmd.MaxOutput(), cmd.Stdout)
	stderr := capture.NewStream(cmd.MaxOutput(), cmd.Stderr)
	marker := newMarker()
	p := driver.Process{
		Argv:    append([]string{cmd.Name}, cmd.Args...),
		Env:     append(exec.MergeEnv(nil, cmd.Env), marker),
		Workdir: cmp.Or(cmd.Dir, s.cfg.Workdir),
		User:    s.cfg.User,
		Stdout:  stdout,
		Stderr:  stderr,
	}
	// The kill, once: a driver that drains the session after a stop
	// (the kube exec path) calls it before it returns.
	var kill struct {
		once sync.Once
		err  error
	}
	stopRun := func() error {
		kill.once.Do(func() { kill.err = s.kill(ctx, st.id, p.User, marker, cmd.Name) })
		return kill.err
	}
	p.Stop = func() { _ = stopRun() }
	var stdin *errReader
	if cmd.Stdin != nil {
		stdin = &errReader{r: cmd.Stdin}
		p.Stdin = stdin
	}
	code, started, err := s.d.Exec(runCtx, st.id, p)
	if err != nil {
		stop := deadline.Err("vm", ctx, runCtx, cmd.Name, cmd.Timeout)
		if stop == nil && !started {
			return nil, fmt.Errorf("vm: %s: %w", cmd.Name, err)
		}
		// The command may be running.
		killErr := stopRun()
		res := result(stdout, stderr, -1, start)
		res.TimedOut = stop != nil
		if stop == nil {
			stop = fmt.Errorf("vm: %s: %w", cmd.Name, err)
		}
		return res, errors.Join(stop, killErr)
	}
	return result(stdout, stderr, code, start), streamErr(cmd.Name, stdin.Err(), stdout, stderr)
}

// checkRun refuses a command no sandbox can run as it asks.
func checkRun(cmd exec.Command) error {
	if err := cmd.Validate(); err != nil {
		return err
	}
	if cmd.MaxMemoryBytes != 0 || cmd.MaxPids != 0 || cmd.MaxCPUTime != 0 {
		// The sandbox's own limits (Config.Memory, Config.Pids) bound
		// every run; per-command limits are not carried into it.
		return fmt.Errorf("%w: vm: %s: per-command limits (MaxMemoryBytes, MaxPids, MaxCPUTime) are not enforced in a sandbox; use Config.Memory, Config.Pids",
			exec.ErrUnsupported, cmd.Name)
	}
	return nil
}

// streamErr is the first failure of a run's stdin or of its live
// writers, which fails a run that ended normally: output the caller asked
// for did not arrive, or the command did not get all of its input.
func streamErr(name string, stdinErr error, stdout, stderr *capture.Stream) error {
	for _, f := range []struct {
		name string
		err  error
	}{{"stdin", stdinErr}, {"stdout writer", stdout.LiveErr()}, {"stderr writer", stderr.LiveErr()}} {
		if f.err != nil {
			return fmt.Errorf("vm: %s: %s: %w", name, f.name, f.err)
		}
	}
	return nil
}

// markerKey is the environment variable that tags every process of one
// Run, inherited by its children, for the kill to find them all.
const markerKey = "PODVM_RUN"

// validUTF8 refuses a command that Podman would alter: it carries argv,
// env and the working directory as JSON strings, where bytes that are not
// UTF-8 become U+FFFD.
func validUTF8(cmd exec.Command) error {
	for _, f := range []struct {
		what string
		vals []string
	}{{"name", []string{cmd.Name}}, {"dir", []string{cmd.Dir}}, {"argument", cmd.Args}, {"env entry", cmd.Env}} {
		if i := slices.IndexFunc(f.vals, func(v string) bool { return !utf8.ValidString(v) }); i >= 0 {
			return fmt.Errorf("%w: %s %q is not valid UTF-8, which Podman's exec cannot carry unaltered", exec.ErrInvalidCommand, f.what, f.vals[i])
		}
	}
	return nil
}

func result(stdout, stderr *capture.Stream, code int, start time.Time) *exec.Result {
	return &exec.Result{
		Stdout:      stdout.String(),
		Stderr:      stderr.String(),
		ExitCode:    code,
		Duration:    time.Since(start),
		Truncated:   stdout.Truncated() || stderr.Truncated(),
		StdoutBytes: stdout.Total(),
		StderrBytes: stderr.Total(),
	}
}

// blameRemove reports a run that Remove cut short as such. A run refused
// before it started (an invalid command, or ErrRemoved already) is left
// as it is. A run during which Remove began, and that ended by an error,
// by a signal (the 137 of a process the removal killed) or with Podman's
// own failure status 125 (Podman 5's CLI, when the container went
// mid-exec), was ended by Remove; any other exit status stays data.
func (s *sandbox) blameRemove(name string, res *exec.Result, err error) (*exec.Result, error) {
	if !s.state().removed || errors.Is(err, exec.ErrInvalidCommand) || errors.Is(err, ErrRemoved) {
		return res, err
	}
	if err == nil && (res == nil || res.ExitCode <= 128 && res.ExitCode != 125) {
		return res, err
	}
	return res, errors.Join(fmt.Errorf("vm: %s: %w while it ran", name, ErrRemoved), err)
}

// errReader keeps the first error of r other than io.EOF. Its Err may be
// called while another goroutine reads, and on a nil *errReader.
type errReader struct {
	r   io.Reader
	err atomic.Pointer[error]
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.err.CompareAndSwap(nil, &err)
	}
	return n, err
}

// Err is the first error other than io.EOF that a Read has returned.
func (e *errReader) Err() error {
	if e == nil || e.err.Load() == nil {
		return nil
	}
	return *e.err.Load()
}
