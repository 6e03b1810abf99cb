package podman

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/mock/gomock"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/exec/execmock"
	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/libpod/libpodtest"
)

const (
	exportRoute = "POST /containers/{id}/checkpoint"
	importRoute = "POST /containers/import/restore"
)

// answer is a raw HTTP answer of the fake service.
func answer(raw string) libpodtest.Handler {
	return func(*libpodtest.Request) libpodtest.Answer { return libpodtest.Bytes([]byte(raw)) }
}

// exported answers an export with body, chunked as Podman sends it; cut
// leaves out the last chunk.
func exported(body string, cut bool) libpodtest.Handler {
	raw := "HTTP/1.1 200 OK\r\nContent-Type: application/octet; charset=us-ascii\r\nTransfer-Encoding: chunked\r\n\r\n" +
		fmt.Sprintf("%x\r\n%s\r\n", len(body), body)
	if !cut {
		raw += "0\r\n\r\n"
	}
	return answer(raw)
}

// failed is libpod's JSON error answer.
func failed(status int, cause, msg string) libpodtest.Handler {
	body := fmt.Sprintf(`{"cause":%q,"message":%q,"response":%d}`, cause, msg, status)
	return answer(fmt.Sprintf("HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", status, len(body), body))
}

// Messages of Podman 5.4 (service and local CLI alike).
const (
	notRunning = `"exited" is not running, cannot checkpoint: container state improper`
	nameInUse  = `creating container storage: the container name "box" is already in use by ` +
		"cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc" +
		`. You have to remove that container to be able to reuse that name: that name is already in use`
)

func TestAPIExport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	id := strings.Repeat("a", 64)

	t.Run("written", func(t *testing.T) {
		t.Parallel()
		d, svc := apiOn(t, libpodtest.Routes{exportRoute: exported("the archive", false)})
		path := filepath.Join(t.TempDir(), "ckpt.tar")
		require.NoError(t, d.Export(ctx, id, path, true))
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, "the archive", string(b))
		st, err := os.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, fs.FileMode(0o600), st.Mode().Perm())
		assert.Equal(t, 1, count(svc, exportRoute))
	})
	for _, leaveRunning := range []bool{true, false} {
		t.Run(fmt.Sprintf("leaveRunning=%v", leaveRunning), func(t *testing.T) {
			t.Parallel()
			d, svc := apiOn(t, libpodtest.Routes{exportRoute: exported("the archive", false)})
			require.NoError(t, d.Export(ctx, id, filepath.Join(t.TempDir(), "ckpt.tar"), leaveRunning))
			r := svc.Requests()[len(svc.Requests())-1]
			assert.Equal(t, fmt.Sprint(leaveRunning), r.URL.Query().Get("leaveRunning"), "the container is left running, or stopped")
		})
	}
	for name, c := range map[string]struct {
		h    libpodtest.Handler
		want error
	}{
		"cut":         {exported("the archive", true), driver.ErrUnavailable},
		"not running": {failed(500, "container state improper", notRunning), driver.ErrContainerNotRunning},
		"missing":     {failed(404, "no such container", `no container with name or ID "x" found: no such container`), driver.ErrNoSuchContainer},
		"criu":        {failed(500, "", "running criu: criu failed: type NOTIFY errno 0"), driver.ErrEngine},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d, _ := apiOn(t, libpodtest.Routes{exportRoute: c.h})
			path := filepath.Join(t.TempDir(), "ckpt.tar")
			err := d.Export(ctx, id, path, true)
			assert.ErrorIs(t, err, c.want)
			var le *libpod.Error
			assert.ErrorAs(t, err, &le, "the engine's words are kept")
			assert.NoFileExists(t, path, "a failed export leaves no archive")
		})
	}
	t.Run("exists", func(t *testing.T) {
		t.Parallel()
		d, svc := apiOn(t, nil)
		path := filepath.Join(t.TempDir(), "ckpt.tar")
		require.NoError(t, os.WriteFile(path, []byte("mine"), 0o644))
		err := d.Export(ctx, id, path, true)
		assert.ErrorIs(t, err, driver.ErrInvalidConfig)
		assert.ErrorIs(t, err, fs.ErrExist)
		b, _ := os.ReadFile(path)
		assert.Equal(t, "mine", string(b), "an existing file is left alone")
		assert.Zero(t, count(svc, exportRoute))
	})
}

