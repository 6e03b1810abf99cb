package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/podvm/podvm/vm"
)

// The command every exec round trip runs, and what it must report.
var (
	roundTripArgv = []string{"sh", "-c", "echo hi; echo oops >&2; exit 3"}
	wantStdout    = "hi\n"
	wantStderr    = "oops\n"
	wantExit      = 3
)

// checkRoundTrip fails unless a round trip reported exactly what the
// command printed and its exit status.
func checkRoundTrip(stdout, stderr string, code int) error {
	if stdout != wantStdout || stderr != wantStderr || code != wantExit {
		return fmt.Errorf("wrong result: stdout %q stderr %q exit %d, want %q %q %d",
			stdout, stderr, code, wantStdout, wantStderr, wantExit)
	}
	return nil
}

// streamBlock is the block size of the stream: a pipe's capacity.
const streamBlock = 64 << 10

// streamArgv prints n zero bytes on stdout, n a multiple of streamBlock.
// It is dd, not `head -c`: busybox's head copies through a small buffer
// and, at ~30 MiB/s, would measure itself instead of the transport.
func streamArgv(n int64) []string {
	return []string{"dd", "if=/dev/zero", "bs=" + strconv.Itoa(streamBlock), "count=" + strconv.FormatInt(n/streamBlock, 10), "status=none"}
}

// podman runs the podman CLI against one service, as a user shelling out
// would: one process per call.
type podman struct {
	bin    string // the podman binary
	url    string // the service, e.g. unix:///run/podman/podman.sock
	labels map[string]string
}

// command is `podman --url URL args...`.
func (p *podman) command(ctx context.Context, args ...string) *osexec.Cmd {
	return osexec.CommandContext(ctx, p.bin, append([]string{"--url", p.url}, args...)...)
}

