package vm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/agent"
	"github.com/podvm/podvm/internal/driver"
)

// A checkpoint saves a running sandbox's processes and memory with CRIU,
// for the sandbox to be suspended and resumed, or restored as fresh ones.
// This file decides, before anything of the caller's changes, whether the
// engine can do it at all.

// checkpointProbeTimeout bounds each of the probe's steps: its dump, its
// restore, and on the exec path its command. Each takes well under a
// second where CRIU works; where the kernel never fires CRIU's
// breakpoints, a dump never ends.
const checkpointProbeTimeout = 30 * time.Second

// CheckpointSupport reports whether v's sandbox can be checkpointed and
// restored ([TakeCheckpoint], [Restore], [Suspend]): nil, or an error
// matching [ErrNotSupported] that names why, found without touching v's
// sandbox (v may be created or not). Nothing but a real dump tells a
// CRIU that reports a good version but cannot dump on this kernel, so
// the first call for a service, an image and a kind of sandbox (the
// agent or [Config.PodmanExec], its network) makes a probe sandbox of
// that kind, suspends it (a checkpoint in place), resumes it and removes
// it: about a second where CRIU works. That answer is kept for the
// process, unless the service could not be reached or ctx ended.
//
// Refused: rootless Podman (CRIU needs root), a service without CRIU or
// whose CRIU fails here (Podman 4.3 with Debian 12's CRIU 3.17 on Linux
// 6.x), Kubernetes (the kubelet can checkpoint a container, but nothing
// restores one), and, where the engine can, a sandbox whose agent talks
// (or would) over a unix socket of the caller's: on a Podman service of
// this machine, one made without [Config.Checkpointable].
func CheckpointSupport(ctx context.Context, v VM) error {
	s, ok := capability[interface {
		checkpointable(context.Context, bool) error
		socketChannel() bool
	}](v)
	if !ok {
		return fmt.Errorf("%w: checkpoints: %T cannot checkpoint", ErrNotSupported, v)
	}
	return s.checkpointable(ctx, s.socketChannel())
}

// socketChannel reports whether s's agent talks over a unix socket of
// the caller's, or will once created.
func (s *sandbox) socketChannel() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.created {
		return s.chanDir != ""
	}
	return !s.cfg.PodmanExec && s.agentOverSocket()
}

// checkpointProbes holds the probe's answer (error, nil included) for
// each backend, service, image and kind of sandbox, as checkpointKey
// names them: the backends reach CRIU through different paths, and the
// kinds of sandbox have different mounts and networks for CRIU to dump
// and restore. checkpointProbing serializes the probes of one key, so
// that callers at once make one probe sandbox, not one each.
var checkpointProbes, checkpointProbing sync.Map

type checkpointKey struct {
	backend, service, image, network string
	podmanExec                       bool
}

func (s *sandbox) checkpointSupport(ctx context.Context) error {
	_, service := s.d.Local()
	c, ok := s.d.(driver.Checkpointer)
	if !ok {
		return fmt.Errorf("%w: checkpoints: the engine of %s cannot checkpoint containers", ErrNotSupported, service)
	}
	key := checkpointKey{fmt.Sprintf("%T", s.d), service, s.cfg.Image, s.cfg.Network, s.cfg.PodmanExec}
	mu, _ := checkpointProbing.LoadOrStore(key, new(sync.Mutex))
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()
	if err, ok := checkpointProbes.Load(key); ok {
		err, _ := err.(error)
		return err
	}
	err := c.CheckpointRefusal(ctx)
	if err == nil {
		err = s.probeCheckpoint(ctx, c)
	}
	// An answer is kept; a failure to get one (the service unreachable,
	// ctx, the probe's own trouble) is not.
	if err == nil || errors.Is(err, ErrNotSupported) && !errors.Is(err, ErrUnavailable) && ctx.Err() == nil {
		checkpointProbes.Store(key, err)
	}
	return err
}

// checkpointable returns nil when s's sandbox, whose agent talks over a
// unix socket of the caller's or not, can be checkpointed, else an
// error matching ErrNotSupported that names why: first what the engine
// cannot do, which nothing of the caller's changes, then what
// Config.Checkpointable would.
func (s *sandbox) checkpointable(ctx context.Context, socket bool) error {
	if err := s.checkpointSupport(ctx); err != nil {
		return err
	}
	return socketRefusal(socket)
}

// socketRefusal is the refusal of a checkpoint of a sandbox whose agent
// talks over a unix socket of the caller's (socket), else nil.
func socketRefusal(socket bool) error {
	if socket {
		return fmt.Errorf("%w: checkpoints: the sandbox's agent talks over a unix socket of the caller's, which no checkpoint can carry; a sandbox made with Config.Checkpointable talks over its stdio", ErrNotSupported)
	}
	return nil
}

