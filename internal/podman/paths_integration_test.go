package podman

import (
	"archive/tar"
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
	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/podmantest"
)

// drivers returns both drivers on the configured service, by name.
func drivers(t *testing.T) map[string]Driver {
	t.Helper()
	env := podmantest.Need(t)
	c, err := libpod.Connect(context.Background(), env.Host)
	require.NoError(t, err)
	t.Cleanup(c.CloseIdleConnections)
	cli, err := NewCLI(nil, env.Podman, env.Host, "")
	require.NoError(t, err)
	drivers := map[string]Driver{"api": NewAPI(c), "cli": cli}
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
func container(t *testing.T, d Driver) string {
	t.Helper()
	env := podmantest.Need(t)
	ctx := context.Background()
	id, err := d.Create(ctx, Spec{Image: env.Image, Network: "none", Pids: 256,
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
func sh(t *testing.T, d Driver, id, script string) string {
	t.Helper()
	var out, errb bytes.Buffer
	code, _, err := d.Exec(context.Background(), id, Process{Argv: []string{"sh", "-c", script}, Stdout: &out, Stderr: &errb})
	require.NoError(t, err)
	require.Equal(t, 0, code, "%s: %s", script, errb.String())
	return out.String()
}

// globNames are names that Podman reads as patterns, each beside the
// name the pattern matches, or with no such neighbour.
var globNames = []string{"[x]", "*", "?", "[ab]", `back\slash`, "new\nline", "bad-\xff\xfe"}

// untar returns the entries of a tar stream, name to content (a
// directory's content is "<dir>").
func untar(t *testing.T, b []byte) map[string]string {
	t.Helper()
	got := map[string]string{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return got
		}
		require.NoError(t, err)
		data, err := io.ReadAll(tr)
		require.NoError(t, err)
		if h.Typeflag == tar.TypeDir {
			data = []byte("<dir>")
		}
		got[strings.TrimSuffix(h.Name, "/")] = string(data)
	}
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
				var tb bytes.Buffer
				tw := tar.NewWriter(&tb)
				require.NoError(t, tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len("is " + n)), Typeflag: tar.TypeReg}))
				_, err := tw.Write([]byte("is " + n))
				require.NoError(t, err)
				require.NoError(t, tw.Close())
				// In, named by the entry: the file /f/NAME.
				require.NoError(t, d.CopyIn(ctx, id, "/tmp/f", bytes.NewReader(tb.Bytes())), "%q", n)
				// In, named by the directory: /d/NAME/NAME, once it exists.
				err = d.CopyIn(ctx, id, "/tmp/d/"+n, bytes.NewReader(tb.Bytes()))
				assert.ErrorIs(t, err, fs.ErrNotExist, "%q: a missing directory is not made", n)
				var db bytes.Buffer
				tw = tar.NewWriter(&db)
				require.NoError(t, tw.WriteHeader(&tar.Header{Name: n + "/", Mode: 0o755, Typeflag: tar.TypeDir}))
				require.NoError(t, tw.Close())
				require.NoError(t, d.CopyIn(ctx, id, "/tmp/d", &db), "%q", n)
				require.NoError(t, d.CopyIn(ctx, id, "/tmp/d/"+n, bytes.NewReader(tb.Bytes())), "%q", n)
			}
			for _, n := range globNames {
				var out bytes.Buffer
				require.NoError(t, d.CopyOut(ctx, id, "/tmp/f/"+n, &out), "%q", n)
				assert.Equal(t, map[string]string{n: "is " + n}, untar(t, out.Bytes()), "file %q", n)
				out.Reset()
				require.NoError(t, d.CopyOut(ctx, id, "/tmp/d/"+n, &out), "%q", n)
				assert.Equal(t, map[string]string{n: "<dir>", n + "/" + n: "is " + n}, untar(t, out.Bytes()), "directory %q", n)
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
				assert.ErrorIs(t, err, ErrNotSupported)
				assert.ErrorContains(t, err, "not UTF-8")
			} else if assert.NoError(t, err) {
				assert.Equal(t, map[string]string{"bad-\xff\xfe": "is bad-\xff\xfe"}, untar(t, out.Bytes()))
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
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "secret", Mode: 0o600, Size: int64(len(marker)), Typeflag: tar.TypeReg}))
	_, _ = tw.Write([]byte(marker))
	require.NoError(t, tw.Close())
	require.NoError(t, d.CopyIn(context.Background(), id, "/tmp", &tb))
	assert.Empty(t, temp.Holding(marker), "the data stays out of %q", podmantest.TempDirs())
}
