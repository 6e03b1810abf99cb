package podman

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/libpod/libpodtest"
	"github.com/podvm/podvm/internal/podmantest"
)

func TestAPIErrorMapping(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	id := strings.Repeat("a", 64)
	// Each case gets its libpod error from a recorded answer.
	for _, c := range []struct {
		answer, route string
		call          func(*libpod.Client) error
		want          error
	}{
		{"container-start-no-such-container", "POST /containers/{id}/start",
			func(c *libpod.Client) error { return c.ContainerStart(ctx, id) }, driver.ErrNoSuchContainer},
		{"exec-create-no-such-container", "POST /containers/{id}/exec",
			func(c *libpod.Client) error { _, err := c.ExecCreate(ctx, id, libpod.ExecConfig{}); return err }, driver.ErrNoSuchContainer},
		{"archive-put-no-such-container", "PUT /containers/{id}/archive",
			func(c *libpod.Client) error { return c.ArchivePut(ctx, id, "/tmp", strings.NewReader("")) }, driver.ErrNoSuchContainer},
		{"container-create-name-in-use", "POST /containers/create",
			func(c *libpod.Client) error { _, err := c.ContainerCreate(ctx, &libpod.Spec{}); return err }, driver.ErrNameInUse},
		{"container-create-image-not-known", "POST /containers/create",
			func(c *libpod.Client) error { _, err := c.ContainerCreate(ctx, &libpod.Spec{}); return err }, driver.ErrImageNotFound},
		{"image-pull-unreachable", "POST /images/pull",
			func(c *libpod.Client) error { return c.ImagePull(ctx, "x") }, driver.ErrImageNotFound},
		{"image-pull-short-name", "POST /images/pull",
			func(c *libpod.Client) error { return c.ImagePull(ctx, "x") }, driver.ErrImageNotFound},
		{"container-remove-stopped-meanwhile", "DELETE /containers/{id}",
			func(c *libpod.Client) error { return c.ContainerRemove(ctx, id) }, driver.ErrContainerNotRunning},
		{"exec-create-not-running", "POST /containers/{id}/exec",
			func(c *libpod.Client) error { _, err := c.ExecCreate(ctx, id, libpod.ExecConfig{}); return err }, driver.ErrContainerNotRunning},
		{"exec-start-unknown-user", "POST /exec/{id}/start",
			func(c *libpod.Client) error { _, err := c.ExecStart(ctx, libpodtest.ExecID(1)); return err }, driver.ErrEngine},
		{"exec-inspect-no-such-session", "GET /exec/{id}/json",
			func(c *libpod.Client) error { _, err := c.ExecInspect(ctx, libpodtest.ExecID(1)); return err }, driver.ErrNoSuchContainer}, // sessions go with their container
		{"archive-put-not-a-dir", "PUT /containers/{id}/archive",
			func(c *libpod.Client) error { return c.ArchivePut(ctx, id, "/etc/passwd", strings.NewReader("")) }, driver.ErrEngine},
		{"exec-remove", "POST /exec/{id}/remove",
			func(c *libpod.Client) error { return c.ExecRemove(ctx, libpodtest.ExecID(1), true) }, driver.ErrEngine},
		// Connection dropped mid-answer, mid-stream.
		{"container-inspect", "GET /containers/{id}/json",
			func(c *libpod.Client) error { _, err := c.ContainerInspect(ctx, id); return err }, driver.ErrUnavailable},
	} {
		t.Run(c.answer, func(t *testing.T) {
			t.Parallel()
			h := libpodtest.Recorded(c.answer)
			if c.want == driver.ErrUnavailable {
				h = libpodtest.Cut(c.answer, libpodtest.HeaderEnd(c.answer)+50)
			}
			svc := libpodtest.Serve(t, "4.3", libpodtest.Routes{c.route: h})
			cl, err := libpod.Connect(ctx, svc.URI)
			require.NoError(t, err)
			native := c.call(cl)
			err = apiError("op", "what", native)
			assert.ErrorIs(t, err, c.want)
			var le *libpod.Error
			assert.ErrorAs(t, err, &le, "the libpod error is wrapped")
			assert.Contains(t, err.Error(), native.Error())
			assert.True(t, strings.HasPrefix(err.Error(), "vm: "), err.Error())
		})
	}
}

