package podmantest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The scripts' state directory holds the test services' storage, the
// sandboxes' own files among them: FilesHolding does not count those.
func TestFilesHoldingSkipsTheState(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, ".podvm")
	require.NoError(t, os.MkdirAll(filepath.Join(state, "kube"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(state, "kube", "secret"), []byte("the-marker"), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "spool"), []byte("the-marker"), 0o600))
	old := stateDir
	stateDir = state
	defer func() { stateDir = old }()
	assert.Equal(t, []string{filepath.Join(dir, "spool")}, FilesHolding(dir, "the-marker"))
}
