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
	"syscall"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/agent"
	"github.com/podvm/podvm/internal/capture"
)

// This file is the processes a sandbox holds by handle: started, left
// running, signalled, fed and read while they run, through podvm's agent.

// ErrProcessDone is returned by [Process.Signal] and [Process.Kill] once
// the process has ended, as [os.ErrProcessDone] is.
var ErrProcessDone = errors.New("vm: process already finished")

// ErrLimit is returned by [Start] and [Dial] (and closes a connection
// [Forward] accepted) when the sandbox already holds as many processes
// ([MaxProcesses]) or connections ([MaxConnections]) as it may.
var ErrLimit = errors.New("vm: limit reached")

// The most a sandbox holds at once for its caller. Each process of
// [Start] costs the sandbox a supervising process of the agent (8
// threads, which its pids limit counts: 64 of them fit under
// [DefaultPids] with room for their commands) and the caller up to two
// output windows of 1 MiB; each connection one window each way.
const (
	MaxProcesses   = 64
	MaxConnections = 256
)

// ProcessStarter is implemented by a [VM] that can start processes and
// hold them by handle: every sandbox with podvm's agent (not
// [Config.PodmanExec]). [Start] and [Processes] call it.
type ProcessStarter interface {
	Start(ctx context.Context, cmd exec.Command, opts ...StartOption) (*Process, error)
	Processes() []*Process
}

// StartOption configures [Start].
type StartOption func(*startOptions)

type startOptions struct {
	tty        bool
	rows, cols uint16
}

// WithTerminal runs the process on a new pseudo-terminal of rows×cols
// (24×80 for zeros) in the sandbox, its controlling terminal in a session
// of its own, as a terminal emulator runs a shell: its stdin, stdout and
// stderr are the terminal, so [Process.Stdout] carries the raw byte
// stream it shows (echo and escape sequences included; [Process.Stderr]
// stays empty) and [Process.Stdin] is typed at it: "\x03" (^C)
// interrupts its foreground job, "\x04" (^D) is the end of its input,
// and Closing it does nothing. [Process.Resize] changes its size.
func WithTerminal(rows, cols uint16) StartOption {
	return func(o *startOptions) { o.tty, o.rows, o.cols = true, rows, cols }
}

// Start starts cmd in the sandbox and returns once it runs, with a handle
// on it; the process goes on after Start returns, until it exits, its
// cmd.Timeout kills it, [Process.Kill] does, or the sandbox is removed
// or dies. Start fails as [VM.Run] does when the command cannot start
// (errors matching [exec.ErrNotFound], [exec.ErrPermission],
// [exec.ErrDirNotFound], [exec.ErrInvalidCommand], [ErrNotCreated],
// [ErrRemoved]); ctx bounds the start alone. A VM that is not a
// [ProcessStarter], or a sandbox on the Podman exec path, fails with
// [ErrNotSupported].
//
// Its stdin is cmd.Stdin when set, else [Process.Stdin]'s writer. Its
// output goes to cmd.Stdout and cmd.Stderr when set, as Run's does, and
// to the process's [Output] buffers, each keeping the last
// cmd.MaxOutput() bytes for readers.
func Start(ctx context.Context, v VM, cmd exec.Command, opts ...StartOption) (*Process, error) {
	ps, ok := capability[ProcessStarter](v)
	if !ok {
		return nil, fmt.Errorf("%w: vm: %s: a %T holds no processes (it is not a vm.ProcessStarter)", ErrNotSupported, cmd.Name, v)
	}
	return ps.Start(ctx, cmd, opts...)
}

// Processes returns the processes of v started with [Start] that have not
// ended, oldest first; none for a VM that is not a [ProcessStarter].
func Processes(v VM) []*Process {
	if ps, ok := capability[ProcessStarter](v); ok {
		return ps.Processes()
	}
	return nil
}

