package podmantest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The scripts' state directory holds the test services' storage, the
// sandboxes' own files among them: a TempWatch does not count those.
func TestTempWatchSkipsTheState(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, ".podvm")
	old := stateDir
	stateDir = state
	defer func() { stateDir = old }()
	w := watch(dir)
	require.NoError(t, os.MkdirAll(filepath.Join(state, "kube"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(state, "kube", "secret"), []byte("the-marker"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "spool"), []byte("the-marker"), 0o600))
	assert.Equal(t, []string{filepath.Join(dir, "spool")}, w.Holding("the-marker"))
}

// A watch finds what was written since it began, as a new file or in a
// new directory, whatever times the files were given; it does not enter
// what did not change, so what else the machine keeps costs it nothing.
func TestTempWatchReadsOnlyWhatChanged(t *testing.T) {
	dir := t.TempDir()
	// Before the watch: a tree holding the marker (found by no watch
	// begun after it), and a directory that will not change.
	oldTree := filepath.Join(dir, "old", "deep")
	require.NoError(t, os.MkdirAll(oldTree, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(oldTree, "f"), []byte("the-marker"), 0o600))
	back := time.Now().Add(-time.Hour)
	for _, p := range []string{oldTree, filepath.Dir(oldTree), filepath.Join(oldTree, "f")} {
		require.NoError(t, os.Chtimes(p, back, back))
	}
	// The change times cannot be set back: begin the watch past them.
	time.Sleep(1100 * time.Millisecond)
	w := watch(dir)

	spool := filepath.Join(dir, "spool-123")
	require.NoError(t, os.WriteFile(spool, []byte("..the-marker.."), 0o600))
	nested := filepath.Join(dir, "copy-456", "a", "b")
	require.NoError(t, os.MkdirAll(nested, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(nested, "kept-times"), []byte("the-marker"), 0o600))
	// An extractor that keeps the archive's times sets them back: the
	// change time still tells.
	require.NoError(t, os.Chtimes(filepath.Join(nested, "kept-times"), back, back))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "other"), []byte("no"), 0o600))

	assert.ElementsMatch(t, []string{spool, filepath.Join(nested, "kept-times")}, w.Holding("the-marker"))
	assert.Empty(t, w.Holding("absent"))
}
