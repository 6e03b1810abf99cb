package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/libpod"
)

// apiDriver reaches Podman through its REST API (internal/libpod).
type apiDriver struct{ c *libpod.Client }

var _ driver = apiDriver{}

// apiInitEntrypoint makes PID 1 Podman's init in pause mode: it keeps the
// sandbox alive and reaps orphans, and needs nothing from the image.
var apiInitEntrypoint = []string{"/run/podman-init", "-P"}

const (
	// apiPollFirst and apiPollMax bound how often a session whose stream
	// is still open is inspected, to notice a process that has exited
	// while something else (a background child) holds its output open.
	apiPollFirst = 100 * time.Millisecond
	apiPollMax   = time.Second
	// apiStreamGrace is how long a stream may stay open once its process
	// has exited before it is closed: the host executor's grace for its
	// pipes.
	apiStreamGrace = exec.DefaultKillGrace
)

// apiError maps an error of internal/libpod to the vm error it means,
// wrapping both: [ErrUnavailable] when no answer came (the socket is gone,
// the dial failed, the connection dropped, mid-stream included); what
// podmanMessages recognises in libpod's cause and message; [ErrPodman]
// for any other failure. A context's error is not a failure of Podman: it
// is wrapped with no sentinel. what names the object of the call (the
// image, the command, the path); it may be empty.
func apiError(op, what string, err error) error {
	var le *libpod.Error
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		if what != "" {
			op += " " + what
		}
		return fmt.Errorf("vm: %s: %w", op, err)
	case !errors.As(err, &le):
		return classify(op, what, "", err)
	case le.Unreachable():
		if what != "" {
			op += " " + what
		}
		return fmt.Errorf("%w: %s: %w", ErrUnavailable, op, err)
	}
	return classify(op, what, le.Cause+"\n"+le.Message, err)
}

// isNotFound reports a libpod 404: the object is already gone.
func isNotFound(err error) bool {
	var le *libpod.Error
	return errors.As(err, &le) && le.Status == 404
}

func (a apiDriver) ensureImage(ctx context.Context, cfg Config) error {
	ref := cfg.Image
	if cfg.Pull != PullAlways {
		ok, err := a.c.ImageExists(ctx, ref)
		switch {
		case err != nil:
			return apiError("image exists", ref, err)
		case ok:
			return nil
		case cfg.Pull == PullNever && cfg.ImageArchive == "":
			return fmt.Errorf("%w: %s is not present and the pull policy is %q", ErrImageNotFound, ref, PullNever)
		}
	}
	if cfg.ImageArchive != "" {
		return a.loadArchive(ctx, cfg)
	}
	if err := a.c.ImagePull(ctx, ref); err != nil {
		return apiError("pull", ref, err)
	}
	return nil
}

// loadArchive uploads the config's image archive and checks that it held
// the image.
func (a apiDriver) loadArchive(ctx context.Context, cfg Config) error {
	f, err := os.Open(cfg.ImageArchive)
	if err != nil {
		return fmt.Errorf("%w: image archive: %v", ErrInvalidConfig, err)
	}
	defer f.Close()
	if _, err := a.c.ImageLoad(ctx, f); err != nil {
		return apiError("load", cfg.ImageArchive, err)
	}
	ok, err := a.c.ImageExists(ctx, cfg.Image)
	switch {
	case err != nil:
		return apiError("image exists", cfg.Image, err)
	case !ok:
		return fmt.Errorf("%w: %s is not in the image archive %s", ErrImageNotFound, cfg.Image, cfg.ImageArchive)
	}
	return nil
}

func (a apiDriver) create(ctx context.Context, cfg Config, labels map[string]string) (string, error) {
	id, err := a.c.ContainerCreate(ctx, apiSpec(cfg, labels))
	if err == nil {
		err = a.c.ContainerStart(ctx, id)
	}
	if err != nil {
		return id, apiError("create from", cfg.Image, err)
	}
	return id, nil
}