// The statuses and messages that the recordings lack (409 is what
// Podman 5 answers for conflicts) map the same way.
func TestAPIErrorMappingByMessage(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want error
	}{
		{&libpod.Error{Op: "o", Status: 409, Cause: "that name is already in use"}, driver.ErrNameInUse},
		{&libpod.Error{Op: "o", Status: 409, Message: "container 12 is not running"}, driver.ErrContainerNotRunning},
		{&libpod.Error{Op: "o", Status: 409, Cause: "container state improper"}, driver.ErrContainerNotRunning},
		{&libpod.Error{Op: "o", Status: 500, Message: "can only create exec sessions on running containers: container state improper"}, driver.ErrContainerNotRunning},
		{&libpod.Error{Op: "o", Status: 404, Cause: "failed to find image x"}, driver.ErrImageNotFound},
		{&libpod.Error{Op: "o", Status: 404, Cause: "no such image"}, driver.ErrImageNotFound},
		{&libpod.Error{Op: "o", Status: 409, Cause: "image is in use by a container", Message: "image used by 14c8: image is in use by a container: consider listing external containers and force-removing image"}, driver.ErrImageInUse},
		{&libpod.Error{Op: "o", Status: 500, Message: "something else"}, driver.ErrEngine},
		{&libpod.Error{Op: "o", Err: io.ErrUnexpectedEOF}, driver.ErrUnavailable},
		{errors.New("not from libpod"), driver.ErrEngine},
	} {
		assert.ErrorIs(t, apiError("op", "", c.err), c.want, c.err.Error())
		assert.ErrorIs(t, apiError("op", "", c.err), c.err)
	}
	// A context's end is not Podman's failure.
	for _, cerr := range []error{context.Canceled, context.DeadlineExceeded} {
		err := apiError("op", "", &libpod.Error{Op: "o", Err: cerr})
		assert.ErrorIs(t, err, cerr)
		assert.NotErrorIs(t, err, driver.ErrUnavailable)
		assert.NotErrorIs(t, err, driver.ErrEngine)
	}
}

// Data that merely looks like Podman's message keeps its status.
func TestStartFailureIsData(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code   int
		stdout int64
		stderr string
	}{
		{127, 1, "Error: x: OCI runtime attempted to invoke a command that was not found\n"},
		{127, 0, "hello\nError: x: OCI runtime attempted to invoke a command that was not found\n"},
		{3, 0, "Error: x: OCI runtime attempted to invoke a command that was not found\n"},
		{126, 0, "Error: something else\n"},
	} {
		assert.NoError(t, StartFailure("x", c.code, c.stdout, c.stderr, int64(len(c.stderr))), "%+v", c)
	}
	msg := "Error: x: OCI runtime attempted to invoke a command that was not found\n"
	assert.NoError(t, StartFailure("x", 127, 0, msg, int64(len(msg))+10), "stderr longer than what was kept")
}

