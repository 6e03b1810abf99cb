package vm

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/podvm/podvm/internal/agent"
	"github.com/podvm/podvm/internal/driver"
)

// labelToken names one sandbox's container before its ID is known, so a
// failed Create, or a Remove after it, finds what Podman made without
// touching a container of the same Name that is not ours.
const labelToken = "io.podvm.token"

// cleanupTimeout bounds the removal after a failed Create, and how long a
// cancelled Create waits for Podman to finish the create it cut short.
const cleanupTimeout = 30 * time.Second

// sandbox is the one implementation of the [VM] contract, over a driver:
// the lifecycle (this file), Run (run.go), how a run is stopped
// (kill.go) and the copies (copy.go).
type sandbox struct {
	d     driver.Driver
	cfg   Config // with defaults
	token string // value of labelToken on our container

	st atomic.Pointer[state] // what Run and the copies see; replaced under mu
	mu sync.Mutex            // serializes Create and Remove; guards the fields below
	// created: Create was called; made: something of ours may be left.
	created, made bool
	chanDir       string      // the agent's channel directory, if one was made
	spec          driver.Spec // cfg as the engine takes it, without the agent: built once

	held // the processes of Start and the forwards of Forward
}

// state is the lifecycle as Run and the copies see it, never modified.
type state struct {
	id        string // "" before Create succeeded
	agent     *link  // nil on the Podman exec path
	removed   bool
	suspended bool // by Suspend, until Resume
}

// init makes s a sandbox for cfg, already validated, on d: [sandbox.prepare]
// then [sandbox.use].
func (s *sandbox) init(d driver.Driver, cfg Config) error {
	s.prepare(cfg)
	return s.use(d)
}

// prepare makes s a sandbox for cfg, already validated, with no driver
// yet: its config with defaults, and its spec, the one mapping of the
// config that every engine's driver takes.
func (s *sandbox) prepare(cfg Config) {
	s.cfg, s.token = cfg.withDefaults(), randomHex()
	s.spec = s.cfg.spec()
}

// use gives s, prepared, its driver. When d's engine runs on this
// machine, a mount source that does not exist is [ErrInvalidConfig], and
// d is closed.
func (s *sandbox) use(d driver.Driver) error {
	if local, _ := d.Local(); local {
		if err := s.cfg.checkMountSources(); err != nil {
			d.Close()
			return err
		}
	}
	s.d = d
	return nil
}

// checkLimits checks spec against what the engine enforces, when its
// driver can tell ([driver.Limiter]), before anything is made: a limit it
// cannot enforce (rootless Podman without the cgroup controller) fails
// with an error matching [ErrNotSupported] that names it.
func (s *sandbox) checkLimits(ctx context.Context, spec driver.Spec) error {
	l, ok := s.d.(driver.Limiter)
	if !ok {
		return nil
	}
	err := l.Limits(ctx, spec)
	if le := (*driver.LimitError)(nil); errors.As(err, &le) && le.Limit == "pids" {
		return fmt.Errorf("vm: create from %s: %w; Config.Pids = vm.NoPidsLimit runs it without one, where a fork bomb need not be contained", s.cfg.Image, err)
	}
	if err != nil {
		return fmt.Errorf("vm: create from %s: %w", s.cfg.Image, err)
	}
	return nil
}

func randomHex() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// state returns the current state.
func (s *sandbox) state() state {
	if p := s.st.Load(); p != nil {
		return *p
	}
	return state{}
}

// container returns the state of a sandbox that can be used, or
// ErrNotCreated / ErrRemoved / ErrSuspended.
func (s *sandbox) container() (state, error) {
	switch st := s.state(); {
	case st.removed:
		return st, ErrRemoved
	case st.id == "":
		return st, ErrNotCreated
	case st.suspended:
		return st, ErrSuspended
	default:
		return st, nil
	}
}

// ID returns the container's ID once Create succeeded, "" before.
func (s *sandbox) ID() string { return s.state().id }