// Process is a command started in a sandbox with [Start]. Its methods
// are safe for concurrent use.
type Process struct {
	cmd    exec.Command
	tty    bool
	p      *agent.Proc
	s      *sandbox
	start  time.Time
	stdin  *io.PipeWriter // nil when cmd.Stdin feeds it
	stdinR *io.PipeReader
	out    [2]*Output
	capt   [2]*capture.Stream
	timer  *time.Timer

	timedOut atomic.Bool
	done     chan struct{}
	res      *exec.Result // set before done is closed
	err      error
}

// Start implements [ProcessStarter]: see [Start].
func (s *sandbox) Start(ctx context.Context, cmd exec.Command, opts ...StartOption) (*Process, error) {
	var o startOptions
	for _, opt := range opts {
		opt(&o)
	}
	if err := checkRun(cmd); err != nil {
		return nil, err
	}
	st, err := s.container()
	if err != nil {
		return nil, err
	}
	if st.agent == nil {
		return nil, fmt.Errorf("%w: vm: %s: a process held by handle needs podvm's agent in the sandbox; with Config.PodmanExec each command is a Podman exec session, which podvm cannot hold, signal or read again", ErrNotSupported, cmd.Name)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("vm: %s: %w", cmd.Name, err)
	}
	if !s.reserve(&s.procs, MaxProcesses) {
		return nil, fmt.Errorf("%w: vm: %s: %d processes of vm.Start live in this sandbox, the most it holds (vm.MaxProcesses)", ErrLimit, cmd.Name, MaxProcesses)
	}
	started := false
	defer func() {
		if !started {
			s.release(&s.procs)
		}
	}()
	p, stdin, w := s.newProcess(cmd, o.tty, time.Now())
	req := s.agentRequest(cmd)
	req.TTY, req.Rows, req.Cols = o.tty, o.rows, o.cols
	c, done := st.agent.take()
	ap, err := c.Start(ctx, req, stdin, w[0], w[1])
	if err != nil {
		done()
		if p.stdin != nil {
			p.stdinR.CloseWithError(ErrProcessDone)
		}
		if s.state().removed {
			return nil, fmt.Errorf("vm: %s: %w", cmd.Name, ErrRemoved)
		}
		return nil, s.agentStartError(ctx, cmd.Name, err)
	}
	go func() { <-ap.Done(); done() }()
	started = true      // released by wait
	if !s.hold(p, ap) { // Remove began while it started: it ends with the sandbox
		return nil, fmt.Errorf("vm: %s: %w", cmd.Name, ErrRemoved)
	}
	return p, nil
}

// newProcess is a Process of s for cmd, begun at start, not yet running:
// with the stdin to give its run (cmd's, or the pipe of its Stdin) and
// the writers of its output.
func (s *sandbox) newProcess(cmd exec.Command, tty bool, start time.Time) (*Process, io.Reader, [2]io.Writer) {
	p := &Process{cmd: cmd, tty: tty, s: s, start: start, done: make(chan struct{})}
	var w [2]io.Writer
	for i, live := range []io.Writer{cmd.Stdout, cmd.Stderr} {
		p.out[i] = newOutput(cmd.MaxOutput())
		p.capt[i] = capture.NewStream(cmd.MaxOutput(), live)
		w[i] = io.MultiWriter(outputWriter{p.out[i]}, p.capt[i])
	}
	stdin := cmd.Stdin
	if stdin == nil {
		p.stdinR, p.stdin = io.Pipe()
		stdin = p.stdinR
	}
	return p, stdin, w
}

// hold makes p, its run ap under way and a place of MaxProcesses taken,
// one of s's processes until it ends, and starts its Timeout. When s is
// being removed, hold kills it, waits for its end and returns false.
func (s *sandbox) hold(p *Process, ap *agent.Proc) bool {
	p.p = ap
	if p.cmd.Timeout > 0 {
		p.timer = time.AfterFunc(p.cmd.Timeout, func() {
			p.timedOut.Store(true)
			_ = ap.Kill()
		})
	}
	s.procMu.Lock()
	closed := s.closed
	if !closed {
		if s.live == nil {
			s.live = map[*Process]bool{}
		}
		s.live[p] = true
	}
	s.procMu.Unlock()
	go p.wait()
	if closed {
		_ = ap.Kill()
		<-p.done
		return false
	}
	return true
}