func TestAPIImport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	id := strings.Repeat("b", 64)
	archive := filepath.Join(t.TempDir(), "ckpt.tar")
	require.NoError(t, os.WriteFile(archive, []byte("the archive"), 0o600))

	report := `{"Id":"` + id + `","runtime_restore_duration":1234,"criu_statistics":null}`
	d, svc := apiOn(t, libpodtest.Routes{importRoute: answer(fmt.Sprintf(
		"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(report), report))})
	got, err := d.Import(ctx, archive)
	require.NoError(t, err)
	assert.Equal(t, id, got)
	assert.Equal(t, 1, count(svc, importRoute))
	assert.Equal(t, "the archive", string(svc.Requests()[len(svc.Requests())-1].Body))

	d, _ = apiOn(t, libpodtest.Routes{importRoute: failed(500, "that name is already in use", nameInUse)})
	_, err = d.Import(ctx, archive)
	assert.ErrorIs(t, err, driver.ErrNameInUse)
	assert.ErrorContains(t, err, "already in use by")

	_, err = d.Import(ctx, filepath.Join(t.TempDir(), "none.tar"))
	assert.ErrorIs(t, err, driver.ErrInvalidConfig)
	assert.ErrorIs(t, err, fs.ErrNotExist)
}

// cliOn returns the CLI driver running podman through a mock executor.
func cliOn(t *testing.T) (CLI, *execmock.MockExecutor) {
	t.Helper()
	x := execmock.NewMockExecutor(gomock.NewController(t))
	d, err := NewCLI(x, "podman", "", "")
	require.NoError(t, err)
	return d, x
}

func TestCLIExport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	id := strings.Repeat("a", 64)

	t.Run("written", func(t *testing.T) {
		t.Parallel()
		d, x := cliOn(t)
		path := filepath.Join(t.TempDir(), "ckpt.tar")
		x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(func(_ context.Context, c exec.Command) (*exec.Result, error) {
			assert.Equal(t, "podman", c.Name)
			assert.Equal(t, []string{"container", "checkpoint", "--export=" + path, "--compress=none",
				"--leave-running", "--tcp-established", "--file-locks", id}, c.Args)
			// podman finds the file made, mode 0600, and writes into it as
			// os.Create (local) or O_RDWR|O_CREATE (remote) do.
			st, err := os.Stat(path)
			require.NoError(t, err)
			assert.Equal(t, fs.FileMode(0o600), st.Mode().Perm())
			f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o666)
			require.NoError(t, err)
			f.WriteString("the archive")
			f.Close()
			return &exec.Result{Stdout: id + "\n"}, nil
		})
		require.NoError(t, d.Export(ctx, id, path, true))
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, "the archive", string(b))
		st, err := os.Stat(path)
		require.NoError(t, err)
		assert.Equal(t, fs.FileMode(0o600), st.Mode().Perm())
	})
	t.Run("stopping", func(t *testing.T) {
		t.Parallel()
		d, x := cliOn(t)
		path := filepath.Join(t.TempDir(), "ckpt.tar")
		x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(func(_ context.Context, c exec.Command) (*exec.Result, error) {
			assert.Equal(t, []string{"container", "checkpoint", "--export=" + path, "--compress=none",
				"--tcp-established", "--file-locks", id}, c.Args, "no --leave-running")
			return &exec.Result{Stdout: id + "\n"}, nil
		})
		require.NoError(t, d.Export(ctx, id, path, false))
	})
	for name, c := range map[string]struct {
		stderr string
		want   error
	}{
		"not running": {"Error: " + notRunning + "\n", driver.ErrContainerNotRunning},
		"missing":     {`Error: no container with name or ID "x" found: no such container` + "\n", driver.ErrNoSuchContainer},
		"criu":        {"Error: running criu: criu failed: type NOTIFY errno 0\n", driver.ErrEngine},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d, x := cliOn(t)
			path := filepath.Join(t.TempDir(), "ckpt.tar")
			x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(func(context.Context, exec.Command) (*exec.Result, error) {
				// A local podman that failed after it began the file.
				require.NoError(t, os.WriteFile(path, []byte("half"), 0o600))
				return &exec.Result{ExitCode: 125, Stderr: c.stderr}, nil
			})
			err := d.Export(ctx, id, path, true)
			assert.ErrorIs(t, err, c.want)
			var cerr *CLIError
			require.ErrorAs(t, err, &cerr)
			assert.Equal(t, c.stderr, cerr.Stderr)
			assert.NoFileExists(t, path, "a failed export leaves no archive")
		})
	}
	t.Run("exists", func(t *testing.T) {
		t.Parallel()
		d, _ := cliOn(t) // podman is never run
		path := filepath.Join(t.TempDir(), "ckpt.tar")
		require.NoError(t, os.WriteFile(path, []byte("mine"), 0o644))
		err := d.Export(ctx, id, path, true)
		assert.ErrorIs(t, err, driver.ErrInvalidConfig)
		assert.ErrorIs(t, err, fs.ErrExist)
		b, _ := os.ReadFile(path)
		assert.Equal(t, "mine", string(b))
	})
}

func TestCLIImport(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	id := strings.Repeat("b", 64)
	archive := filepath.Join(t.TempDir(), "ckpt.tar")
	require.NoError(t, os.WriteFile(archive, []byte("the archive"), 0o600))
	args := []string{"container", "restore", "--import=" + archive, "--tcp-established", "--file-locks", "--ignore-static-ip", "--ignore-static-mac"}

	d, x := cliOn(t)
	x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(func(_ context.Context, c exec.Command) (*exec.Result, error) {
		assert.Equal(t, args, c.Args)
		assert.NotContains(t, c.Args, "--name", "Podman refuses --name with --tcp-established")
		return &exec.Result{Stdout: id + "\n"}, nil
	})
	got, err := d.Import(ctx, archive)
	require.NoError(t, err)
	assert.Equal(t, id, got)

	for _, out := range []string{"", "box\n", strings.Repeat("g", 64) + "\n", id[:63] + "\n"} {
		d, x = cliOn(t)
		x.EXPECT().Run(gomock.Any(), gomock.Any()).Return(&exec.Result{Stdout: out}, nil)
		_, err = d.Import(ctx, archive)
		assert.ErrorIs(t, err, driver.ErrEngine, "%q is no container ID", out)
	}

	d, x = cliOn(t)
	x.EXPECT().Run(gomock.Any(), gomock.Any()).Return(&exec.Result{ExitCode: 125, Stderr: "Error: " + nameInUse + "\n"}, nil)
	_, err = d.Import(ctx, archive)
	assert.ErrorIs(t, err, driver.ErrNameInUse)
	var cerr *CLIError
	assert.ErrorAs(t, err, &cerr)

	d, _ = cliOn(t) // podman is never run
	_, err = d.Import(ctx, filepath.Join(t.TempDir(), "none.tar"))
	assert.ErrorIs(t, err, driver.ErrInvalidConfig)
	assert.ErrorIs(t, err, fs.ErrNotExist)
}
