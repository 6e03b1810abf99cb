package podman

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/internal/testkit"
)

// drivers returns both drivers on the configured service, by name.
func drivers(t *testing.T) map[string]driver.Driver {
	t.Helper()
	env := podmantest.Need(t)
	c, err := libpod.Connect(context.Background(), env.Host)
	require.NoError(t, err)
	t.Cleanup(c.CloseIdleConnections)
	cli, err := NewCLI(nil, env.Podman, env.Host, "")
	require.NoError(t, err)
	drivers := map[string]driver.Driver{"api": NewAPI(c), "cli": cli}
	if !env.RemoteOnly && strings.HasPrefix(env.Host, "unix://") {
		// podman itself, on the service's storage, as vm's tests run it.
		var local []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "CONTAINER_HOST=") && !strings.HasPrefix(kv, "CONTAINER_CONNECTION=") {
				local = append(local, kv)
			}
		}
		drivers["cli-local"], err = NewCLI(NewExecutor(exec.WithBaseEnv(local)), env.Podman, "", "")
		require.NoError(t, err)
	}
	return drivers
}

// container starts a sandbox-like container through d, removed when t
// ends.
func container(t *testing.T, d driver.Driver) string {
	t.Helper()
	env := podmantest.Need(t)
	ctx := context.Background()
	id, err := d.Create(ctx, driver.Spec{Image: env.Image, Network: "none", Pids: 256,
		Labels: map[string]string{"io.podvm.managed": "true", "io.podvm.test": t.Name()}})
	t.Cleanup(func() {
		if id != "" {
			assert.NoError(t, d.Remove(context.WithoutCancel(ctx), id))
		}
	})
	require.NoError(t, err)
	return id
}

// sh runs script in container id and returns its stdout.
func sh(t *testing.T, d driver.Driver, id, script string) string {
	t.Helper()
	var out, errb bytes.Buffer
	code, _, err := d.Exec(context.Background(), id, driver.Process{Argv: []string{"sh", "-c", script}, Stdout: &out, Stderr: &errb})
	require.NoError(t, err)
	require.Equal(t, 0, code, "%s: %s", script, errb.String())
	return out.String()
}

// globNames are names that Podman reads as patterns, each beside the
// name the pattern matches, or with no such neighbour.
var globNames = []string{"[x]", "*", "?", "[ab]", `back\slash`, "new\nline", "bad-\xff\xfe"}

// contents describes the entries of a tar stream as testkit.Contents
// does: "name=content", a directory's content "<dir>".
func contents(t *testing.T, b []byte) []string {
	t.Helper()
	entries, err := testkit.Untar(b)
	require.NoError(t, err)
	return testkit.Contents(entries)
}

// A path is a name, never a pattern: each glob character, a newline and
// bytes that are not UTF-8 are read, written into and listed as
// themselves, beside the names their pattern would match, on both
// drivers.
func TestCopyGlobNames(t *testing.T) {
	t.Parallel()
	for name, d := range drivers(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			id := container(t, d)
			// The neighbours a pattern would match: x for [x], a for
			// [ab] and ?, backslash for back\slash.
			sh(t, d, id, `mkdir -p /tmp/f /tmp/d && cd /tmp/f && echo x >x && echo a >a && echo plain >backslash && mkdir /tmp/d/x /tmp/d/a /tmp/d/backslash`)
			for _, n := range globNames {
				tb := testkit.Tar(t, testkit.File(n, "is "+n, 0o644))
				// In, named by the entry: the file /f/NAME.
				require.NoError(t, d.CopyIn(ctx, id, "/tmp/f", bytes.NewReader(tb)), "%q", n)
				// In, named by the directory: /d/NAME/NAME, once it exists.
				err := d.CopyIn(ctx, id, "/tmp/d/"+n, bytes.NewReader(tb))
				assert.ErrorIs(t, err, fs.ErrNotExist, "%q: a missing directory is not made", n)
				db := testkit.Tar(t, testkit.Dir(n+"/", 0o755))
				require.NoError(t, d.CopyIn(ctx, id, "/tmp/d", bytes.NewReader(db)), "%q", n)
				require.NoError(t, d.CopyIn(ctx, id, "/tmp/d/"+n, bytes.NewReader(tb)), "%q", n)
			}
			for _, n := range globNames {
				var out bytes.Buffer
				require.NoError(t, d.CopyOut(ctx, id, "/tmp/f/"+n, &out), "%q", n)
				assert.ElementsMatch(t, []string{n + "=is " + n}, contents(t, out.Bytes()), "file %q", n)
				out.Reset()
				require.NoError(t, d.CopyOut(ctx, id, "/tmp/d/"+n, &out), "%q", n)
				assert.ElementsMatch(t, []string{n + "=<dir>", n + "/" + n + "=is " + n}, contents(t, out.Bytes()), "directory %q", n)
			}
			for _, n := range []string{"[y]", "*y", "?y", "bad-\xfe\xff"} {
				err := d.CopyOut(ctx, id, "/tmp/f/"+n, io.Discard)
				assert.ErrorIs(t, err, fs.ErrNotExist, "%q", n)
			}
			assert.Equal(t, "x\n", sh(t, d, id, "cat /tmp/f/x"), "the neighbours are untouched")
			// Beneath a directory whose name is not UTF-8: the file, or
			// a refusal where the name cannot be given exactly.
			bad := "/tmp/d/bad-\xff\xfe/bad-\xff\xfe"
			var out bytes.Buffer
			err := d.CopyOut(ctx, id, bad, &out)
			if name == "cli" { // podman-remote
				assert.ErrorIs(t, err, driver.ErrNotSupported)
				assert.ErrorContains(t, err, "not UTF-8")
			} else if assert.NoError(t, err) {
				assert.ElementsMatch(t, []string{"bad-\xff\xfe=is bad-\xff\xfe"}, contents(t, out.Bytes()))
			}
		})
	}
}

// The CLI's copy in leaves nothing of the data on the host: podman cp
// spools its stdin into TMPDIR and never removes it.
func TestCLICopyInLeavesNoSpool(t *testing.T) {
	t.Parallel()
	d := drivers(t)["cli"]
	id := container(t, d)
	marker := "podvm-spool-marker-" + time.Now().Format("150405.000000000")
	temp := podmantest.WatchTemp()
	tb := testkit.Tar(t, testkit.File("secret", marker, 0o600))
	require.NoError(t, d.CopyIn(context.Background(), id, "/tmp", bytes.NewReader(tb)))
	assert.Empty(t, temp.Holding(marker), "the data stays out of %q", podmantest.TempDirs())
}
