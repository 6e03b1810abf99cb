package kube

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/driver"
)

// Every checkpoint operation is refused, and touches nothing.
func TestCheckpointsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := &Driver{}
	path := filepath.Join(t.TempDir(), "ckpt.tar")
	require.ErrorIs(t, d.Export(ctx, "pod", path, true), driver.ErrNotSupported)
	assert.NoFileExists(t, path)
	id, err := d.Import(ctx, path)
	require.ErrorIs(t, err, driver.ErrNotSupported)
	assert.Empty(t, id)
	assert.ErrorIs(t, d.CheckpointRefusal(ctx), driver.ErrNotSupported)
}
