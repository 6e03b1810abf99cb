package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/capture"
	"github.com/podvm/podvm/internal/deadline"
	"github.com/podvm/podvm/internal/libpod"
)

// apiInitEntrypoint makes PID 1 Podman's init in pause mode, as
// initEntrypoint does for the CLI: it keeps the sandbox alive and reaps
// orphans, and needs nothing from the image.
var apiInitEntrypoint = []string{"/run/podman-init", "-P"}

const (
	// apiPollFirst and apiPollMax bound how often a session whose stream
	// is still open is inspected, to notice a process that has exited
	// while something else (a background child) holds its output open.
	apiPollFirst = 100 * time.Millisecond
	apiPollMax   = time.Second
	// apiStreamGrace is how long a stream may stay open once its process
	// has exited, or been killed, before it is closed: the host
	// executor's grace for its pipes.
	apiStreamGrace = exec.DefaultKillGrace
	// sniffBytes is how much of stderr is kept, besides the capture, to
	// recognise the service's own failure to start a command.
	sniffBytes = 4 << 10
)

// APIVM is a [VM] that speaks the Podman REST API over the service's
// socket: Create creates and starts a container, Run is an exec session
// streamed on a connection of its own, the copies use the archive
// endpoints and Remove force-removes the container. Create one with
// [NewAPIVM]; it is safe for concurrent use.
type APIVM struct {
	c     *libpod.Client
	cfg   Config // with defaults
	token string // value of labelToken on our container

	st state
	mu sync.Mutex // serializes Create and Remove; guards the fields below
	// created: Create was called; gone: nothing of ours is left.
	created, gone bool
}

var _ VM = (*APIVM)(nil)

// NewAPIVM returns a VM for cfg, not yet created, on the Podman service at
// uri: unix:///path/podman.sock, tcp://host:port or
// ssh://user@host[:port]/path/podman.sock. It validates cfg first and
// fails with an error matching [ErrInvalidConfig], making no connection,
// when cfg is invalid or, for a unix:// service (on this machine), when a
// mount source does not exist. It then connects, pinging the service and
// reading its version; a service that cannot be reached is
// [ErrUnavailable], with an error naming uri.
func NewAPIVM(ctx context.Context, uri string, cfg Config) (*APIVM, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if uri == "" {
		return nil, fmt.Errorf("%w: empty service URI", ErrInvalidConfig)
	}
	if strings.HasPrefix(uri, "unix://") {
		if err := cfg.checkMountSources(); err != nil {
			return nil, err
		}
	}
	c, err := libpod.Connect(ctx, uri)
	if err != nil {
		return nil, apiError("connect", uri, err)
	}
	return newAPIVM(c, cfg), nil
}

// newAPIVM returns a VM for cfg, already validated, on a connected
// client; many VMs may share one client.
func newAPIVM(c *libpod.Client, cfg Config) *APIVM {
	return &APIVM{c: c, cfg: cfg.withDefaults(), token: randomHex()}
}

// ID returns the container's ID once Create succeeded, "" before.
func (v *APIVM) ID() string { return v.st.ID() }

// Create makes the image present as the config's [PullPolicy] says,
// creates the container with every field of the Config, PID 1 being
// Podman's init in pause mode (so any image works, with or without a
// shell), and starts it. It fails with [ErrAlreadyCreated] when called
// twice and [ErrRemoved] after Remove. When a step fails, or ctx ends
// midway, it removes whatever it made (found by a label of its own, never
// by Name) before it returns. Failures match [ErrImageNotFound],
// [ErrNameInUse], [ErrUnavailable] or [ErrPodman].
func (v *APIVM) Create(ctx context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case v.st.isRemoved():
		return ErrRemoved
	case v.created:
		return ErrAlreadyCreated
	}
	v.created = true
	if err := v.ensureImage(ctx); err != nil {
		v.gone = true // nothing was made
		return err
	}
	id, err := v.c.ContainerCreate(ctx, v.spec())
	if err == nil {
		if err = v.c.ContainerStart(ctx, id); err == nil {
			v.st.setID(id)
			return nil
		}
	}
	err = apiError("create from", v.cfg.Image, err)
	// With a context of its own: ctx may be what ended the create.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if rmErr := v.removeMade(cctx, id); rmErr != nil {
		return errors.Join(err, fmt.Errorf("vm: removing what the failed create made: %w", rmErr))
	}
	v.gone = true
	return err
}

