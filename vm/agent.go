package vm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/agent"
	"github.com/podvm/podvm/internal/capture"
	"github.com/podvm/podvm/internal/deadline"
)

// This file is how a Run travels by default: to podvm's agent, PID 1 of
// the sandbox, as a message on the stream Create opened to it (the
// container's stdio, attached through the service or a `podman start
// -ai`), not as a Podman exec session. The agent runs each command under
// a per-run subreaper, so every process the command starts is tracked and
// killed however it detaches, and reports the run's usage. It reaches the
// sandbox at agent.Dir: bind-mounted read-only from the caller's cache
// when Podman runs on this machine, else copied into the created
// container before it starts (a remote service). Either way it works
// with read-only root filesystems, any user and images without a shell.

// agentMount is how the agent gets into a sandbox: bind-mounted
// read-only from hostDir, a directory of the caller's cache, when the
// containers run on this machine; else copied into the created container
// as the tar stream fs (a remote service, which the caller's disk cannot
// reach). With hostDir, chanDir is the sandbox's channel directory
// (channel.go), when one could be made: the agent then serves its socket
// there instead of its stdio.
type agentMount struct {
	arch    string
	hostDir string
	chanDir string
	fs      []byte
}

// newAgentMount prepares the agent for arch, locally or not.
func newAgentMount(arch string, local bool) (*agentMount, error) {
	if !slices.Contains(agent.Arches, arch) {
		return nil, fmt.Errorf("%w: the image's architecture %q has no podvm agent (the module carries %v; set Config.PodmanExec to run commands as Podman exec sessions)",
			ErrNotSupported, arch, agent.Arches)
	}
	if local {
		if dir, err := agent.HostDir(arch); err == nil {
			return &agentMount{arch: arch, hostDir: dir}, nil
		}
		// No cache directory to write: copy it in, as for a remote service.
	}
	fs, err := agent.Tar(arch)
	if err != nil {
		return nil, err
	}
	return &agentMount{arch: arch, fs: fs}, nil
}

// startAgent attaches to created container id's stdio, starts it, and
// reads the agent's handshake.
func (s *sandbox) startAgent(ctx context.Context, id string) (*agent.Client, error) {
	rw, err := s.d.Attach(ctx, id)
	if err != nil {
		return nil, err
	}
	return s.handshake(ctx, rw)
}

// handshake reads the agent's handshake on the channel rw, within
// agentHello, and returns a client that owns rw.
func (s *sandbox) handshake(ctx context.Context, rw io.ReadWriteCloser) (*agent.Client, error) {
	type hello struct {
		c   *agent.Client
		err error
	}
	done := make(chan hello, 1)
	go func() {
		c, err := agent.NewClient(rw)
		done <- hello{c, err}
	}()
	bound := time.NewTimer(agentHello)
	defer bound.Stop()
	var why error
	select {
	case h := <-done:
		switch {
		case h.err == nil:
			return h.c, nil
		case errors.Is(h.err, ErrUnavailable), errors.Is(h.err, ErrNoSuchContainer), errors.Is(h.err, ErrContainerNotRunning):
			return nil, fmt.Errorf("vm: the sandbox's agent did not answer: %w", h.err)
		}
		return nil, fmt.Errorf("%w: the sandbox's agent did not answer: %w", ErrPodman, h.err)
	case <-ctx.Done():
		why = fmt.Errorf("vm: starting the agent: %w", ctx.Err())
		// The agent's hello says the start behind rw is done: closing rw
		// before it may cut a podman client between the runtime's create
		// and start (see finishDespiteCancel).
		select {
		case h := <-done:
			if h.c != nil {
				h.c.Close()
			} else {
				rw.Close()
			}
			return nil, why
		case <-bound.C:
		}
	case <-bound.C:
		why = fmt.Errorf("%w: the sandbox's agent did not answer within %v", ErrPodman, agentHello)
	}
	rw.Close() // NewClient returns
	<-done
	return nil, why
}

// peerBreakWait bounds how long a call whose peer broke waits for the
// first channel's end, which says the sandbox died, before it says the
// sandbox runs on.
const peerBreakWait = 2 * time.Second

// agentHello bounds the wait for the agent's handshake once the
// container was started.
const agentHello = 30 * time.Second

