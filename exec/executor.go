package exec

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	osexec "os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/podvm/podvm/internal/capture"
	"github.com/podvm/podvm/internal/cgroup"
	"github.com/podvm/podvm/internal/deadline"
)

// DefaultKillGrace is how long Run waits, after the command's process has
// exited or been killed, for its output pipes to close before it closes
// them itself: long enough to drain what was written, short enough that a
// process that escaped a process-group containment and holds the pipes
// cannot delay the return. Under the cgroup and subreaper containments
// every holder is dead by then and the pipes close at once.
const DefaultKillGrace = 500 * time.Millisecond

// CommandExecutor runs commands as host processes. Each run is contained
// so that, when it ends by exit, timeout or cancellation, whatever the
// command left running is killed: by a cgroup of its own, a subreaper
// helper or a process group, the strongest the host offers (see
// [Containment]). Create one with [NewCommandExecutor]; it is safe for
// concurrent use.
type CommandExecutor struct {
	baseEnv    []string
	hasBaseEnv bool
	grace      time.Duration
	want       Containment
	cgroupDir  string

	once    sync.Once // settles the fields below
	mode    Containment
	modeErr error
	parent  *cgroup.Parent // for ContainCgroup
}

var _ Executor = (*CommandExecutor)(nil)

// Option configures a [CommandExecutor].
type Option interface{ apply(*CommandExecutor) }

type optionFunc func(*CommandExecutor)

func (f optionFunc) apply(e *CommandExecutor) { f(e) }

// WithBaseEnv sets the environment commands start from, instead of the
// calling process's environment. WithBaseEnv(nil) or an empty slice starts
// commands with an empty environment (plus their Command.Env).
func WithBaseEnv(env []string) Option {
	env = append([]string{}, env...)
	return optionFunc(func(e *CommandExecutor) { e.baseEnv, e.hasBaseEnv = env, true })
}

// WithKillGrace sets how long Run waits for output pipes after the process
// ended before closing them; see [DefaultKillGrace].
func WithKillGrace(d time.Duration) Option {
	return optionFunc(func(e *CommandExecutor) { e.grace = d })
}

// NewCommandExecutor returns a host executor.
func NewCommandExecutor(opts ...Option) *CommandExecutor {
	e := &CommandExecutor{grace: DefaultKillGrace}
	for _, o := range opts {
		o.apply(e)
	}
	return e
}