// Processes implements [ProcessStarter]: see [Processes].
func (s *sandbox) Processes() []*Process {
	s.procMu.Lock()
	defer s.procMu.Unlock()
	list := make([]*Process, 0, len(s.live))
	for p := range s.live {
		list = append(list, p)
	}
	slices.SortFunc(list, func(a, b *Process) int { return cmp.Or(a.start.Compare(b.start), cmp.Compare(a.PID(), b.PID())) })
	return list
}

// wait waits for the run's end and keeps its result.
func (p *Process) wait() {
	ex, err := p.p.Wait(context.Background())
	if p.timer != nil {
		p.timer.Stop()
	}
	if p.stdin != nil {
		p.stdinR.CloseWithError(ErrProcessDone)
	}
	for _, o := range p.out {
		o.close()
	}
	name := p.cmd.Name
	res := result(p.capt[0], p.capt[1], ex.Code, p.start)
	if ex.Reported {
		res.Usage = &ex.Usage
	}
	switch {
	case p.timedOut.Load() && ex.Killed:
		res.TimedOut, res.ExitCode = true, -1
		err = errors.Join(fmt.Errorf("vm: %s: timed out after %v: %w", name, p.cmd.Timeout, context.DeadlineExceeded), agentError(name, err))
	case errors.Is(err, agent.ErrChannelClosed) && p.s.state().removed:
		res.ExitCode = -1
		err = fmt.Errorf("vm: %s: %w while it ran: %w", name, ErrRemoved, err)
	case errors.Is(err, agent.ErrChannelClosed):
		res.ExitCode = -1
		err = p.s.channelClosed(context.Background(), name, err)
	case err != nil:
		err = agentError(name, err)
	default:
		err = streamErr(name, nil, p.capt[0], p.capt[1])
	}
	p.res, p.err = p.s.blameRemove(name, res, err)
	p.s.procMu.Lock()
	delete(p.s.live, p)
	p.s.procMu.Unlock()
	p.s.release(&p.s.procs)
	close(p.done)
}

// PID is the process's pid in the sandbox (also its process group's).
func (p *Process) PID() int { return p.p.PID() }

// Command is the command the process runs, as Start was given it.
func (p *Process) Command() exec.Command { return p.cmd }

// Done is closed once the process has ended and its result is ready.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait waits for the process to end and returns its result, as [VM.Run]
// does: its exit status (a non-zero one is data), its output captured
// within cmd.MaxOutput() (head and tail kept), its usage, TimedOut set
// with an error matching [context.DeadlineExceeded] when cmd.Timeout
// killed it. When the sandbox is removed or dies first, the result holds
// what arrived and the error says why: [ErrRemoved] (removed through
// the VM), else [ErrNoSuchContainer], [ErrContainerNotRunning] or
// [ErrUnavailable].
// When ctx ends first, Wait returns ctx's error and leaves the process
// running; it may be called again, and always returns the same.
func (p *Process) Wait(ctx context.Context) (*exec.Result, error) {
	select {
	case <-p.done:
		res := *p.res
		return &res, p.err
	case <-ctx.Done():
		return nil, fmt.Errorf("vm: %s: waiting: %w", p.cmd.Name, ctx.Err())
	}
}

// Signal sends sig to the process's group in the sandbox: the command and
// whatever it started that stayed in its group. It fails with
// [ErrProcessDone] once the process has ended, and at once, without
// blocking, when the sandbox is gone.
func (p *Process) Signal(sig syscall.Signal) error {
	return p.control(func() error { return p.p.Signal(sig) })
}

// Resize sets the size of the process's terminal ([WithTerminal]); the
// process gets SIGWINCH. A process without one fails with
// [ErrNotSupported].
func (p *Process) Resize(rows, cols uint16) error {
	if !p.tty {
		return fmt.Errorf("%w: vm: %s: no terminal to resize (see vm.WithTerminal)", ErrNotSupported, p.cmd.Name)
	}
	return p.control(func() error { return p.p.Resize(rows, cols) })
}