// output runs podman and returns its trimmed stdout; a non-zero exit is an
// error carrying stderr.
func (p *podman) output(ctx context.Context, args ...string) (string, error) {
	c := p.command(ctx, args...)
	var stderr bytes.Buffer
	c.Stderr = &stderr
	out, err := c.Output()
	if err != nil {
		return "", fmt.Errorf("podman %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return strings.TrimSpace(string(out)), nil
}

// runArgs is `podman run -d` with the flags podvm's CLIVM uses for a
// default vm.Config, so both make the same sandbox: no network,
// no-new-privileges, podvm's capabilities and pids limit, Podman's init as
// PID 1 (it pauses; the image needs no binary).
func (p *podman) runArgs(image string) []string {
	a := append([]string{"run", "-d", "--pull", "missing"}, p.sandboxFlags()...)
	return append(a, "--init", "--entrypoint", `["/run/podman-init","-P"]`, image)
}

// sandboxFlags are the run's labels and the flags of podvm's sandboxes.
func (p *podman) sandboxFlags() []string {
	var a []string
	for _, k := range slices.Sorted(maps.Keys(p.labels)) {
		a = append(a, "--label", k+"="+p.labels[k])
	}
	return append(a,
		"--network", vm.DefaultNetwork,
		"--security-opt", "no-new-privileges",
		"--cap-drop", "all",
		"--cap-add", strings.Join(vm.DefaultCapabilities, ","),
		"--pids-limit", strconv.Itoa(vm.DefaultPids),
		"--http-proxy=false")
}

// start runs a sandbox and returns its ID.
func (p *podman) start(ctx context.Context, image string) (string, error) {
	return p.output(ctx, p.runArgs(image)...)
}

// remove force-removes containers at once (`rm -f -t 0`).
func (p *podman) remove(ctx context.Context, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	_, err := p.output(ctx, append([]string{"rm", "-f", "-t", "0", "--ignore"}, ids...)...)
	return err
}

// exists reports whether container id still exists.
func (p *podman) exists(ctx context.Context, id string) (bool, error) {
	code, err := exitCode(p.command(ctx, "container", "exists", id).Run())
	if err != nil {
		return false, err
	}
	return code == 0, nil
}

// removeLabelled removes every container carrying label k=v.
func (p *podman) removeLabelled(ctx context.Context, k, v string) error {
	out, err := p.output(ctx, "ps", "-aq", "--filter", "label="+k+"="+v)
	if err != nil {
		return err
	}
	return p.remove(ctx, strings.Fields(out)...)
}

// execRoundTrip is `podman --url URL exec ID sh -c ...` as a process, its
// two streams captured.
func (p *podman) execRoundTrip(id string) op {
	return func(ctx context.Context) error {
		return runRoundTrip(p.command(ctx, append([]string{"exec", id}, roundTripArgv...)...))
	}
}

// runRoundTrip runs c, a round trip through some exec, and checks it.
func runRoundTrip(c *osexec.Cmd) error {
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	code, err := exitCode(c.Run())
	if err != nil {
		return fmt.Errorf("%s exec: %w", filepath.Base(c.Path), err)
	}
	return checkRoundTrip(stdout.String(), stderr.String(), code)
}

// execStream is `podman exec ID head -c n /dev/zero > /dev/null`: the
// stream never enters this process, the best case for the CLI.
func (p *podman) execStream(id string, n int64) op {
	return func(ctx context.Context) error {
		return toDevNull(p.command(ctx, append([]string{"exec", id}, streamArgv(n)...)...))
	}
}

// execStreamPipe is `podman exec ID head -c n /dev/zero` with its stdout
// a pipe that this process reads and discards: the least any reader of
// the CLI's output can do.
func (p *podman) execStreamPipe(id string, n int64) op {
	return func(ctx context.Context) error {
		c := p.command(ctx, append([]string{"exec", id}, streamArgv(n)...)...)
		var stderr bytes.Buffer
		c.Stderr = &stderr
		out, err := c.StdoutPipe()
		if err != nil {
			return err
		}
		if err := c.Start(); err != nil {
			return err
		}
		got, copyErr := io.Copy(io.Discard, out)
		code, err := exitCode(c.Wait())
		switch {
		case err != nil || copyErr != nil:
			return fmt.Errorf("podman: %w", errors.Join(err, copyErr))
		case code != 0:
			return fmt.Errorf("podman: exit %d: %s", code, strings.TrimSpace(stderr.String()))
		case got != n:
			return fmt.Errorf("podman: %d bytes, want %d", got, n)
		}
		return nil
	}
}

// lifecycle is `podman run -d`, `podman exec` and `podman rm -f -t 0`.
func (p *podman) lifecycle(image string) op {
	return func(ctx context.Context) error {
		id, err := p.start(ctx, image)
		if err != nil {
			return err
		}
		err = p.execRoundTrip(id)(ctx)
		rctx, cancel := removeContext(ctx)
		defer cancel()
		return errors.Join(err, p.remove(rctx, id))
	}
}

// removeContext is ctx without its cancellation, bounded by a minute:
// what an operation made is removed even when ctx is what ended it.
func removeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
}

// toDevNull runs c with stdout on /dev/null (os/exec's nil Stdout) and
// fails unless it exits 0.
func toDevNull(c *osexec.Cmd) error {
	var stderr bytes.Buffer
	c.Stderr = &stderr
	code, err := exitCode(c.Run())
	switch {
	case err != nil:
		return fmt.Errorf("%s: %w", filepath.Base(c.Path), err)
	case code != 0:
		return fmt.Errorf("%s: exit %d: %s", filepath.Base(c.Path), code, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// exitCode turns the error of Cmd.Run into an exit status; only failures
// to run at all remain errors.
func exitCode(err error) (int, error) {
	var ee *osexec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case errors.As(err, &ee) && ee.Exited():
		return ee.ExitCode(), nil
	}
	return -1, err
}

// runc runs commands in a Podman container directly through its OCI
// runtime, bypassing Podman, conmon and the API: the floor.
type runc struct {
	bin, root string
}

// findRuntime finds, for the OCI runtime the service uses (name and path
// as podman info gives them), the state directory it keeps container id in (Podman passes --root only when it
// is not the runtime's default: /run/NAME as root, $XDG_RUNTIME_DIR/NAME
// rootless). It verifies the pair with `RUNTIME --root DIR state ID`.
func findRuntime(ctx context.Context, name, path, id string) (*runc, error) {
	if name == "" || path == "" {
		return nil, fmt.Errorf("podman info names no OCI runtime")
	}
	roots := []string{filepath.Join("/run", name)}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		roots = append(roots, filepath.Join(d, name))
	}
	roots = append(roots, filepath.Join("/run/user", strconv.Itoa(os.Getuid()), name))
	for _, root := range roots {
		c := osexec.CommandContext(ctx, path, "--root", root, "state", id)
		if out, err := c.Output(); err == nil && bytes.Contains(out, []byte(id)) {
			return &runc{bin: path, root: root}, nil
		}
	}
	return nil, fmt.Errorf("%s has no state for the container under %s (a remote service, or a rootless one in its own user namespace?)",
		path, strings.Join(roots, ", "))
}

func (r *runc) command(ctx context.Context, id string, argv []string) *osexec.Cmd {
	return osexec.CommandContext(ctx, r.bin, append([]string{"--root", r.root, "exec", id}, argv...)...)
}

// execRoundTrip is `runc --root DIR exec ID sh -c ...`.
func (r *runc) execRoundTrip(id string) op {
	return func(ctx context.Context) error { return runRoundTrip(r.command(ctx, id, roundTripArgv)) }
}

// execStream is `runc exec ID head -c n /dev/zero > /dev/null`.
func (r *runc) execStream(id string, n int64) op {
	return func(ctx context.Context) error { return toDevNull(r.command(ctx, id, streamArgv(n))) }
}