// apiSpec is the container cfg describes.
func apiSpec(c Config, labels map[string]string) *libpod.Spec {
	env := make(map[string]string, len(c.Env))
	for _, e := range c.Env {
		k, val, _ := strings.Cut(e, "=")
		env[k] = val
	}
	noProxy := false // the service's proxy variables stay out
	s := &libpod.Spec{
		Name:               c.Name,
		Image:              c.Image,
		Labels:             labels,
		Init:               true,
		Entrypoint:         apiInitEntrypoint,
		Env:                env,
		WorkDir:            c.Workdir,
		User:               c.User,
		HTTPProxy:          &noProxy,
		NoNewPrivileges:    true,
		CapDrop:            []string{"ALL"},
		CapAdd:             DefaultCapabilities,
		ReadOnlyFilesystem: c.ReadOnlyRootfs,
		ResourceLimits:     &libpod.Resources{Pids: &libpod.PidsLimits{Limit: c.Pids}},
	}
	s.NetNS, s.Networks = netNS(c.Network)
	if c.Memory > 0 {
		s.ResourceLimits.Memory = &libpod.MemoryLimits{Limit: c.Memory, Swap: c.Memory} // swap included
	}
	if c.CPUs > 0 {
		const period = 100000 // µs, as `podman run --cpus` sets it
		s.ResourceLimits.CPU = &libpod.CPULimits{Quota: int64(c.CPUs * period), Period: period}
	}
	if c.ReadOnlyRootfs {
		// What `--read-only --read-only-tmpfs` mounts; Podman 4.3 ignores
		// the spec's read_write_tmpfs.
		for _, dir := range []string{"/tmp", "/var/tmp", "/run"} {
			s.Mounts = append(s.Mounts, libpod.Mount{Destination: dir, Type: "tmpfs", Source: "tmpfs", Options: []string{"rw", "nosuid", "nodev"}})
		}
	}
	for _, m := range c.Mounts {
		opt := "rw"
		if m.ReadOnly {
			opt = "ro"
		}
		s.Mounts = append(s.Mounts, libpod.Mount{Destination: m.Target, Type: "bind", Source: m.Source, Options: []string{"rbind", opt}})
	}
	return s
}

// netNS maps Config.Network to a network namespace, as `podman run
// --network` reads it: a mode, "container:NAME", or the name of a network
// joined in bridge mode.
func netNS(network string) (libpod.Namespace, map[string]struct{}) {
	switch network {
	case "none", "host", "private", "bridge", "slirp4netns", "pasta":
		return libpod.Namespace{Mode: network}, nil
	}
	if ctr, ok := strings.CutPrefix(network, "container:"); ok {
		return libpod.Namespace{Mode: "container", Value: ctr}, nil
	}
	return libpod.Namespace{Mode: "bridge"}, map[string]struct{}{network: {}}
}

// exec runs p in an exec session streamed on a connection of its own:
// its output is demultiplexed into p.Stdout and p.Stderr as it arrives,
// p.Stdin is copied to it, then half-closed. When ctx ends, the stream is
// closed and, on services that can (Podman 4.8 and later), the session
// force-removed.
func (a apiDriver) exec(ctx context.Context, id string, p process) (int, bool, error) {
	name := p.Argv[0]
	execID, err := a.c.ExecCreate(ctx, id, libpod.ExecConfig{
		Cmd:          p.Argv,
		Env:          p.Env,
		WorkingDir:   p.Workdir,
		User:         p.User,
		AttachStdin:  p.Stdin != nil,
		AttachStdout: true,
		AttachStderr: true,
	})
	if err != nil {
		return -1, false, apiError("exec", name, err)
	}
	s, err := a.c.ExecStart(ctx, execID)
	if err != nil { // the service refused to start it, or ctx ended
		return -1, false, apiError("exec", name, err)
	}
	ss := &session{id: execID, s: s, done: make(chan struct{})}
	go func() {
		ss.err = libpod.Demux(s, p.Stdout, p.Stderr)
		close(ss.done)
	}()
	if p.Stdin != nil {
		ss.stdin = true
		go func() {
			io.Copy(s, p.Stdin) // a write error: the process stopped reading
			s.CloseWrite()
		}()
	}
	code, err := a.finish(ctx, ss)
	ss.close()
	if err != nil {
		if ctx.Err() != nil && execID != "" && a.c.CanRemoveExec() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), KillGrace)
			a.c.ExecRemove(rctx, execID, true) // the kill that follows reports what survives
			cancel()
		}
		return -1, true, apiError("exec", name, err)
	}
	return code, true, nil
}

// session is a started exec session whose stream is being demultiplexed.
type session struct {
	id    string
	s     *libpod.ExecStream
	done  chan struct{} // closed when Demux has returned
	err   error         // Demux's error, once done is closed
	stdin bool          // stdin is being copied to the stream
}