// Create makes the image present as the config's [PullPolicy] says,
// creates the container with every field of the [Config] and starts it.
// It fails with [ErrAlreadyCreated] when called twice and [ErrRemoved]
// after Remove. When a step fails, or ctx ends midway, it removes
// whatever it made (found by a label of its own, never by Name) before it
// returns: a create that ctx cut short is first allowed to finish, for
// up to 30 s, since Podman may complete it after the cut. A limit the
// service cannot enforce (rootless Podman without the cgroup controller:
// cgroup v1, or v2 without delegation) is refused before anything is
// made, with an error matching [ErrNotSupported] that names it; see
// [NoPidsLimit]. Other failures match [ErrImageNotFound], [ErrNameInUse],
// [ErrUnavailable] or [ErrPodman], or wrap ctx's error.
func (s *sandbox) Create(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.state().removed:
		return ErrRemoved
	case s.created:
		return ErrAlreadyCreated
	}
	s.created = true
	if err := s.checkLimits(ctx, s.spec); err != nil {
		return err // nothing was made
	}
	mount, err := s.ensureImages(ctx)
	if err != nil {
		return err // nothing was made
	}
	id, a, err := s.createStarted(ctx, mount)
	switch {
	case err == nil:
		s.made = true
		s.st.Store(&state{id: id, agent: a})
		return nil
	case errors.Is(err, driver.ErrNotReached):
		s.removeChanDir()
		return err // nothing was made
	}
	// With a context of its own: ctx may be what ended the create.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	rmErr := s.removeMade(cctx, id)
	// A container caught mid-start (a start that ctx cut short goes on in
	// the service) may refuse its removal for a moment: try again.
	for rmErr != nil && !errors.Is(rmErr, ErrUnavailable) && sleepCtx(cctx, 100*time.Millisecond) {
		rmErr = s.removeMade(cctx, id)
	}
	switch {
	case rmErr == nil:
	case errors.Is(err, ErrUnavailable) && errors.Is(rmErr, ErrUnavailable):
		// Podman cannot be reached, most likely never was: whatever it
		// may have made carries podvm's labels, for Reap.
	default:
		s.made = true // Remove tries again, the channel directory too
		return errors.Join(err, fmt.Errorf("vm: removing what the failed create made: %w", rmErr))
	}
	s.removeChanDir()
	return err
}

// createStarted creates the container and, with the agent, puts the
// agent in (when it is not bind-mounted), starts the container attached
// and connects to the agent.
func (s *sandbox) createStarted(ctx context.Context, mount *agentMount) (string, *link, error) {
	if mount != nil && mount.hostDir != "" {
		// No channel directory (an unusable temporary directory, say):
		// the agent is reached through its stdio instead.
		mount.chanDir, _ = newChannelDir()
		s.chanDir = mount.chanDir
	}
	id, err := s.createContainer(ctx, mount)
	if err != nil && mount != nil && mount.hostDir != "" && mentionsMount(err, mount) {
		// The service cannot see the caller's disk after all: copy the
		// agent in, now and from now on for this service.
		_, service := s.d.Local()
		agentUnmountable.Store(service, true)
		if rmErr := s.removeMade(ctx, id); rmErr != nil {
			return id, nil, errors.Join(err, rmErr)
		}
		s.removeChanDir()
		if mount, err = newAgentMount(mount.arch, false); err != nil {
			return "", nil, err
		}
		id, err = s.createContainer(ctx, mount)
	}
	if err != nil || mount == nil {
		return id, nil, err
	}
	if mount.hostDir == "" {
		if err := s.d.CopyIn(ctx, id, "/", bytes.NewReader(mount.fs)); err != nil {
			return id, nil, fmt.Errorf("vm: create from %s: putting the agent in: %w", s.cfg.Image, err)
		}
	}
	if mount.chanDir != "" {
		// A socket on this machine: nothing is faster.
		a, err := s.connectAgent(ctx, id, mount.chanDir)
		if err != nil {
			return id, nil, fmt.Errorf("vm: create from %s: %w", s.cfg.Image, err)
		}
		return id, newLink(a, nil, nil), nil
	}
	a, err := s.startAgent(ctx, id)
	if err != nil {
		return id, nil, fmt.Errorf("vm: create from %s: %w", s.cfg.Image, err)
	}
	_, service := s.d.Local()
	l := newLink(a, peerDialer(s.d, id, a), func(err error) {
		if errors.Is(err, errUnreached) {
			unreachable.Store(service, time.Now())
		}
	})
	l.settle(ctx, firstPeerWait)
	return id, l, nil
}

// mentionsMount reports whether a create's error names a directory of
// the caller's that the agent's mounts bring in: the service cannot see
// it.
func mentionsMount(err error, a *agentMount) bool {
	msg := err.Error()
	return strings.Contains(msg, a.hostDir) || a.chanDir != "" && strings.Contains(msg, a.chanDir)
}

// removeChanDir removes the sandbox's channel directory, if any.
func (s *sandbox) removeChanDir() {
	if s.chanDir != "" {
		os.RemoveAll(s.chanDir)
		s.chanDir = ""
	}
}

// ensureImages makes the config's image present and, unless the config
// asks for Podman exec sessions, returns how the agent for its
// architecture gets into the sandbox.
func (s *sandbox) ensureImages(ctx context.Context) (*agentMount, error) {
	arch, err := s.ensureImage(ctx)
	if err != nil || s.cfg.PodmanExec {
		return nil, err
	}
	return newAgentMount(arch, s.agentOverSocket())
}

// agentOverSocket reports whether the agent of a sandbox s makes now is
// mounted from the caller's disk and talks over a unix socket of the
// caller's: on a service of this machine that sees the caller's disk,
// unless the config asks for Checkpointable. Otherwise it is copied in,
// and talks over its stdio.
func (s *sandbox) agentOverSocket() bool {
	local, service := s.d.Local()
	_, unmountable := agentUnmountable.Load(service)
	return local && !unmountable && !s.cfg.Checkpointable
}

