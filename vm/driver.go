package vm

import (
	"context"
	"io"

	"github.com/podvm/podvm/internal/libpod"
)

// driver is what differs between reaching Podman through its REST API
// and through the podman command; the [sandbox] keeps the whole [VM]
// contract over it, once. Every method is bounded by its ctx. Errors
// match the sentinel Podman's answer means (podman_errors.go), or
// [ErrUnavailable] when Podman could not be reached, and wrap the native
// error ([*APIError], [*CLIError]); a context's error is wrapped as is.
type driver interface {
	// image returns the architecture (a GOARCH) of image ref, or an
	// error matching [ErrImageNotFound] when it is not present.
	image(ctx context.Context, ref string) (arch string, err error)
	// fetch makes cfg.Image present: it loads cfg.ImageArchive when set,
	// else pulls cfg.Image.
	fetch(ctx context.Context, cfg Config) error
	// local reports whether the containers run on this machine, where a
	// bind mount reaches the caller's files, and names the service (a
	// unix socket can still lead to another filesystem).
	local() (bool, string)
	// create creates a container for cfg carrying labels and returns its
	// ID. With agent nil it also starts it, PID 1 being Podman's init.
	// Otherwise PID 1 is the agent (as the container's user, stdin open,
	// stdio not logged), bind-mounted from agent.hostDir when set, and the
	// container is left created. When it fails, something may have been
	// made: the caller removes it by label.
	create(ctx context.Context, cfg Config, labels map[string]string, agent *agentMount) (string, error)
	// attach attaches to the stdio of created container id, then starts
	// it: reading the stream yields its stdout, writing feeds its stdin.
	// Closing it detaches.
	attach(ctx context.Context, id string) (io.ReadWriteCloser, error)
	// exec runs p in container id as a Podman exec session and returns
	// its exit status once the output is drained and the session ended.
	// started reports that the session began (the command may have run).
	// When ctx ends first it returns promptly, leaving what runs to the
	// caller's kill.
	exec(ctx context.Context, id string, p process) (code int, started bool, err error)
	// copyIn extracts the tar stream r into directory dir of container id.
	copyIn(ctx context.Context, id, dir string, r io.Reader) error
	// copyOut writes path of container id to w as a tar stream.
	copyOut(ctx context.Context, id, path string, w io.Writer) error
	// remove force-removes container id; one already gone is no error.
	remove(ctx context.Context, id string) error
	// list returns the containers carrying label ("key=value").
	list(ctx context.Context, label string) ([]container, error)
	// close releases what the driver keeps open between calls.
	close()
}

// initEntrypoint makes PID 1 Podman's init (catatonit) in pause mode: it
// keeps the sandbox alive and reaps orphans, and needs nothing from the
// image, not even /bin/sh.
var initEntrypoint = []string{"/run/podman-init", "-P"}

// process is one command for [driver.exec], as Podman's exec takes it.
type process struct {
	Argv    []string
	Env     []string // the command's env; the container's is the base
	Workdir string   // "" for the container's
	User    string   // "" for the container's
	Stdin   io.Reader
	Stdout  io.Writer
	Stderr  io.Writer
}

// container is a container as [driver.list] finds it: its ID and labels,
// as both `podman ps --format json` and the REST API spell them.
type container = libpod.Listed