// ensureImage applies the pull policy.
func (v *APIVM) ensureImage(ctx context.Context) error {
	ref := v.cfg.Image
	if v.cfg.Pull != PullAlways {
		ok, err := v.c.ImageExists(ctx, ref)
		switch {
		case err != nil:
			return apiError("image exists", ref, err)
		case ok:
			return nil
		case v.cfg.Pull == PullNever && v.cfg.ImageArchive == "":
			return fmt.Errorf("%w: %s is not present and the pull policy is %q", ErrImageNotFound, ref, PullNever)
		}
	}
	if v.cfg.ImageArchive != "" {
		return v.loadArchive(ctx)
	}
	if err := v.c.ImagePull(ctx, ref); err != nil {
		return apiError("pull", ref, err)
	}
	return nil
}

// loadArchive uploads the config's image archive and checks that it held
// the image.
func (v *APIVM) loadArchive(ctx context.Context) error {
	f, err := os.Open(v.cfg.ImageArchive)
	if err != nil {
		return fmt.Errorf("%w: image archive: %v", ErrInvalidConfig, err)
	}
	defer f.Close()
	if _, err := v.c.ImageLoad(ctx, f); err != nil {
		return apiError("load", v.cfg.ImageArchive, err)
	}
	ok, err := v.c.ImageExists(ctx, v.cfg.Image)
	switch {
	case err != nil:
		return apiError("image exists", v.cfg.Image, err)
	case !ok:
		return fmt.Errorf("%w: %s is not in the image archive %s", ErrImageNotFound, v.cfg.Image, v.cfg.ImageArchive)
	}
	return nil
}