// runAgent is run on the agent's path: the same contract, and bytes
// carried exactly, argv and env included.
func (s *sandbox) runAgent(ctx context.Context, l *link, cmd exec.Command) (*exec.Result, error) {
	c, done := l.take()
	defer done()
	runCtx, cancel := deadline.Start(ctx, cmd.Timeout)
	defer cancel()
	start := time.Now()
	stdout := capture.NewStream(cmd.MaxOutput(), cmd.Stdout)
	stderr := capture.NewStream(cmd.MaxOutput(), cmd.Stderr)
	ex, err := c.Run(runCtx, s.agentRequest(cmd), cmd.Stdin, stdout, stderr)
	var usage *exec.Usage
	if ex.Reported {
		usage = &ex.Usage
	}
	if stop := deadline.Err("vm", ctx, runCtx, cmd.Name, cmd.Timeout); stop != nil {
		res := result(stdout, stderr, -1, start)
		res.TimedOut, res.Usage = true, usage
		return res, errors.Join(stop, agentError(cmd.Name, unwrapCtx(err)))
	}
	switch {
	case errors.Is(err, agent.ErrChannelClosed) && ex.Started && stdout.Total()+stderr.Total() > 0:
		// What arrived before the channel closed is kept.
		return result(stdout, stderr, -1, start), s.channelClosed(ctx, cmd.Name, err)
	case ex.Code < 0:
		return nil, s.agentStartError(ctx, cmd.Name, err)
	}
	res := result(stdout, stderr, ex.Code, start)
	res.Usage = usage
	if err != nil {
		return res, agentError(cmd.Name, err) // a failed stdin, or processes not killed
	}
	return res, streamErr(cmd.Name, nil, stdout, stderr)
}

// agentRequest is cmd as the agent takes it. The agent runs as the
// container's user (Config.User, else the image's), and so does every
// command: one uid for the whole run.
func (s *sandbox) agentRequest(cmd exec.Command) agent.Request {
	return agent.Request{Argv: append([]string{cmd.Name}, cmd.Args...), Env: exec.MergeEnv(nil, cmd.Env), Dir: cmp.Or(cmd.Dir, s.cfg.Workdir)}
}

// agentStartError maps the error of a run that never reported an exit
// status: a start failure, a channel that closed, or a kill that never
// was confirmed.
func (s *sandbox) agentStartError(ctx context.Context, name string, err error) error {
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, exec.ErrPermission), errors.Is(err, exec.ErrDirNotFound), errors.Is(err, exec.ErrInvalidCommand):
		return fmt.Errorf("vm: %s: %w", name, err)
	case errors.Is(err, agent.ErrUnknownUser):
		return fmt.Errorf("%w: %s: %w", ErrPodman, name, err)
	case errors.Is(err, agent.ErrChannelClosed):
		return s.channelClosed(ctx, name, err)
	}
	return agentError(name, err)
}

// channelClosed says why the channel to the agent closed: a peer's
// connection broke ([ErrUnavailable], and the sandbox runs on), or the
// container was removed ([ErrNoSuchContainer]) or stopped
// ([ErrContainerNotRunning]) behind the VM's back, else it is
// [ErrUnavailable]. In those the sandbox can run no more commands.
func (s *sandbox) channelClosed(ctx context.Context, name string, err error) error {
	if l := s.state().agent; l != nil {
		// A peer's connection broke (link.go). A sandbox that died ends
		// its peers at once and its first channel a moment later (on
		// Kubernetes, once the kubelet and the API server saw it): wait
		// for that a while before saying the sandbox runs on.
		t := time.NewTimer(peerBreakWait)
		defer t.Stop()
		select {
		case <-l.dead():
		case <-t.C:
			return fmt.Errorf("%w: %s: the connection to the sandbox's agent over its network broke (the sandbox runs on): %w", ErrUnavailable, name, err)
		}
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultPingTimeout)
	defer cancel()
	list, lerr := s.d.List(cctx, labelToken+"="+s.token)
	switch {
	case lerr != nil:
	case len(list) == 0:
		return fmt.Errorf("%w: %s: the sandbox's container is gone: %w", ErrNoSuchContainer, name, err)
	default:
		return fmt.Errorf("%w: %s: the sandbox's agent has stopped: %w", ErrContainerNotRunning, name, err)
	}
	return agentError(name, err)
}

// agentError maps the agent client's errors: a lost channel is
// [ErrUnavailable] (the sandbox can run nothing more), processes the agent
// could not confirm dead are a kill failure.
func agentError(name string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, agent.ErrChannelClosed):
		return fmt.Errorf("%w: %s: the channel to the sandbox's agent is closed; the sandbox can run no more commands: %w", ErrUnavailable, name, err)
	case errors.Is(err, agent.ErrNotKilled), errors.Is(err, agent.ErrLost):
		return fmt.Errorf("vm: %s: killing its processes in the sandbox: %w", name, err)
	}
	return fmt.Errorf("vm: %s: %w", name, err)
}

// unwrapCtx drops a context's own error from err, already said by the
// stop error: what is left is what else went wrong.
func unwrapCtx(err error) error {
	if err == nil || err == context.Canceled || err == context.DeadlineExceeded {
		return nil
	}
	if u, ok := err.(interface{ Unwrap() []error }); ok {
		var rest []error
		for _, e := range u.Unwrap() {
			if e != context.Canceled && e != context.DeadlineExceeded {
				rest = append(rest, e)
			}
		}
		return errors.Join(rest...)
	}
	return err
}