// probeCheckpoint suspends and resumes a probe sandbox like s (its image,
// network, the agent or Podman exec) on s's engine, through c, and
// removes it. A failure of the engine's at that is ErrNotSupported,
// naming the service and the engine's words. On the exec path the
// resumed probe runs a command; through the agent, whose channel ends
// with the dump (its resumption is the checkpoint's own work), the
// restore's success is the answer. The dump and the restore run to their
// end when ctx ends (finishDespiteCancel), so that the removal does not
// meet a container the engine still holds.
func (s *sandbox) probeCheckpoint(ctx context.Context, c driver.Checkpointer) error {
	_, service := s.d.Local()
	var p sandbox
	p.prepare(Config{Image: s.cfg.Image, Network: s.cfg.Network, PodmanExec: s.cfg.PodmanExec, Pids: s.cfg.Pids,
		Pull: s.cfg.Pull, ImageArchive: s.cfg.ImageArchive, Name: "podvm-criu-probe-" + randomHex()[:12],
		Checkpointable: true}) // whether the engine can: a socket's connection to us no dump can carry
	// s's driver, lent: the probe's Remove must not close it. (What else
	// the driver offers, as Limiter, the probe does without.)
	p.d = unclosed{s.d}
	remove := func(err error) error {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if rerr := p.Remove(rctx); rerr != nil {
			return errors.Join(err, fmt.Errorf("vm: checkpoints: removing the probe sandbox %s: %w", p.cfg.Name, rerr))
		}
		return err
	}
	if err := p.Create(ctx); err != nil {
		return remove(fmt.Errorf("vm: checkpoints: the probe sandbox: %w", err))
	}
	id := p.state().id
	refuse := func(step string, err error) error {
		if errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
			return err // no answer
		}
		return fmt.Errorf("%w: checkpoints: the Podman service %s cannot %s a container: %w", ErrNotSupported, service, step, err)
	}
	// step runs a step to its end, bounded; timedOut: the bound, not
	// ctx, ended it.
	step := func(what string, f func(context.Context, string) error) (timedOut bool, err error) {
		pctx, cancel := context.WithTimeout(ctx, checkpointProbeTimeout)
		defer cancel()
		_, err = finishDespiteCancel(pctx, what+" the probe", func(ctx context.Context) (struct{}, error) {
			return struct{}{}, f(ctx, id)
		})
		return err != nil && ctx.Err() == nil && pctx.Err() != nil, err
	}
	if timedOut, err := step("checkpoint", c.Suspend); timedOut {
		return remove(refuse("checkpoint", fmt.Errorf("the dump did not end within %v. CRIU stops a dumped process with a hardware breakpoint, which never fires in some VMs; CRIU_FAULT=130 in criu's environment makes it use PTRACE_SYSCALL instead. The probe container %s stays locked by the dump until criu is killed on the service's host: %w", checkpointProbeTimeout, p.cfg.Name, err)))
	} else if err != nil {
		return remove(refuse("checkpoint", err))
	}
	if timedOut, err := step("restore", c.Resume); timedOut {
		return remove(refuse("restore", fmt.Errorf("the restore did not end within %v: %w", checkpointProbeTimeout, err)))
	} else if err != nil {
		return remove(refuse("restore", err))
	}
	if p.cfg.PodmanExec {
		pctx, cancel := context.WithTimeout(ctx, checkpointProbeTimeout)
		defer cancel()
		res, err := p.Run(pctx, exec.Command{Args: []string{"true"}})
		switch {
		case err != nil:
			return remove(refuse("restore", fmt.Errorf("the restored probe does not run a command: %w", err)))
		case res.ExitCode != 0:
			return remove(refuse("restore", fmt.Errorf("the restored probe ran `true` with exit %d", res.ExitCode)))
		}
	}
	return remove(nil)
}

// dumpError is err, a failed dump's, with what may name its cause where
// the engine's error does not: the TCP sockets the frozen agent found,
// and CRIU's own errors from its log where the service's files are
// this machine's.
func (s *sandbox) dumpError(err error, f agent.Frozen) error {
	if !errors.Is(err, ErrPodman) {
		return err // not the engine's: ctx, the service unreachable
	}
	if len(f.TCP) > 0 {
		err = fmt.Errorf("%w; the sandbox holds TCP sockets, which CRIU may not dump (CRIU 4.1 on Linux 6.18 dumps none: close them first): %s", err, strings.Join(f.TCP, "; "))
	}
	if local, _ := s.d.Local(); local {
		if log := criuErrors(err.Error()); log != "" {
			err = fmt.Errorf("%w; CRIU's log: %s", err, log)
		}
	}
	return err
}