// ensureImage makes the config's image present as its Pull and
// ImageArchive say, and returns its architecture.
func (s *sandbox) ensureImage(ctx context.Context) (string, error) {
	c := s.cfg
	if c.Pull != PullAlways {
		arch, err := s.d.Image(ctx, c.Image)
		switch {
		case !errors.Is(err, ErrImageNotFound):
			return arch, err
		case c.Pull == PullNever && c.ImageArchive == "":
			return "", fmt.Errorf("%w: %s is not present and the pull policy is %q", ErrImageNotFound, c.Image, PullNever)
		}
	}
	if err := s.d.Fetch(ctx, c.Image, c.ImageArchive); err != nil {
		return "", err
	}
	arch, err := s.d.Image(ctx, c.Image)
	if errors.Is(err, ErrImageNotFound) && c.ImageArchive != "" {
		return "", fmt.Errorf("%w: %s is not in the image archive %s", ErrImageNotFound, c.Image, c.ImageArchive)
	}
	return arch, err
}

// agentUnmountable holds the services whose containers turned out not to
// see the caller's disk: the agent is copied into their sandboxes.
var agentUnmountable sync.Map

// createContainer runs the driver's create to its end (see finishDespiteCancel),
// and returns the ID of what it made, if anything, and ctx's error when
// ctx ended first.
func (s *sandbox) createContainer(ctx context.Context, agent *agentMount) (string, error) {
	spec := agent.spec(s.spec)
	spec.Labels[labelToken] = s.token
	// Now, not when Create began: pulling the image may have taken minutes.
	spec.Labels[LabelCreated] = strconv.FormatInt(time.Now().Unix(), 10)
	return finishDespiteCancel(ctx, "create from "+s.cfg.Image, func(ctx context.Context) (string, error) {
		return s.d.Create(ctx, spec)
	})
}

// finishDespiteCancel runs f, a change to the service's state, to its end even when
// ctx ends first, for a client that leaves halfway can leave behind what
// no removal finds: Podman completes a create whose client left (a killed
// podman client's service too) after the removal by label has found
// nothing, and Podman 4.3 leaves the conmon and the `runc init` of a
// start cut between the runtime's create and start on the host for good.
// Once ctx has ended, f gets cleanupTimeout more, then its context is
// cancelled. When ctx ended first, finishDespiteCancel returns f's value (an ID to
// remove, say) and ctx's error, saying what was being done.
func finishDespiteCancel[T any](ctx context.Context, what string, f func(context.Context) (T, error)) (T, error) {
	fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	type ended struct {
		v   T
		err error
	}
	done := make(chan ended, 1)
	go func() {
		e := ended{err: fmt.Errorf("vm: %s: the call did not return", what)}
		defer func() { done <- e }() // even when f exits its goroutine early
		e.v, e.err = f(fctx)
	}()
	select {
	case e := <-done:
		return e.v, e.err
	case <-ctx.Done():
	}
	bound := time.NewTimer(cleanupTimeout)
	defer bound.Stop()
	var e ended
	select {
	case e = <-done:
	case <-bound.C:
		cancel()
		e = <-done
	}
	return e.v, fmt.Errorf("vm: %s: %w", what, ctx.Err())
}

// Remove force-removes the sandbox with no stop timeout, killing whatever
// runs in it. It is idempotent and safe before Create, after a failed or
// cancelled Create, and concurrently with itself; it waits for a Create in
// progress. A container already gone counts as removed. After Remove, Run
// and the copies fail with [ErrRemoved], even when Remove itself failed
// (a later Remove tries again).
func (s *sandbox) Remove(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.removeLocked(ctx)
}

// removeLocked is Remove, under s.mu.
func (s *sandbox) removeLocked(ctx context.Context) error {
	st := s.state()
	st.removed = true
	s.st.Store(&st)
	defer s.d.Close() // nothing else will use what it keeps
	// Every process of Start has ended, its handle answering at once,
	// and every forward is closed when Remove returns: the agent's end
	// (the first of these deferred calls to run) ends them at once.
	forwards := s.stopHolding()
	defer s.endProcesses(agent.KillWait)
	defer func() {
		for _, f := range forwards {
			f.Close()
		}
	}()
	if a := st.agent; a != nil {
		// No Run may use it now; closing the agent's stdio also makes it
		// kill everything and exit, whatever the removal does.
		defer a.close()
	}
	if !s.made {
		s.removeChanDir()
		return nil
	}
	err := s.removeMade(ctx, st.id)
	s.made = err != nil
	if err == nil {
		s.removeChanDir()
	}
	return err
}

// removeMade removes our container: id when known, else whatever carries
// our label, which also finds one that a failed create left behind.
func (s *sandbox) removeMade(ctx context.Context, id string) error {
	if id != "" {
		return s.d.Remove(ctx, id)
	}
	made, err := s.d.List(ctx, labelToken+"="+s.token)
	if err != nil {
		return err
	}
	for _, c := range made {
		if err := s.d.Remove(ctx, c.ID); err != nil {
			return err
		}
	}
	return nil
}
