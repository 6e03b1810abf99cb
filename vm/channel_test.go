package vm

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestChannelDirs(t *testing.T) {
	rt := t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", rt)
	a, err := newChannelDir()
	require.NoError(t, err)
	b, err := newChannelDir()
	require.NoError(t, err)
	assert.NotEqual(t, a, b, "one directory per sandbox")
	base := filepath.Join(rt, "podvm")
	for _, dir := range []string{a, b} {
		assert.Equal(t, base, filepath.Dir(dir))
		assert.True(t, strings.HasPrefix(filepath.Base(dir), strconv.Itoa(os.Getpid())+"-"), "named after its owner, for Reap: %s", dir)
		fi, err := os.Stat(dir)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o711), fi.Mode().Perm(), "the sandbox's user, whatever uid it maps to, reaches the socket, and lists nothing")
	}
	fi, err := os.Stat(base)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "nobody else reaches the sockets")

	// A base that others could reach, or that is a link, is refused.
	require.NoError(t, os.Chmod(base, 0o755))
	_, err = newChannelDir()
	assert.Error(t, err)
	require.NoError(t, os.RemoveAll(base))
	require.NoError(t, os.Symlink(t.TempDir(), base))
	_, err = newChannelDir()
	assert.Error(t, err)

	// A socket path over sun_path's 108 bytes is refused: the stdio
	// channel serves instead.
	long := filepath.Join(t.TempDir(), strings.Repeat("x", 100))
	require.NoError(t, os.Mkdir(long, 0o700))
	t.Setenv("XDG_RUNTIME_DIR", long)
	_, err = newChannelDir()
	assert.ErrorContains(t, err, "too long")
	entries, _ := os.ReadDir(filepath.Join(long, "podvm"))
	assert.Empty(t, entries, "nothing is left of a refused directory")
}
