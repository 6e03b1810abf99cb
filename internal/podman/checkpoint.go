package podman

import (
	"context"
	"fmt"
	"io"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/driver"
)

var (
	_ driver.Checkpointer = API{}
	_ driver.Checkpointer = CLI{}
)

// checkpointRefusal implements [driver.Checkpointer.CheckpointRefusal]
// for d, which asks its service what it is with info.
func checkpointRefusal(ctx context.Context, d driver.Driver, info func(context.Context) (Host, error)) error {
	h, err := info(ctx)
	if err != nil {
		return err
	}
	_, service := d.Local()
	if h.Rootless {
		// Podman's CLI says it as "checkpointing a container requires
		// root"; its service tries, and CRIU fails.
		return fmt.Errorf("%w: checkpoints: the Podman service %s is rootless, and CRIU needs root", driver.ErrNotSupported, service)
	}
	return nil
}

// CheckpointRefusal implements [driver.Checkpointer].
func (a API) CheckpointRefusal(ctx context.Context) error { return checkpointRefusal(ctx, a, a.info) }

// Suspend implements [driver.Checkpointer].
func (a API) Suspend(ctx context.Context, id string) error {
	if err := a.c.ContainerCheckpoint(ctx, id); err != nil {
		return apiError("checkpoint", id, err)
	}
	return nil
}

// Resume implements [driver.Checkpointer].
func (a API) Resume(ctx context.Context, id string) error {
	if err := a.c.ContainerRestore(ctx, id); err != nil {
		return apiError("restore", id, err)
	}
	return nil
}

// CheckpointRefusal implements [driver.Checkpointer].
func (d CLI) CheckpointRefusal(ctx context.Context) error { return checkpointRefusal(ctx, d, d.info) }

// Suspend implements [driver.Checkpointer].
func (d CLI) Suspend(ctx context.Context, id string) error {
	_, err := d.run(ctx, "container checkpoint", id, exec.Command{Args: []string{"container", "checkpoint", "--tcp-established", "--file-locks", id}})
	return err
}

// Resume implements [driver.Checkpointer].
func (d CLI) Resume(ctx context.Context, id string) error {
	_, err := d.run(ctx, "container restore", id, exec.Command{Args: []string{"container", "restore", "--tcp-established", "--file-locks", id}})
	return err
}

// AttachRunning implements [driver.Checkpointer].
func (a API) AttachRunning(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	return a.attach(ctx, id, false)
}

// AttachRunning implements [driver.Checkpointer]: `podman attach`, which
// attaches stdin too; its signals are not the container's.
func (d CLI) AttachRunning(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	return d.attach(ctx, "attach", id, "attach", "--sig-proxy=false", id)
}
