package vm

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/driver"
)

// A checkpoint saves a running sandbox's processes and memory with CRIU,
// for the sandbox to be suspended and resumed, or restored as fresh ones.
// This file decides, before anything of the caller's changes, whether the
// engine can do it at all.

// checkpointProbeTimeout bounds the probe's dump and its restore. Each
// takes well under a second where CRIU works; where the kernel never
// fires CRIU's breakpoints, a dump never ends.
const checkpointProbeTimeout = 30 * time.Second

// CheckpointSupport reports whether the engine of v can checkpoint its
// sandbox and restore it: nil, or an error matching [ErrNotSupported]
// that names why, found without touching v's sandbox (v may be created or
// not). Nothing but a real dump tells a CRIU that reports a good version
// but cannot dump on this kernel, so the first call for a service and an
// image makes a probe sandbox of v's image with [Config.PodmanExec],
// suspends it (a checkpoint in place), resumes it, runs a command in it
// and removes it: about a second where CRIU works. Its answer is kept for
// the process, unless the service could not be reached or ctx ended.
//
// Refused: rootless Podman (CRIU needs root), a service without CRIU or
// whose CRIU fails here (Podman 4.3 with Debian 12's CRIU 3.17 on Linux
// 6.x), and Kubernetes (the kubelet can checkpoint a container, but
// nothing restores one).
func CheckpointSupport(ctx context.Context, v VM) error {
	s, ok := capability[interface {
		checkpointSupport(context.Context) error
	}](v)
	if !ok {
		return fmt.Errorf("%w: checkpoints: %T cannot checkpoint", ErrNotSupported, v)
	}
	return s.checkpointSupport(ctx)
}

// checkpointProbes holds the probe's answer (error, nil included) for
// each backend, service, image and kind of sandbox, as checkpointKey
// names them: the backends reach CRIU through different paths, and the
// two kinds of sandbox have different mounts for CRIU to restore.
var checkpointProbes sync.Map

type checkpointKey struct {
	backend, service, image string
	podmanExec              bool
}

func (s *sandbox) checkpointSupport(ctx context.Context) error {
	c, ok := s.d.(driver.Checkpointer)
	if !ok {
		_, service := s.d.Local()
		return fmt.Errorf("%w: checkpoints: the engine of %s cannot checkpoint containers", ErrNotSupported, service)
	}
	_, service := s.d.Local()
	key := checkpointKey{fmt.Sprintf("%T", s.d), service, s.cfg.Image, s.cfg.PodmanExec}
	if err, ok := checkpointProbes.Load(key); ok {
		err, _ := err.(error)
		return err
	}
	err := c.CheckpointRefusal(ctx)
	if err == nil {
		err = s.probeCheckpoint(ctx, c)
	}
	if errors.Is(err, ErrUnavailable) || ctx.Err() != nil {
		return err // it may come back, or answer another time
	}
	checkpointProbes.Store(key, err)
	return err
}

// probeCheckpoint suspends and resumes a probe sandbox like s (its image,
// the agent or Podman exec) on s's engine, through c, and removes it. A
// failure of the engine's at that is ErrNotSupported, naming the service
// and the engine's words. On the exec path the resumed probe runs a
// command; through the agent, whose channel ends with the dump (its
// resumption is the checkpoint's own work), the restore's success is the
// answer.
func (s *sandbox) probeCheckpoint(ctx context.Context, c driver.Checkpointer) error {
	_, service := s.d.Local()
	var p sandbox
	p.prepare(Config{Image: s.cfg.Image, PodmanExec: s.cfg.PodmanExec, Pids: s.cfg.Pids, Name: "podvm-criu-probe-" + randomHex()[:12]})
	p.d = unclosed{s.d} // s's: the probe's Remove must not close it
	if err := p.Create(ctx); err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_ = p.Remove(rctx)
		return fmt.Errorf("vm: checkpoints: the probe sandbox: %w", err)
	}
	id := p.state().id
	refuse := func(step string, err error) error {
		return fmt.Errorf("%w: checkpoints: the Podman service %s cannot %s a container: %w", ErrNotSupported, service, step, err)
	}
	err := func() error {
		pctx, cancel := context.WithTimeout(ctx, checkpointProbeTimeout)
		defer cancel()
		err := c.Suspend(pctx, id)
		switch {
		case err != nil && ctx.Err() == nil && pctx.Err() != nil:
			return refuse("checkpoint", fmt.Errorf("the dump did not end within %v. CRIU stops a dumped process with a hardware breakpoint, which never fires in some VMs; CRIU_FAULT=130 in criu's environment makes it use PTRACE_SYSCALL instead. The probe container %s stays locked by the dump until criu is killed on the service's host", checkpointProbeTimeout, p.cfg.Name))
		case err != nil && ctx.Err() == nil:
			return refuse("checkpoint", err)
		case err != nil:
			return err
		}
		if err := c.Resume(pctx, id); err != nil {
			if ctx.Err() != nil {
				return err
			}
			return refuse("restore", err)
		}
		if !p.cfg.PodmanExec {
			return nil
		}
		res, err := p.Run(pctx, exec.Command{Args: []string{"true"}})
		switch {
		case err != nil && ctx.Err() != nil:
			return err
		case err != nil:
			return refuse("restore", fmt.Errorf("the restored probe does not run a command: %w", err))
		case res.ExitCode != 0:
			return refuse("restore", fmt.Errorf("the restored probe ran `true` with exit %d", res.ExitCode))
		}
		return nil
	}()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if rerr := p.Remove(rctx); rerr != nil && err == nil {
		return fmt.Errorf("vm: checkpoints: removing the probe sandbox: %w", rerr)
	}
	return err
}

// unclosed is a driver whose Close does nothing: another sandbox's,
// lent.
type unclosed struct{ driver.Driver }

func (unclosed) Close() {}
