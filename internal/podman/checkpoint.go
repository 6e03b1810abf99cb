package podman

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/libpod"
)

var (
	_ driver.Checkpointer = API{}
	_ driver.Checkpointer = CLI{}

	_ driver.StreamImporter = API{}
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

// createArchive creates path, which must not exist, mode 0600, for a
// checkpoint's export. Failing that (it exists, its directory does not)
// is [driver.ErrInvalidConfig], with the file system's error.
func createArchive(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: checkpoint archive: %w", driver.ErrInvalidConfig, err)
	}
	return f, nil
}

// containerID returns s, what op printed or answered, trimmed, when it
// is a container ID (64 hex digits); else an error matching
// [driver.ErrEngine].
func containerID(op, s string) (string, error) {
	id := strings.TrimSpace(s)
	if _, err := hex.DecodeString(id); err != nil || len(id) != 64 {
		return "", fmt.Errorf("%w: %s gave %q, not a container ID", driver.ErrEngine, op, s)
	}
	return id, nil
}

// Export implements [driver.Checkpointer]: the service's export, streamed
// into path as it arrives.
func (a API) Export(ctx context.Context, id, path string, leaveRunning bool) error {
	const op = "checkpoint export"
	f, err := createArchive(path)
	if err != nil {
		return err
	}
	err = a.c.ContainerExport(ctx, id, leaveRunning, f)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = wrap(nil, op, id, cerr)
	}
	if err != nil {
		os.Remove(path)
		var le *libpod.Error
		if errors.As(err, &le) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return apiError(op, id, err)
		}
		// Writing path failed: no failure of the engine's.
		return wrap(nil, op, id, err)
	}
	return nil
}

// Import implements [driver.Checkpointer]: the archive at path, uploaded
// to the service's import.
func (a API) Import(ctx context.Context, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("%w: checkpoint archive: %w", driver.ErrInvalidConfig, err)
	}
	defer f.Close()
	return a.importFrom(ctx, f, path)
}

// ImportStream implements [driver.StreamImporter]: the archive read
// from r, uploaded to the service's import as it is read.
func (a API) ImportStream(ctx context.Context, r io.Reader) (string, error) {
	return a.importFrom(ctx, r, "a checkpoint archive")
}

// importFrom uploads the archive r, which what names, to the service's
// import.
func (a API) importFrom(ctx context.Context, r io.Reader, what string) (string, error) {
	const op = "checkpoint import"
	id, err := a.c.ContainerImport(ctx, r)
	if err != nil {
		return "", apiError(op, what, err)
	}
	return containerID(op, id)
}

// Export implements [driver.Checkpointer] with `podman container
// checkpoint --export`, which writes path on this machine, the local
// podman as podman-remote (which ignores --compress: the service's export
// is never compressed). path is created first, mode 0600, and podman
// writes into it: neither podman changes the mode of a file that exists.
func (d CLI) Export(ctx context.Context, id, path string, leaveRunning bool) error {
	f, err := createArchive(path)
	if err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return wrap(nil, "container checkpoint", id, err)
	}
	args := []string{"container", "checkpoint", "--export=" + path, "--compress=none"}
	if leaveRunning {
		args = append(args, "--leave-running")
	}
	_, err = d.run(ctx, "container checkpoint", id, exec.Command{Args: append(args, "--tcp-established", "--file-locks", id)})
	if err != nil {
		os.Remove(path)
	}
	return err
}

// Import implements [driver.Checkpointer] with `podman container restore
// --import`, which prints the new container's ID. It never passes
// --name, which Podman refuses with --tcp-established: the archive's
// config.dump names the container.
func (d CLI) Import(ctx context.Context, path string) (string, error) {
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%w: checkpoint archive: %w", driver.ErrInvalidConfig, err)
	}
	res, err := d.run(ctx, "container restore", path, exec.Command{Args: []string{"container", "restore",
		"--import=" + path, "--tcp-established", "--file-locks", "--ignore-static-ip", "--ignore-static-mac"}})
	if err != nil {
		return "", err
	}
	return containerID("podman container restore", res.Stdout)
}