// workPathRE finds the directory of CRIU's log in runc's command line,
// as Podman's error quotes it.
var workPathRE = regexp.MustCompile(`--work-path (/\S+)`)

// criuErrors returns the last of the error lines of the dump.log that
// msg's runc command line names, "" when there is none to read.
func criuErrors(msg string) string {
	m := workPathRE.FindStringSubmatch(msg)
	if m == nil {
		return ""
	}
	f, err := os.Open(filepath.Join(m[1], "dump.log"))
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(io.LimitReader(f, 4<<20))
	for sc.Scan() {
		if l := sc.Text(); strings.Contains(l, "Error (") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	if len(lines) > 4 {
		lines = lines[len(lines)-4:]
	}
	return strings.Join(lines, " | ")
}

// unclosed is a driver whose Close does nothing: another sandbox's,
// lent.
type unclosed struct{ driver.Driver }

func (unclosed) Close() {}

// Suspend checkpoints v's sandbox in place and stops it: its processes'
// memory is saved in the engine's storage and freed, until [Resume]
// brings the sandbox back as it was, on the same service. It needs what
// [CheckpointSupport] checks, which it asks first (ErrNotSupported,
// naming why, before anything changes).
//
// While suspended, Run, the copies and file calls, Start and Dial fail
// with [ErrSuspended]; a Run in flight, a process held by handle and
// its output wait, and go on after Resume; Remove removes the sandbox,
// its checkpoint with it. A failed dump leaves the sandbox running and
// usable, unless the engine says it stopped it before it failed: then
// it is suspended, and the error matches ErrSuspended too. Once the dump
// is done, Suspend returns nil, even if ctx ended meanwhile. Suspending
// a suspended sandbox does nothing. On a Podman
// service of this machine, the sandbox must be made with
// [Config.Checkpointable].
func Suspend(ctx context.Context, v VM) error {
	s, ok := capability[interface {
		suspend(context.Context) error
	}](v)
	if !ok {
		return fmt.Errorf("%w: suspend: %T cannot checkpoint", ErrNotSupported, v)
	}
	return s.suspend(ctx)
}

// Resume restores v's sandbox, suspended by [Suspend], in place: its
// processes go on from where they were, their handles too. Resuming a
// sandbox that is not suspended does nothing. When the restore fails,
// the sandbox stays suspended (Remove it, or try again).
func Resume(ctx context.Context, v VM) error {
	s, ok := capability[interface {
		resume(context.Context) error
	}](v)
	if !ok {
		return fmt.Errorf("%w: resume: %T cannot checkpoint", ErrNotSupported, v)
	}
	return s.resume(ctx)
}

// setSuspended records whether the sandbox is suspended; under s.mu.
func (s *sandbox) setSuspended(suspended bool) {
	st := s.state()
	st.suspended = suspended
	s.st.Store(&st)
}

func (s *sandbox) suspend(ctx context.Context) error {
	// Before s.mu: the first answer for a kind of sandbox takes a probe.
	if err := s.checkpointSupport(ctx); err != nil {
		return err // before anything, created or not
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := socketRefusal(s.chanDir != ""); err != nil {
		return err
	}
	st, err := s.container()
	switch {
	case errors.Is(err, ErrSuspended):
		return nil
	case err != nil:
		return err
	}
	c := s.d.(driver.Checkpointer) // checkpointSupport found it
	s.setSuspended(true)           // new calls fail from now on, rather than wait
	_, after, err := s.frozenDump(ctx, st, "suspend", true, func(ctx context.Context) error {
		return c.Suspend(ctx, st.id)
	})
	switch after {
	case dumped:
		return nil // done, even if ctx ended meanwhile
	case goesOn:
		s.setSuspended(false)
		return fmt.Errorf("vm: suspend: %w", err)
	default:
		return fmt.Errorf("vm: suspend: %w", suspendedBy(after, err))
	}
}

// afterDump is where a frozenDump left the sandbox.
type afterDump int

const (
	goesOn  afterDump = iota // it runs, its agent too: nothing was dumped, or the dump left it running
	dumped                   // the dump that stops it succeeded: it is stopped, its agent detached
	stopped                  // a dump that stops it failed after it stopped it
	lost                     // it runs (or its state is unknown), but its agent was not reached again
)

// suspendedBy is err, of a dump that left the sandbox as after says
// (stopped or lost), with what the caller may do now.
func suspendedBy(after afterDump, err error) error {
	if after == stopped {
		return fmt.Errorf("%w; the dump stopped the sandbox before it failed (%w: Resume or Remove it)", err, ErrSuspended)
	}
	return fmt.Errorf("%w (whether the sandbox runs could not be told, or its agent was not reached again: Remove it)", err)
}

// frozenDump runs dump, the engine's checkpoint of the sandbox in st,
// with its agent (if any) frozen at a frame boundary, and returns what
// the agent held then (for a copy to adopt, see TakeCheckpoint), where
// it left the sandbox, and the dump's error with what may name its cause
// (dumpError). stops: the dump stops the sandbox, ending the agent's
// stream, and the agent stays detached after it, for Resume to rebind;
// dumped, when it succeeded, even if ctx ended meanwhile (err is then
// ctx's). A dump that stops the sandbox may fail after it stopped it (an
// export whose archive broke off): the engine is asked which. Whenever
// the sandbox runs on after the dump, the agent goes on (goesOn): thawed
// on its stream, or, where a failed dump ended that, on a new one; lost:
// it could not be.
func (s *sandbox) frozenDump(ctx context.Context, st state, what string, stops bool, dump func(context.Context) error) (held frozenState, after afterDump, err error) {
	var main *agent.Client
	if st.agent != nil {
		main = st.agent.main
	}
	var frozen agent.Frozen
	if main != nil {
		if frozen, err = main.Freeze(ctx); err != nil {
			return held, goesOn, err
		}
		if stops {
			if err := main.Detach(); err != nil {
				_ = main.Thaw()
				return held, goesOn, err
			}
		}
		held = frozenState{nextRun: main.NextRun(), processes: s.heldRecords()}
	}
	// The dump's own result, not ctx's: finishDespiteCancel waits for it
	// (and a dump that never returns is no success).
	dumpErr := errors.New("the dump did not return")
	_, err = finishDespiteCancel(ctx, what, func(ctx context.Context) (struct{}, error) {
		dumpErr = dump(ctx)
		return struct{}{}, dumpErr
	})
	if dumpErr != nil && err != nil && !errors.Is(err, dumpErr) { // ctx's: keep the dump's words too
		err = fmt.Errorf("%w (the dump: %w)", err, dumpErr)
	}
	if err != nil {
		err = s.dumpError(err, frozen)
	}
	if stops && dumpErr == nil {
		return held, dumped, err
	}
	if stops {
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		running, known := s.runs(lctx, st.id)
		cancel()
		switch {
		case known && !running:
			return held, stopped, err
		case !known && main == nil: // nothing else can tell
			return held, lost, err
		}
	}
	if main == nil {
		return held, goesOn, err
	}
	goOn := main.Thaw()
	if goOn != nil && stops { // the failed dump ended the stream
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		rw, aerr := s.d.(driver.Checkpointer).AttachRunning(actx, st.id)
		if aerr == nil {
			aerr = main.Rebind(actx, rw)
		}
		goOn = aerr
	}
	switch {
	case goOn == nil:
		return held, goesOn, err
	case err == nil:
		return held, lost, fmt.Errorf("the sandbox's agent did not go on: %w", goOn)
	default:
		return held, lost, fmt.Errorf("%w; and the sandbox's agent did not go on: %w", err, goOn)
	}
}

// runs reports whether the engine says container id runs; known: it
// said (its list holds id, with a state).
func (s *sandbox) runs(ctx context.Context, id string) (running, known bool) {
	list, err := s.d.List(ctx, labelToken+"="+s.token)
	if err != nil {
		return false, false
	}
	for _, c := range list {
		if c.ID == id && c.State != "" {
			return c.State == "running", true
		}
	}
	return false, false
}

// frozenState is what a frozen agent held: the next run's number, and
// the processes held by handle.
type frozenState struct {
	nextRun   uint32
	processes []heldRecord
}

func (s *sandbox) resume(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.container()
	switch {
	case err == nil:
		return nil // not suspended
	case !errors.Is(err, ErrSuspended):
		return err
	}
	c := s.d.(driver.Checkpointer) // Suspend found it
	_, err = finishDespiteCancel(ctx, "resume", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, c.Resume(ctx, st.id)
	})
	if err != nil {
		return fmt.Errorf("vm: resume: %w", err)
	}
	if st.agent != nil {
		rw, err := c.AttachRunning(ctx, st.id)
		if err == nil {
			err = st.agent.main.Rebind(ctx, rw)
		}
		if err != nil {
			return fmt.Errorf("vm: resume: the sandbox runs again, but its agent was not reached (Remove it): %w", err)
		}
	}
	s.setSuspended(false)
	return nil
}
