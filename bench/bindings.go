package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/containers/podman/v5/pkg/api/handlers"
	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/pkg/bindings/containers"
	"github.com/containers/podman/v5/pkg/specgen"
	dockercontainer "github.com/docker/docker/api/types/container"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/capture"
	"github.com/podvm/podvm/vm"
)

// opTimeout bounds one operation through the bindings, whose calls take
// their deadline from the connection's context.
const opTimeout = 2 * time.Minute

// podmanBindings is what a Go program would otherwise write: Podman's own
// pkg/bindings/containers, one connection made with bindings.NewConnection.
type podmanBindings struct {
	conn   context.Context // carries the connection
	labels map[string]string
}

func connectBindings(ctx context.Context, uri string, labels map[string]string) (*podmanBindings, error) {
	conn, err := bindings.NewConnection(ctx, uri)
	if err != nil {
		return nil, fmt.Errorf("bindings.NewConnection: %w", err)
	}
	return &podmanBindings{conn: conn, labels: labels}, nil
}

// close lets the connection's idle HTTP connections go.
func (b *podmanBindings) close() {
	if c, err := bindings.GetClient(b.conn); err == nil {
		c.Client.CloseIdleConnections()
	}
}

// connectedLifecycle connects to uri, then makes a lifecycle: what
// vm.NewAPIVM does for each sandbox, so that APIVM's row and this one
// both pay for a connection.
func connectedLifecycle(uri string, labels map[string]string, image string) op {
	return func(ctx context.Context) error {
		b, err := connectBindings(ctx, uri, labels)
		if err != nil {
			return err
		}
		defer b.close()
		return b.lifecycle(image)(ctx)
	}
}

// exec runs argv in container id with ExecCreate, ExecStartAndAttach and
// ExecInspect, and returns the exit code ExecInspect reports.
func (b *podmanBindings) exec(ctx context.Context, id string, argv []string, stdout, stderr io.Writer) (int, error) {
	ctx, cancel := b.bounded(ctx)
	defer cancel()
	sid, err := containers.ExecCreate(ctx, id, &handlers.ExecCreateConfig{ExecOptions: dockercontainer.ExecOptions{
		AttachStdout: true,
		AttachStderr: true,
		Cmd:          argv,
	}})
	if err != nil {
		return -1, fmt.Errorf("ExecCreate: %w", err)
	}
	opts := new(containers.ExecStartAndAttachOptions).
		WithOutputStream(stdout).WithAttachOutput(true).
		WithErrorStream(stderr).WithAttachError(true)
	if err := containers.ExecStartAndAttach(ctx, sid, opts); err != nil {
		return -1, fmt.Errorf("ExecStartAndAttach: %w", err)
	}
	insp, err := containers.ExecInspect(ctx, sid, nil)
	if err != nil {
		return -1, fmt.Errorf("ExecInspect: %w", err)
	}
	return insp.ExitCode, nil
}

// bounded is the connection's context, ended by ctx or opTimeout.
func (b *podmanBindings) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	c, cancel := context.WithTimeout(b.conn, opTimeout)
	stop := context.AfterFunc(ctx, cancel)
	return c, func() { stop(); cancel() }
}

func (b *podmanBindings) execRoundTrip(id string) op {
	return func(ctx context.Context) error {
		var stdout, stderr bytes.Buffer
		code, err := b.exec(ctx, id, roundTripArgv, &stdout, &stderr)
		if err != nil {
			return err
		}
		return checkRoundTrip(stdout.String(), stderr.String(), code)
	}
}

// execStream streams n bytes into a capture capped as podvm's is by
// default, so that both sides do the same work with the bytes.
func (b *podmanBindings) execStream(id string, n int64) op {
	return func(ctx context.Context) error {
		var stderr bytes.Buffer
		out := capture.New(exec.DefaultMaxOutputBytes)
		code, err := b.exec(ctx, id, streamArgv(n), out, &stderr)
		switch {
		case err != nil:
			return err
		case code != 0 || out.Total() != n:
			return fmt.Errorf("streamed %d bytes, exit %d, want %d bytes, exit 0: %s", out.Total(), code, n, stderr.String())
		}
		return nil
	}
}

// lifecycle is CreateWithSpec, Start, the exec round trip and Remove,
// with the same sandbox settings as podvm's.
func (b *podmanBindings) lifecycle(image string) op {
	return func(ctx context.Context) error {
		cctx, cancel := b.bounded(ctx)
		defer cancel()
		yes, pids := true, int64(vm.DefaultPids)
		s := specgen.NewSpecGenerator(image, false)
		s.Labels = b.labels
		s.NetNS = specgen.Namespace{NSMode: specgen.NoNetwork}
		s.NoNewPrivileges = &yes
		s.CapDrop = []string{"all"}
		s.CapAdd = vm.DefaultCapabilities
		s.ResourceLimits = &specs.LinuxResources{Pids: &specs.LinuxPids{Limit: pids}}
		no := false
		s.HTTPProxy = &no
		s.Init = &yes
		s.Entrypoint = []string{"/run/podman-init", "-P"}
		created, err := containers.CreateWithSpec(cctx, s, nil)
		if err != nil {
			return fmt.Errorf("CreateWithSpec: %w", err)
		}
		err = containers.Start(cctx, created.ID, nil)
		if err != nil {
			err = fmt.Errorf("Start: %w", err)
		} else {
			err = b.execRoundTrip(created.ID)(ctx)
		}
		rctx, cancel := b.bounded(context.Background())
		defer cancel()
		_, rmErr := containers.Remove(rctx, created.ID, new(containers.RemoveOptions).WithForce(true).WithTimeout(0))
		if rmErr != nil {
			rmErr = fmt.Errorf("Remove: %w", rmErr)
		}
		return errors.Join(err, rmErr)
	}
}