// Run runs cmd on the host and waits for it; see the package documentation
// for the contract and [Containment] for what is killed when. The returned
// error matches [ErrInvalidCommand], [ErrNotFound], [ErrPermission],
// [ErrDirNotFound] or [ErrUnsupported] when the command could not start
// (with a nil Result), and [context.DeadlineExceeded] or
// [context.Canceled] when the run was stopped (with the partial Result).
// If cmd's Stdin, Stdout or Stderr panics while Run runs, the run is
// killed and cleaned up, then Run panics with the same value.
func (e *CommandExecutor) Run(ctx context.Context, cmd Command) (*Result, error) {
	if err := cmd.Validate(); err != nil {
		return nil, err
	}
	if cmd.Dir != "" {
		if fi, err := os.Stat(cmd.Dir); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("%w: %q", ErrDirNotFound, cmd.Dir)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("exec: %s: %w", cmd.Name, err)
	}

	e.once.Do(e.choose)
	if e.modeErr != nil {
		return nil, fmt.Errorf("exec: %s: %w", cmd.Name, e.modeErr)
	}
	if err := e.limitError(cmd); err != nil {
		return nil, err
	}

	runCtx, cancel := deadline.Start(ctx, cmd.Timeout)
	defer cancel()
	callbacks := &panics{cancel: cancel}
	made := e.newCgroup(cmd)
	abandon := func() {
		if cg, _ := made(); cg != nil {
			cg.Remove()
		}
	}

	stdout := capture.NewStream(cmd.MaxOutput(), cmd.Stdout)
	stderr := capture.NewStream(cmd.MaxOutput(), cmd.Stderr)
	outR, outW, err := os.Pipe()
	if err != nil {
		abandon()
		return nil, fmt.Errorf("exec: %s: %w", cmd.Name, err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		abandon()
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("exec: %s: %w", cmd.Name, err)
	}
	in, err := newStdin(cmd.Stdin, callbacks)
	if err != nil {
		abandon()
		outR.Close()
		errR.Close()
		outW.Close()
		errW.Close()
		return nil, fmt.Errorf("exec: %s: %w", cmd.Name, err)
	}

	start := time.Now()
	cg, err := made()
	var p proc
	if err == nil {
		p, err = e.start(cmd, e.env(cmd.Env), stdio{in: in.child, out: outW, err: errW}, cg)
	}
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		in.abandon()
		return nil, err
	}
	in.start()
	defer in.stop()

	var drained sync.WaitGroup
	var act activity // so the grace can tell idle pipes from a slow writer
	drain := func(r *os.File, w io.Writer) {
		defer drained.Done()
		buf := copyBuffers.Get().(*[]byte)
		defer copyBuffers.Put(buf)
		// Hidden behind a plain Reader, the file does not copy through a
		// buffer of its own: one less allocation of 32 KiB per stream.
		src := struct{ io.Reader }{r}
		defer io.CopyBuffer(io.Discard, src, *buf) // after a panicking writer: the run is being killed
		defer callbacks.catch()
		io.CopyBuffer(activeWriter{w, &act}, src, *buf)
	}
	drained.Add(2)
	go drain(outR, stdout)
	go drain(errR, stderr)

	// Kill the run when the context ends; after a normal exit, end kills
	// what the command left running.
	stopKill := context.AfterFunc(runCtx, p.kill)
	out, endErr := p.end()
	stopKill()

	// Pipes held by a process that escaped a process group are closed once
	// they have been idle for the grace (a slow live writer still gets every
	// byte), or, when the run was stopped, after the grace however busy.
	done := make(chan struct{})
	go func() { drained.Wait(); close(done) }()
	for waiting := true; waiting; {
		seen := act.writes.Load()
		select {
		case <-done:
			waiting = false
		case <-time.After(e.grace):
			if act.idle(seen) || runCtx.Err() != nil {
				outR.Close()
				errR.Close()
				<-done
				waiting = false
			}
		}
	}
	outR.Close()
	errR.Close()

	callbacks.rethrow() // everything is dead and cleaned up

	res := &Result{
		Stdout:      stdout.String(),
		Stderr:      stderr.String(),
		ExitCode:    out.code,
		Duration:    time.Since(start),
		Truncated:   stdout.Truncated() || stderr.Truncated(),
		StdoutBytes: stdout.Total(),
		StderrBytes: stderr.Total(),
		Usage:       out.usage,
	}
	if stopErr := deadline.Err("exec", ctx, runCtx, cmd.Name, cmd.Timeout); stopErr != nil && out.killed {
		res.TimedOut, res.ExitCode = true, -1
		return res, stopErr
	}
	if endErr != nil {
		return res, fmt.Errorf("exec: %s: %w", cmd.Name, endErr)
	}
	for _, s := range []struct {
		name string
		err  error
	}{{"stdin", in.stop()}, {"stdout writer", stdout.LiveErr()}, {"stderr writer", stderr.LiveErr()}} {
		if s.err != nil {
			return res, fmt.Errorf("exec: %s: %s: %w", cmd.Name, s.name, s.err)
		}
	}
	return res, nil
}

// panics carries a panic of the caller's Stdin, Stdout or Stderr, raised
// in one of Run's goroutines, back to Run's caller: the run is killed and
// cleaned up first, then Run panics with the same value.
type panics struct {
	cancel context.CancelFunc
	mu     sync.Mutex
	v      any
	set    bool
	over   bool // Run has returned: a late panic stays where it is
}