// spec is the container the config describes.
func (v *APIVM) spec() *libpod.Spec {
	c := v.cfg
	labels := c.labels()
	labels[labelToken] = v.token
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

// Run runs cmd in an exec session, keeping the [VM.Run] contract. The
// session is streamed on a connection of its own; its output is split
// into stdout and stderr as it arrives, into captures capped at
// cmd.MaxOutput() and the live writers; Stdin is streamed, then
// half-closed. The exit status is read once the stream has been drained
// and the session has stopped running; a stream that stays open after its
// process has exited is closed after a short grace, never waited on
// forever. A non-zero exit is data, 126 and 127 included; when the
// service could not start the command, Run returns a nil Result and an
// error matching [exec.ErrNotFound], [exec.ErrPermission] or
// [exec.ErrDirNotFound] (its message may have reached a live Stderr
// writer); other failures match [ErrNoSuchContainer],
// [ErrContainerNotRunning], [ErrUnavailable] or [ErrPodman]. When the
// timeout or ctx stops the run, a second exec kills, inside the sandbox,
// every process the command started (on Podman 4.8 and later the session
// is then force-removed too), and Run returns the partial Result with
// TimedOut set and an error matching [context.DeadlineExceeded] or
// [context.Canceled].
func (v *APIVM) Run(ctx context.Context, cmd exec.Command) (*exec.Result, error) {
	res, err := v.runCmd(ctx, cmd)
	return v.st.ended(cmd.Name, res, err)
}

// runCmd is Run but for a Remove during the run.
func (v *APIVM) runCmd(ctx context.Context, cmd exec.Command) (*exec.Result, error) {
	if err := cmd.Validate(); err != nil {
		return nil, err
	}
	id, err := v.st.container()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("vm: %s: %w", cmd.Name, err)
	}
	runCtx, cancel := deadline.Start(ctx, cmd.Timeout)
	defer cancel()

	start := time.Now()
	spec := newExecSpec(v.cfg, cmd)
	stdout := capture.NewStream(cmd.MaxOutput(), cmd.Stdout)
	stderr := capture.NewStream(cmd.MaxOutput(), cmd.Stderr)
	sniff := capture.New(sniffBytes)
	ss, err := v.startSession(runCtx, id, libpod.ExecConfig{
		Cmd:          spec.Argv,
		Env:          spec.Env,
		WorkingDir:   spec.Workdir,
		User:         spec.User,
		AttachStdin:  cmd.Stdin != nil,
		AttachStdout: true,
		AttachStderr: true,
	}, cmd.Stdin, stdout, io.MultiWriter(stderr, sniff))
	if err != nil {
		if stopErr := deadline.Err("vm", ctx, runCtx, cmd.Name, cmd.Timeout); stopErr != nil {
			// The start may have been cut after the process began.
			return nil, errors.Join(stopErr, v.kill(ctx, id, "", spec, cmd.Name))
		}
		return nil, apiError("exec", cmd.Name, err)
	}
	code, waitErr := v.finish(runCtx, ss)
	if waitErr != nil {
		// Stopped, or the connection dropped: what runs is killed, the
		// stream gets a moment to deliver what was written before.
		stopErr := deadline.Err("vm", ctx, runCtx, cmd.Name, cmd.Timeout)
		killErr := v.kill(ctx, id, ss.id, spec, cmd.Name)
		ss.closeAfter(apiStreamGrace)
		res := result(stdout, stderr, -1, start)
		if stopErr != nil {
			res.TimedOut = true
			return res, errors.Join(stopErr, killErr)
		}
		return res, errors.Join(apiError("exec", cmd.Name, waitErr), killErr)
	}
	ss.close()
	if err := apiExecFailed(cmd.Name, code, stdout.Total(), sniff.String(), sniff.Total()); err != nil {
		return nil, err
	}
	res := result(stdout, stderr, code, start)
	for _, s := range []struct {
		name string
		err  error
	}{{"stdin", ss.stdinErr()}, {"stdout writer", stdout.LiveErr()}, {"stderr writer", stderr.LiveErr()}} {
		if s.err != nil {
			return res, fmt.Errorf("vm: %s: %s: %w", cmd.Name, s.name, s.err)
		}
	}
	return res, nil
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

// session is a started exec session whose stream is being demultiplexed.
type session struct {
	id    string
	s     *libpod.ExecStream
	done  chan struct{} // closed when Demux has returned
	err   error         // Demux's error, once done is closed
	stdin chan error    // the error reading Stdin, once copied; nil without Stdin
}

// startSession creates and starts an exec session in container cid, then
// demultiplexes its stream into stdout and stderr and copies stdin to it
// (then half-closes it), each in a goroutine of its own.
func (v *APIVM) startSession(ctx context.Context, cid string, ec libpod.ExecConfig, stdin io.Reader, stdout, stderr io.Writer) (*session, error) {
	execID, err := v.c.ExecCreate(ctx, cid, ec)
	if err != nil {
		return nil, err
	}
	s, err := v.c.ExecStart(ctx, execID)
	if err != nil {
		return nil, err
	}
	ss := &session{id: execID, s: s, done: make(chan struct{})}
	go func() {
		ss.err = libpod.Demux(s, stdout, stderr)
		close(ss.done)
	}()
	if stdin != nil {
		ss.stdin = make(chan error, 1)
		go func() {
			in := &errReader{r: stdin}
			io.Copy(s, in)       // a write error: the process stopped reading
			ss.stdin <- in.Err() // before the process can see the end of its input
			s.CloseWrite()
		}()
	}
	return ss, nil
}

// finish waits for the session's end and returns its exit status: first
// the stream's end, then the session's inspect, until it no longer runs.
// While the stream is open it polls the inspect: when the process has
// exited and the stream is still open apiStreamGrace later, the stream is
// closed (Podman itself ends a session's stream when its process exits,
// whatever children it left; a stream that outlives it is stuck). It
// returns ctx's error when ctx ends first, and an error when the stream
// fails (the connection was dropped).
func (v *APIVM) finish(ctx context.Context, ss *session) (int, error) {
	every := apiPollFirst
	poll := time.NewTimer(every)
	defer poll.Stop()
	var hang <-chan time.Time
	for drained := false; !drained; {
		select {
		case <-ss.done:
			if ss.err != nil {
				return -1, ss.err
			}
			drained = true
		case <-hang:
			ss.close() // the process is gone; what holds its stream is not waited for
			drained = true
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-poll.C:
			if st, err := v.c.ExecInspect(ctx, ss.id); err == nil && !st.Running {
				hang = time.After(apiStreamGrace)
				continue
			}
			every = min(2*every, apiPollMax)
			poll.Reset(every)
		}
	}
	for delay := 2 * time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		st, err := v.c.ExecInspect(ctx, ss.id)
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

// close closes the stream and waits for Demux to return.
func (ss *session) close() {
	ss.s.Close()
	<-ss.done
}

// closeAfter lets the stream end by itself for at most d, then closes it.
func (ss *session) closeAfter(d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ss.done:
	case <-t.C:
	}
	ss.close()
}

// stdinErr is the error reading the command's Stdin, if the copy has
// ended. It does not wait: a copy still blocked in Stdin's Read once the
// session is over is left to end with that Read.
func (ss *session) stdinErr() error {
	select {
	case err := <-ss.stdin: // never ready when nil
		return err
	default:
		return nil
	}
}

// kill kills, inside the sandbox, every process of the run that spec
// describes, through a second exec session with a context of its own (the
// run's has ended), tried again while it fails (see [retryKill]). On
// services that have the endpoint, it then force-removes the run's
// session execID, if known.
func (v *APIVM) kill(ctx context.Context, cid, execID string, spec execSpec, name string) error {
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
	defer cancel()
	err := retryKill(kctx, func(ctx context.Context) error {
		err := v.killOnce(ctx, cid, spec)
		if errors.Is(err, ErrUnavailable) {
			cancel() // the service is gone: trying again is pointless
		}
		return err
	})
	if execID != "" && v.c.CanRemoveExec() && !errors.Is(err, ErrUnavailable) {
		if rmErr := v.c.ExecRemove(kctx, execID, true); rmErr != nil && !isNotFound(rmErr) {
			err = errors.Join(err, apiError("exec remove", execID, rmErr))
		}
	}
	if err != nil {
		return fmt.Errorf("vm: %s: killing its processes in the sandbox: %w", name, err)
	}
	return nil
}

// killOnce runs the kill command once, its failures mapped by apiError.
func (v *APIVM) killOnce(ctx context.Context, cid string, spec execSpec) error {
	kill := spec.killSpec()
	errs := capture.New(errCapture)
	ss, err := v.startSession(ctx, cid, libpod.ExecConfig{
		Cmd:          kill.Argv,
		Env:          kill.Env,
		User:         kill.User,
		AttachStdout: true,
		AttachStderr: true,
	}, nil, io.Discard, errs)
	if err != nil {
		return apiError("kill", "", err)
	}
	code, err := v.finish(ctx, ss)
	ss.close()
	switch {
	case err != nil:
		return apiError("kill", "", err)
	case code != 0:
		return fmt.Errorf("%w: the kill command exited %d: %s", ErrPodman, code, errs)
	}
	return nil
}

// isNotFound reports a libpod 404: the object is already gone.
func isNotFound(err error) bool {
	var le *libpod.Error
	return errors.As(err, &le) && le.Status == 404
}

// CopyIn extracts the tar stream r into directory dir of the sandbox
// (PUT .../archive), streaming r through the archive guard: an entry that
// would land outside dir fails the copy with an error matching
// [ErrUnsafeArchive] (entries before it may have been extracted). dir
// must exist and be a directory; it fails with [ErrPodman] otherwise.
func (v *APIVM) CopyIn(ctx context.Context, dir string, r io.Reader) error {
	if err := checkPath("copy into", dir); err != nil {
		return err
	}
	id, err := v.st.container()
	if err != nil {
		return err
	}
	st, err := v.c.ArchiveStat(ctx, id, dir)
	switch {
	case isNotFound(err):
		// A HEAD answer has no message: a missing container and a
		// missing directory look alike.
		if _, ierr := v.c.ContainerInspect(ctx, id); ierr != nil {
			return apiError("copy into", dir, ierr)
		}
		return fmt.Errorf("%w: copy into %s: no such directory in the sandbox", ErrPodman, dir)
	case err != nil:
		return apiError("copy into", dir, err)
	case !st.IsDir:
		return fmt.Errorf("%w: copy into %s: not a directory in the sandbox", ErrPodman, dir)
	}
	in := &errReader{r: guardTar(r)}
	err = v.c.ArchivePut(ctx, id, dir, in)
	switch {
	case in.Err() != nil:
		return fmt.Errorf("vm: copy into %s: %w", dir, in.Err())
	case err != nil:
		return apiError("copy into", dir, err)
	}
	return nil
}

// CopyOut writes path of the sandbox to w as a tar stream (GET
// .../archive), streamed through the archive guard; the archive is never
// held in memory. An entry that would land outside its root fails the
// copy with an error matching [ErrUnsafeArchive]. When CopyOut fails, w
// may have received part of a stream.
func (v *APIVM) CopyOut(ctx context.Context, path string, w io.Writer) error {
	if err := checkPath("copy out", path); err != nil {
		return err
	}
	id, err := v.st.container()
	if err != nil {
		return err
	}
	rc, err := v.c.ArchiveGet(ctx, id, path)
	if err != nil {
		return apiError("copy out", path, err)
	}
	defer rc.Close()
	_, err = io.Copy(w, guardTar(rc))
	if err == nil {
		_, err = io.Copy(io.Discard, rc) // the padding after the trailer
	}
	var le *libpod.Error
	switch {
	case errors.As(err, &le):
		return apiError("copy out", path, err)
	case err != nil:
		return fmt.Errorf("vm: copy out %s: %w", path, err)
	}
	return nil
}

// Remove force-removes the sandbox with no stop timeout, killing whatever
// runs in it. It is idempotent and safe before Create, after a failed or
// cancelled Create, and concurrently with itself; it waits for a Create in
// progress. A container already gone counts as removed. After Remove, Run
// and the copies fail with [ErrRemoved], even when Remove itself failed
// (a later Remove tries again). It closes the idle connections it kept to
// a unix:// or tcp:// service (one never removed lets them go after 30 s
// unused); over ssh:// the bindings keep their SSH connection open.
func (v *APIVM) Remove(ctx context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.st.markRemoved()
	defer v.c.CloseIdleConnections() // nothing else will use them
	if !v.created || v.gone {
		return nil
	}
	if err := v.removeMade(ctx, v.st.ID()); err != nil {
		return err
	}
	v.gone = true
	return nil
}

// removeMade removes our container: id when known, else whatever carries
// our label, which also finds one that a cancelled create left behind.
func (v *APIVM) removeMade(ctx context.Context, id string) error {
	ids := []string{id}
	if id == "" {
		var err error
		if ids, err = v.c.ContainerList(ctx, labelToken+"="+v.token); err != nil {
			return apiError("remove", "", err)
		}
	}
	for _, id := range ids {
		if err := v.c.ContainerRemove(ctx, id); err != nil && !isNotFound(err) {
			return apiError("remove", id, err)
		}
	}
	return nil
}
