package podman

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/libpod"
)

// API is the [driver.Driver] that reaches Podman through its REST API
// (internal/libpod).
type API struct{ c *libpod.Client }

var _ driver.Driver = API{}

// NewAPI returns the driver that talks to the service c is connected to.
func NewAPI(c *libpod.Client) API { return API{c} }

// execRemoveTimeout bounds the removal of an exec session whose run
// stopped; the kill that follows (vm.KillGrace, the same 5 s) reports
// what survives.
const execRemoveTimeout = 5 * time.Second

// apiError maps an error of internal/libpod to the error it means,
// wrapping both: [driver.ErrUnavailable] when no answer came (mid-stream
// included), else what podmanMessages recognises in libpod's cause and
// message, else [driver.ErrEngine]. A context's error gets no sentinel.
func apiError(op, what string, err error) error {
	var le *libpod.Error
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return wrap(nil, op, what, err)
	case !errors.As(err, &le):
		return classify(op, what, "", err)
	case le.Unreachable():
		return wrap(driver.ErrUnavailable, op, what, err)
	}
	return classify(op, what, le.Cause+"\n"+le.Message, err)
}

// isNotFound reports a libpod 404: the object is already gone.
func isNotFound(err error) bool {
	var le *libpod.Error
	return errors.As(err, &le) && le.Status == 404
}

// Image implements [driver.Driver.Image].
func (a API) Image(ctx context.Context, ref string) (string, error) {
	return again(ctx, imageVanished, func() (string, error) {
		img, err := a.c.ImageInspect(ctx, ref)
		if err != nil {
			return "", apiError("image inspect", ref, err)
		}
		return img.Architecture, nil
	})
}

// Local implements [driver.Driver.Local]: a unix:// service is local.
func (a API) Local() (bool, string) { return IsLocal(a.c.URI()), a.c.URI() }

// Fetch implements [driver.Driver.Fetch], uploading the archive.
func (a API) Fetch(ctx context.Context, image, archive string) error {
	if archive == "" {
		if err := a.c.ImagePull(ctx, image); err != nil {
			return apiError("pull", image, err)
		}
		return nil
	}
	f, err := os.Open(archive)
	if err != nil {
		return fmt.Errorf("%w: image archive: %v", driver.ErrInvalidConfig, err)
	}
	defer f.Close()
	if _, err := a.c.ImageLoad(ctx, f); err != nil {
		return apiError("load", archive, err)
	}
	return nil
}

// Create implements [driver.Driver.Create] with one create request, and a start.
func (a API) Create(ctx context.Context, c driver.Spec) (string, error) {
	_, service := a.Local()
	id, err := a.create(ctx, asked(service, c))
	return id, forget(service, err) // asked again what it enforces, once back
}

// create is Create but for what the service is known to enforce, of a
// spec as [asked] returns it.
func (a API) create(ctx context.Context, c driver.Spec) (string, error) {
	env := make(map[string]string, len(c.Env))
	for _, e := range c.Env {
		k, val, _ := strings.Cut(e, "=")
		env[k] = val
	}
	noProxy := false // the service's proxy variables stay out
	s := &libpod.Spec{
		Name:               c.Name,
		Image:              c.Image,
		Labels:             c.Labels,
		Init:               true,
		Entrypoint:         initEntrypoint,
		Env:                env,
		WorkDir:            c.Workdir,
		User:               c.User,
		HTTPProxy:          &noProxy,
		NoNewPrivileges:    true,
		CapDrop:            []string{"ALL"},
		CapAdd:             c.Capabilities,
		ReadOnlyFilesystem: c.ReadOnlyRootfs,
		ResourceLimits:     &libpod.Resources{},
	}
	if c.Pids != 0 {
		s.ResourceLimits.Pids = &libpod.PidsLimits{Limit: c.Pids}
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
	if c.Agent != "" {
		s.Init, s.Entrypoint, s.Stdin = false, append([]string{c.Agent}, c.AgentArgs...), true
		s.LogConfiguration = &libpod.LogConfig{Driver: "none"}
	}
	id, err := a.c.ContainerCreate(ctx, s)
	if err == nil && c.Agent == "" {
		err = a.c.ContainerStart(ctx, id)
	}
	if err != nil {
		return id, apiError("create from", c.Image, err)
	}
	return id, nil
}

// netNS maps driver.Spec.Network to a network namespace, as `podman run
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

// Exec runs p in an exec session streamed on a connection of its own
// (see [libpod.Client.Exec]). When ctx ends, p.Stop (when set) kills
// the command and the stream is drained, a second at most, then closed
// and, on services that can (Podman 4.8 and later), the session
// force-removed.
func (a API) Exec(ctx context.Context, id string, p driver.Process) (int, bool, error) {
	return execWatched(p, func(p driver.Process) (int, bool, error) { return a.exec(ctx, id, p) })
}

// exec is Exec but for telling Podman's failure to start the command.
func (a API) exec(ctx context.Context, id string, p driver.Process) (int, bool, error) {
	code, execID, err := a.c.Exec(ctx, id, libpod.ExecConfig{
		Cmd:          p.Argv,
		Env:          p.Env,
		WorkingDir:   p.Workdir,
		User:         p.User,
		AttachStdin:  p.Stdin != nil,
		AttachStdout: true,
		AttachStderr: true,
	}, p.Stdin, p.Stdout, p.Stderr, exec.DefaultKillGrace, p.Stop) // the host executor's grace for its pipes
	if err != nil {
		if ctx.Err() != nil && execID != "" && a.c.CanRemoveExec() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), execRemoveTimeout)
			a.c.ExecRemove(rctx, execID, true)
			cancel()
		}
		return -1, execID != "", apiError("exec", p.Argv[0], err)
	}
	return code, true, nil
}