// Kill kills the process and everything it started, however it
// detached, as a Run's timeout does; Wait then reports an exit status of
// 137 (128+SIGKILL).
func (p *Process) Kill() error {
	return p.control(p.p.Kill)
}

func (p *Process) control(f func() error) error {
	select {
	case <-p.p.Done():
		return ErrProcessDone
	default:
	}
	if err := f(); err != nil {
		return agentError(p.cmd.Name, err)
	}
	return nil
}

// Stdin returns the writer of the process's stdin: each Write is carried
// to the command as it comes (blocking while the command does not read),
// and Close ends its stdin. Writes fail with [ErrProcessDone] once the
// process has ended. When cmd.Stdin was set, it is the process's stdin and
// the writer refuses every write.
func (p *Process) Stdin() io.WriteCloser { return stdinWriter{p} }

type stdinWriter struct{ p *Process }

func (w stdinWriter) Write(b []byte) (int, error) {
	if w.p.stdin == nil {
		return 0, fmt.Errorf("vm: %s: stdin is Command.Stdin: %w", w.p.cmd.Name, io.ErrClosedPipe)
	}
	select {
	case <-w.p.p.Done():
		return 0, ErrProcessDone
	default:
	}
	n, err := w.p.stdin.Write(b)
	if err != nil && isDone(w.p.p.Done()) {
		err = ErrProcessDone
	}
	return n, err
}

func isDone(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func (w stdinWriter) Close() error {
	if w.p.stdin == nil || w.p.tty {
		return nil // a terminal's input ends with ^D, typed
	}
	return w.p.stdin.Close()
}

// Stdout is the process's standard output, as it comes.
func (p *Process) Stdout() *Output { return p.out[0] }

// Stderr is the process's standard error, as it comes.
func (p *Process) Stderr() *Output { return p.out[1] }

// endProcesses waits, up to d, for every process of s to have ended
// (Remove ends them): a handle's Wait then answers at once.
func (s *sandbox) endProcesses(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for _, p := range s.Processes() {
		select {
		case <-p.done:
		case <-t.C:
			return
		}
	}
}

var _ ProcessStarter = (*sandbox)(nil)

// held is what a sandbox holds for its caller beside its runs: the
// processes of Start that have not ended, and the forwards of Forward
// that are open. Remove ends them all.
type held struct {
	procMu   sync.Mutex
	live     map[*Process]bool
	forwards map[*Forwarder]bool
	closed   bool // Remove began: nothing more is held
	procs    int  // processes started or starting, for MaxProcesses
	conns    int  // connections open or opening, for MaxConnections
}

// reserve counts one more against limit in *n, unless *n is at it.
func (h *held) reserve(n *int, limit int) bool {
	h.procMu.Lock()
	defer h.procMu.Unlock()
	if *n >= limit {
		return false
	}
	*n++
	return true
}

// release counts one less in *n.
func (h *held) release(n *int) {
	h.procMu.Lock()
	*n--
	h.procMu.Unlock()
}

// holdForward makes f one of the sandbox's forwards, closed by Remove,
// unless the sandbox is being removed, and returns what is closed when
// the sandbox dies (its agent's channel ends).
func (s *sandbox) holdForward(f *Forwarder) (dead <-chan struct{}, ok bool) {
	s.procMu.Lock()
	defer s.procMu.Unlock()
	st := s.state()
	if s.closed || st.removed {
		return nil, false
	}
	if s.forwards == nil {
		s.forwards = map[*Forwarder]bool{}
	}
	s.forwards[f] = true
	f.release = func() {
		s.procMu.Lock()
		delete(s.forwards, f)
		s.procMu.Unlock()
	}
	if st.agent != nil {
		dead = st.agent.dead()
	}
	return dead, true
}

// stopHolding makes Start and Forward refuse from now on, and returns
// the open forwards, for Remove to close.
func (s *sandbox) stopHolding() []*Forwarder {
	s.procMu.Lock()
	defer s.procMu.Unlock()
	s.closed = true
	fs := make([]*Forwarder, 0, len(s.forwards))
	for f := range s.forwards {
		fs = append(fs, f)
	}
	return fs
}
