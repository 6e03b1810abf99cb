package agent

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// HostDir writes the agent once into a directory of the user's cache
// named after its digest, so a new agent never meets an old copy, and
// mends a copy that was altered.
func TestHostDir(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("XDG_CACHE_HOME", cache)
	hostDirs.Delete("amd64")
	t.Cleanup(func() { hostDirs.Delete("amd64") })

	dir, err := HostDir("amd64")
	require.NoError(t, err)
	d, err := Digest("amd64")
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(cache, "podvm", "agent-"+strings.TrimPrefix(d, "sha256:")[:16]+"-amd64"), dir)
	bin, err := Binary("amd64")
	require.NoError(t, err)
	path := filepath.Join(dir, "podvm-agent")
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(bin, got), "the binary, whole")
	fi, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), fi.Mode().Perm())
	assert.Equal(t, Path, "/.podvm/"+filepath.Base(path), "where the sandbox finds it")

	require.NoError(t, os.WriteFile(path, []byte("stale"), 0o755))
	again, err := HostDir("amd64")
	require.NoError(t, err)
	assert.Equal(t, dir, again)
	hostDirs.Delete("amd64") // a new process
	_, err = HostDir("amd64")
	require.NoError(t, err)
	got, err = os.ReadFile(path)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(bin, got), "an altered copy is written again")
	left, err := filepath.Glob(filepath.Join(dir, ".podvm-agent-*"))
	require.NoError(t, err)
	assert.Empty(t, left, "no temporary file left")

	_, err = HostDir("mips")
	assert.ErrorIs(t, err, ErrArch)
}

// Tar holds the agent's directory and the binary, for "/" of a sandbox.
func TestTar(t *testing.T) {
	t.Parallel()
	b, err := Tar("arm64")
	require.NoError(t, err)
	bin, err := Binary("arm64")
	require.NoError(t, err)
	tr := tar.NewReader(bytes.NewReader(b))
	h, err := tr.Next()
	require.NoError(t, err)
	assert.Equal(t, ".podvm/", h.Name)
	assert.Equal(t, byte(tar.TypeDir), h.Typeflag)
	h, err = tr.Next()
	require.NoError(t, err)
	assert.Equal(t, strings.TrimPrefix(Path, "/"), h.Name)
	assert.Equal(t, int64(0o755), h.Mode)
	got, err := io.ReadAll(tr)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(bin, got))
	_, err = tr.Next()
	assert.Equal(t, io.EOF, err)

	_, err = Tar("mips")
	assert.ErrorIs(t, err, ErrArch)
}