// catch, deferred in a goroutine that calls the caller's code, recovers a
// panic and kills the run.
func (p *panics) catch() {
	v := recover()
	if v == nil {
		return
	}
	p.mu.Lock()
	over := p.over
	if !p.set {
		p.v, p.set = v, true
	}
	p.mu.Unlock()
	if over {
		panic(v)
	}
	p.cancel()
}

// rethrow panics with the first value caught, if any.
func (p *panics) rethrow() {
	p.mu.Lock()
	p.over = true
	v, set := p.v, p.set
	p.mu.Unlock()
	if set {
		panic(v)
	}
}

// stdin feeds a Command's Stdin to the process. os/exec would copy it
// itself, but then Wait waits for that copy, and a reader that never
// returns would hold Run forever; here the copy is ours, and the run stops
// waiting for it once the process has exited.
// With no Stdin, or a file the process reads directly, there is no pipe
// and no copy: w is nil.
type stdin struct {
	src   io.Reader
	calls *panics
	child *os.File // the process's end: src itself when it is a file; nil when src is nil
	w     *os.File // our end
	done  chan struct{}
	err   error // the reader's, not the pipe's; set before done closes
}

func newStdin(src io.Reader, calls *panics) (*stdin, error) {
	if f, ok := src.(*os.File); ok || src == nil {
		return &stdin{child: f}, nil
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	return &stdin{src: src, calls: calls, child: r, w: w, done: make(chan struct{})}, nil
}

// start begins the copy, once the process holds its end of the pipe.
func (in *stdin) start() {
	if in.w == nil {
		return
	}
	in.child.Close()
	go func() {
		defer in.calls.catch()
		w := &pipeWriter{f: in.w}
		_, err := io.Copy(w, in.src)
		if w.err == nil { // the pipe fails when the process stops reading: not an error
			in.err = err
		}
		close(in.done)
		in.w.Close()
	}()
}

// abandon closes the pipe when the process never started.
func (in *stdin) abandon() {
	if in.w != nil {
		in.child.Close()
		in.w.Close()
	}
}

// pipeWriter remembers its error, to tell it from the reader's.
type pipeWriter struct {
	f   *os.File
	err error
}

func (p *pipeWriter) Write(b []byte) (int, error) {
	n, err := p.f.Write(b)
	if err != nil {
		p.err = err
	}
	return n, err
}

// stop ends the copy: a copy blocked writing to the pipe fails at once; one
// blocked in the caller's reader is left behind, to return when that reader
// does. It reports the reader's error when the copy had ended.
func (in *stdin) stop() error {
	if in.w == nil {
		return nil
	}
	in.w.Close() // a second Close, after the copy's, is harmless
	select {
	case <-in.done:
		return in.err
	default:
		return nil
	}
}

// activity tracks the writes of the drained streams.
type activity struct {
	writes  atomic.Int64 // finished
	writing atomic.Int32 // under way
}

// idle reports whether no write is under way and none finished since the
// count was seen.
func (a *activity) idle(seen int64) bool {
	return a.writing.Load() == 0 && a.writes.Load() == seen
}

// copyBuffers holds the buffers that carry a command's output to its
// capture.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// activeWriter records its writes in an activity.
type activeWriter struct {
	w   io.Writer
	act *activity
}

func (a activeWriter) Write(p []byte) (int, error) {
	a.act.writing.Add(1)
	defer a.act.writing.Add(-1)
	defer a.act.writes.Add(1)
	return a.w.Write(p)
}

func (e *CommandExecutor) env(over []string) []string {
	base := e.baseEnv
	if !e.hasBaseEnv {
		if over == nil {
			return nil // os/exec: the calling process's environment
		}
		base = os.Environ()
	}
	env := MergeEnv(base, over)
	if env == nil {
		env = []string{} // empty, not inherited
	}
	return env
}

// startError classifies why a command could not start.
func startError(name string, err error) error {
	switch {
	case errors.Is(err, osexec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s", ErrNotFound, name)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.ENOEXEC), errors.Is(err, syscall.EISDIR):
		return fmt.Errorf("%w: %s: %w", ErrPermission, name, err)
	}
	return fmt.Errorf("exec: %s: %w", name, err)
}