// TestCLIErrorSamples maps every recorded podman failure in
// testdata/podman-stderr: each file must have an expectation here and
// each expectation a file.
func TestCLIErrorSamples(t *testing.T) {
	t.Parallel()
	want := map[string]error{ // case name without -loc/-remote; nil: data
		"command-error-line-127":   nil,
		"command-exit-125":         nil,
		"command-exit-126":         nil,
		"command-exit-127":         nil,
		"commit-no-such-container": driver.ErrNoSuchContainer,
		"image-inspect-not-known":  driver.ErrImageNotFound,
		"rmi-in-use":               driver.ErrImageInUse,
		"cp-in-no-such-container":  driver.ErrNoSuchContainer,
		"cp-out-no-such-container": driver.ErrNoSuchContainer,
		"cp-in-not-a-dir":          fs.ErrNotExist,
		"cp-out-no-such-path":      fs.ErrNotExist,
		"exec-is-directory":        exec.ErrPermission,
		"exec-no-such-container":   driver.ErrNoSuchContainer,
		"exec-no-workdir":          exec.ErrDirNotFound,
		"exec-not-executable":      exec.ErrPermission,
		"exec-not-found":           exec.ErrNotFound,
		"exec-not-running":         driver.ErrContainerNotRunning,
		"exec-unknown-user":        driver.ErrEngine,
		"exec-ssh-reset":           driver.ErrUnavailable, // sshd dropped the connection (MaxStartups), by hand
		"rm-no-such-container":     driver.ErrNoSuchContainer,
		"rm-stopped-meanwhile":     driver.ErrContainerNotRunning,
		"run-image-not-known":      driver.ErrImageNotFound,
		"run-name-in-use":          driver.ErrNameInUse,
		"run-oci-error":            driver.ErrEngine,
		"run-pull-dns":             driver.ErrImageNotFound,
		"run-pull-unreachable":     driver.ErrImageNotFound,
		"run-short-name":           driver.ErrImageNotFound,
		"run-unknown-flag":         driver.ErrEngine,
		"unreachable-socket":       driver.ErrUnavailable,
		"unreachable-tcp":          driver.ErrUnavailable,
	}
	files, err := filepath.Glob(filepath.Join(podmantest.Samples, "*.txt"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	seen := map[string]bool{}
	for _, f := range files {
		name := filepath.Base(f)
		key := strings.SplitN(name, ".", 2)[0]
		key = strings.TrimSuffix(strings.TrimSuffix(key, "-loc"), "-remote")
		seen[key] = true
		t.Run(name, func(t *testing.T) {
			w, ok := want[key]
			require.True(t, ok, "no expectation for sample %s: add it to the table", name)
			res := podmantest.Sample(t, name)
			op, _, _ := strings.Cut(key, "-")
			if op == "exec" || op == "command" {
				require.Equal(t, w != nil, StartFailure("x", res.ExitCode, res.StdoutBytes, res.Stderr, res.StderrBytes) != nil, "StartFailure: is this podman failing, or the command's own exit?")
				if w == nil {
					return
				}
			}
			err := cliError(op, "thing", res)
			assert.ErrorIs(t, err, w)
			for _, other := range []error{driver.ErrNoSuchContainer, driver.ErrContainerNotRunning, driver.ErrImageNotFound, driver.ErrNameInUse,
				driver.ErrUnavailable, driver.ErrEngine, driver.ErrImageInUse, exec.ErrNotFound, exec.ErrPermission, exec.ErrDirNotFound, fs.ErrNotExist} {
				if other != w {
					assert.NotErrorIs(t, err, other, "one sentinel per failure")
				}
			}
			var cerr *CLIError
			require.ErrorAs(t, err, &cerr)
			assert.Equal(t, res.Stderr, cerr.Stderr)
			assert.Equal(t, res.ExitCode, cerr.ExitCode)
			assert.NotContains(t, err.Error(), "Error: ", "podman's prefix is dropped from the message")
		})
	}
	for key := range want {
		assert.True(t, seen[key], "expectation %q has no sample file", key)
	}
}

func TestNetNS(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		in   string
		mode string
		val  string
		nets []string
	}{
		{"none", "none", "", nil},
		{"host", "host", "", nil},
		{"bridge", "bridge", "", nil},
		{"slirp4netns", "slirp4netns", "", nil},
		{"container:abc", "container", "abc", nil},
		{"podman1", "bridge", "", []string{"podman1"}},
	} {
		ns, nets := netNS(c.in)
		assert.Equal(t, libpod.Namespace{Mode: c.mode, Value: c.val}, ns, c.in)
		var names []string
		for n := range nets {
			names = append(names, n)
		}
		assert.Equal(t, c.nets, names, c.in)
	}
}

// podman-remote's 125 after its stream broke is an error; a command's own
// 125, or one with the same words among its own output, is data.
func TestLostStream(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		code int
		tail string
		lost bool
	}{
		{125, "Error: write unixpacket @->/proc/self/fd/16/attach: write: connection reset by peer\nError: read unix @->/run/podman.sock: read: connection reset by peer\n", true},
		{125, "mine\nError: read unix @->/s.sock: read: connection reset by peer\ntime=\"2026-11-25T16:07:40Z\" level=error msg=\"Failed to write input to service: write unix @->/s.sock: write: broken pipe\"\n", true},
		{125, "Error: read unix @->/s.sock: read: connection reset by peer\nmine\n", false},
		{125, "Error: the build failed\n", false},
		{3, "Error: read unix @->/s.sock: read: connection reset by peer\n", false},
		// Podman 5.4's remote CLI, when the command cannot start: a start
		// failure, for StartFailure, not a lost stream.
		{125, "Error: runc: exec failed: unable to start container process: chdir to cwd (\"/bin/busybox\") set in config.json failed: not a directory: OCI runtime error\n" +
			"Error: read unixpacket @->/proc/self/fd/14/attach: read: connection reset by peer\n", false},
	} {
		err := LostStream("sh", c.code, c.tail)
		if c.lost {
			assert.ErrorIs(t, err, driver.ErrEngine, "%d %q", c.code, c.tail)
		} else {
			assert.NoError(t, err, "%d %q", c.code, c.tail)
		}
	}
}