// CopyIn checks that dir is a directory (PUT would create a missing
// one), then PUTs the archive. The check's path is a pattern
// ([globLiteral]); PUT's is taken as it is.
func (a API) CopyIn(ctx context.Context, id, dir string, r io.Reader) error {
	st, err := a.c.ArchiveStat(ctx, id, globLiteral(dir, false))
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
		return fmt.Errorf("%w: copy into %s: not a directory in the sandbox", driver.ErrEngine, dir)
	}
	if err := a.c.ArchivePut(ctx, id, dir, r); err != nil {
		return apiError("copy into", dir, err)
	}
	return nil
}

// CopyOut implements [driver.Driver.CopyOut], asking for path as a pattern
// that matches it alone ([globLiteral]).
func (a API) CopyOut(ctx context.Context, id, path string, w io.Writer) error {
	rc, err := a.c.ArchiveGet(ctx, id, globLiteral(path, false))
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
		return wrap(nil, "copy out", path, err)
	}
	return nil
}

// Remove implements [driver.Driver.Remove].
func (a API) Remove(ctx context.Context, id string) error {
	return removeAgain(ctx, func() error {
		if err := a.c.ContainerRemove(ctx, id); err != nil && !isNotFound(err) {
			return apiError("remove", id, err)
		}
		return nil
	})
}

// List implements [driver.Driver.List].
func (a API) List(ctx context.Context, label string) ([]driver.Container, error) {
	list, err := a.c.ContainerList(ctx, label)
	if err != nil {
		return nil, apiError("container list", "", err)
	}
	out := make([]driver.Container, len(list))
	for i, l := range list {
		out[i] = driver.Container{ID: l.ID, Labels: l.Labels, State: l.State}
	}
	return out, nil
}

// Close closes the idle connections kept to a unix:// or tcp://
// service.
func (a API) Close() { a.c.CloseIdleConnections() }

// Attach implements [driver.Driver.Attach] with an attach request, then a
// start; the container's stderr is dropped.
func (a API) Attach(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	return a.attach(ctx, id, true)
}

// attach attaches to container id's stdio, then starts it if start.
func (a API) attach(ctx context.Context, id string, start bool) (io.ReadWriteCloser, error) {
	s, err := a.c.ContainerAttach(ctx, id)
	if err != nil {
		return nil, apiError("attach", id, err)
	}
	if start {
		if err := a.c.ContainerStart(ctx, id); err != nil {
			s.Close()
			return nil, apiError("start", id, err)
		}
	}
	pr, pw := io.Pipe()
	go func() {
		// The agent's stderr carries only its own complaints.
		pw.CloseWithError(libpod.Demux(s, pw, io.Discard))
	}()
	return &attached{Reader: pr, Writer: s, close: func() error {
		pr.Close()
		return s.Close()
	}}, nil
}

// Start implements [driver.Driver.Start].
func (a API) Start(ctx context.Context, id string) error {
	if err := a.c.ContainerStart(ctx, id); err != nil {
		return apiError("start", id, err)
	}
	return nil
}

// attached is a container's stdio stream: the container's stdout to
// read, its stdin to write.
type attached struct {
	io.Reader
	io.Writer
	close func() error
	once  sync.Once
}

func (a *attached) Close() error {
	var err error
	a.once.Do(func() { err = a.close() })
	return err
}
