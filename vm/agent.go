package vm

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
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
// sandbox as an image of its own, imported once per Podman and mounted
// read-only at agentDir: no bind mount of the caller's disk, so it works
// with remote services, read-only root filesystems, any user and images
// without a shell.

const (
	// agentDir is where the agent image is mounted in every sandbox.
	agentDir = "/.podvm"
	// agentPath is the agent binary, the sandbox's PID 1.
	agentPath = agentDir + "/podvm-agent"
)

// agentImage names the image holding the agent for arch: its content
// digest is in the tag, so a changed agent is a new image.
func agentImage(arch string) (string, error) {
	d, err := agent.Digest(arch)
	if err != nil {
		return "", fmt.Errorf("%w: the image's architecture %q has no podvm agent (set Config.PodmanExec to run commands as Podman exec sessions): %v",
			ErrNotSupported, arch, err)
	}
	return "localhost/podvm-agent:" + strings.TrimPrefix(d, "sha256:")[:16] + "-" + arch, nil
}

var agentTars sync.Map // arch → []byte

// agentTar is the filesystem of the agent image for arch: the agent
// binary alone, owned by root, mode 0755.
func agentTar(arch string) ([]byte, error) {
	if b, ok := agentTars.Load(arch); ok {
		return b.([]byte), nil
	}
	bin, err := agent.Binary(arch)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	h := &tar.Header{Name: "podvm-agent", Mode: 0o755, Size: int64(len(bin)), Typeflag: tar.TypeReg, ModTime: time.Unix(0, 0)}
	if err := tw.WriteHeader(h); err != nil {
		return nil, err
	}
	tw.Write(bin)
	tw.Close()
	agentTars.Store(arch, b.Bytes())
	return b.Bytes(), nil
}

// startAgent attaches to created container id's stdio, starts it, and
// reads the agent's handshake.
func (s *sandbox) startAgent(ctx context.Context, id string) (*agent.Client, error) {
	rw, err := s.d.attach(ctx, id)
	if err != nil {
		return nil, err
	}
	type hello struct {
		c   *agent.Client
		err error
	}
	done := make(chan hello, 1)
	go func() {
		c, err := agent.NewClient(rw)
		done <- hello{c, err}
	}()
	select {
	case h := <-done:
		if h.err != nil {
			return nil, fmt.Errorf("%w: the sandbox's agent did not answer: %w", ErrPodman, h.err)
		}
		return h.c, nil
	case <-ctx.Done():
		rw.Close() // NewClient returns
		<-done
		return nil, fmt.Errorf("vm: starting the agent: %w", ctx.Err())
	}
}

// runAgent is run on the agent's path: the same contract, and bytes
// carried exactly, argv and env included.
func (s *sandbox) runAgent(ctx context.Context, c *agent.Client, cmd exec.Command) (*exec.Result, error) {
	runCtx, cancel := deadline.Start(ctx, cmd.Timeout)
	defer cancel()
	start := time.Now()
	dir := cmd.Dir
	if dir == "" {
		dir = s.cfg.Workdir
	}
	stdout := capture.NewStream(cmd.MaxOutput(), cmd.Stdout)
	stderr := capture.NewStream(cmd.MaxOutput(), cmd.Stderr)
	req := agent.Request{Argv: append([]string{cmd.Name}, cmd.Args...), Env: exec.MergeEnv(nil, cmd.Env), Dir: dir, User: s.cfg.User}
	ex, err := c.Run(runCtx, req, cmd.Stdin, stdout, stderr)
	if stop := deadline.Err("vm", ctx, runCtx, cmd.Name, cmd.Timeout); stop != nil {
		res := result(stdout, stderr, -1, start)
		res.TimedOut = true
		res.Usage = &ex.Usage
		return res, errors.Join(stop, agentError(cmd.Name, unwrapCtx(err)))
	}
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, exec.ErrPermission), errors.Is(err, exec.ErrDirNotFound):
		return nil, fmt.Errorf("vm: %s: %w", cmd.Name, err)
	case errors.Is(err, agent.ErrUnknownUser):
		return nil, fmt.Errorf("%w: %s: %w", ErrPodman, cmd.Name, err)
	case errors.Is(err, agent.ErrChannelClosed):
		return nil, s.channelClosed(ctx, cmd.Name, err)
	case ex.Code < 0:
		return nil, agentError(cmd.Name, err)
	}
	res := result(stdout, stderr, ex.Code, start)
	res.Usage = &ex.Usage
	return res, agentError(cmd.Name, err) // a failed stdin or writer, or processes not killed
}

// channelClosed says why the channel to the agent closed: the container
// was removed ([ErrNoSuchContainer]) or stopped ([ErrContainerNotRunning])
// behind the VM's back, else it is [ErrUnavailable]. Either way the
// sandbox can run no more commands.
func (s *sandbox) channelClosed(ctx context.Context, name string, err error) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DefaultPingTimeout)
	defer cancel()
	list, lerr := s.d.list(cctx, labelToken+"="+s.token)
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