// close closes the stream and waits for Demux to return.
func (ss *session) close() {
	ss.s.Close()
	<-ss.done
}

// finish waits for the session's end and returns its exit status: first
// the stream's end, then the session's inspect, until it no longer runs.
// While the stream is open it polls the inspect: when the process has
// exited and the stream is still open apiStreamGrace later, the stream is
// closed (Podman ends a session's stream when its process exits, whatever
// children it left; a stream that outlives it is stuck). A stream that
// fails while stdin is being written to a process that has exited (the
// service resets a connection whose input nobody read) ends like a
// drained one: the output sent before the reset is read first. It
// returns ctx's error when ctx ends first, and an error when the stream
// fails otherwise (the connection was dropped).
func (a apiDriver) finish(ctx context.Context, ss *session) (int, error) {
	every := apiPollFirst
	poll := time.NewTimer(every)
	defer poll.Stop()
	var hang <-chan time.Time
	for drained := false; !drained; {
		select {
		case <-ss.done:
			if ss.err != nil && !(ss.stdin && a.exited(ctx, ss.id)) {
				return -1, ss.err
			}
			drained = true
		case <-hang:
			drained = true // the process is gone; what holds its stream is not waited for
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-poll.C:
			if a.exited(ctx, ss.id) {
				hang = time.After(apiStreamGrace)
				continue
			}
			every = min(2*every, apiPollMax)
			poll.Reset(every)
		}
	}
	for delay := 2 * time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		st, err := a.c.ExecInspect(ctx, ss.id)
		if err != nil {
			return -1, err
		}
		if !st.Running {
			return st.ExitCode, nil
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-time.After(delay):
		}
	}
}

// exited reports that session execID is known to have stopped running.
func (a apiDriver) exited(ctx context.Context, execID string) bool {
	st, err := a.c.ExecInspect(ctx, execID)
	return err == nil && !st.Running
}

// copyIn checks that dir is a directory (PUT would answer a missing one
// with a bare 404, like a missing container), then PUTs the archive.
func (a apiDriver) copyIn(ctx context.Context, id, dir string, r io.Reader) error {
	st, err := a.c.ArchiveStat(ctx, id, dir)
	switch {
	case isNotFound(err):
		// A HEAD answer has no message: a missing container and a
		// missing directory look alike.
		if _, ierr := a.c.ContainerInspect(ctx, id); ierr != nil {
			return apiError("copy into", dir, ierr)
		}
		return fmt.Errorf("vm: copy into %s: %w in the sandbox", dir, fs.ErrNotExist)
	case err != nil:
		return apiError("copy into", dir, err)
	case !st.IsDir:
		return fmt.Errorf("%w: copy into %s: not a directory in the sandbox", ErrPodman, dir)
	}
	if err := a.c.ArchivePut(ctx, id, dir, r); err != nil {
		return apiError("copy into", dir, err)
	}
	return nil
}

func (a apiDriver) copyOut(ctx context.Context, id, path string, w io.Writer) error {
	rc, err := a.c.ArchiveGet(ctx, id, path)
	var le *libpod.Error
	switch {
	case errors.As(err, &le) && le.Status == 404 && recognise(le.Cause+"\n"+le.Message) == nil:
		return fmt.Errorf("vm: copy out %s: %w in the sandbox: %w", path, fs.ErrNotExist, err)
	case err != nil:
		return apiError("copy out", path, err)
	}
	defer rc.Close()
	if _, err := io.Copy(w, rc); err != nil {
		if errors.As(err, &le) {
			return apiError("copy out", path, err)
		}
		return fmt.Errorf("vm: copy out %s: %w", path, err)
	}
	return nil
}

func (a apiDriver) remove(ctx context.Context, id string) error {
	if err := a.c.ContainerRemove(ctx, id); err != nil && !isNotFound(err) {
		return apiError("remove", id, err)
	}
	return nil
}

func (a apiDriver) list(ctx context.Context, label string) ([]container, error) {
	list, err := a.c.ContainerList(ctx, label)
	if err != nil {
		return nil, apiError("container list", "", err)
	}
	found := make([]container, len(list))
	for i, c := range list {
		found[i] = container{ID: c.ID, Labels: c.Labels}
	}
	return found, nil
}

func (a apiDriver) close() { a.c.CloseIdleConnections() }
