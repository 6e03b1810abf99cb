package vm_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// A disk that fills during a checkpoint leaves nothing half-written, and
// the sandbox running. (A tmpfs of 64 KiB stands for the full disk: root
// mounts it.)
func TestCheckpointDiskFull(t *testing.T) {
	env := checkpointRig(t)
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	eachBackend(t, env, 3*time.Minute, func(ctx context.Context, t *testing.T, name string, h func(bool) vmHarness) {
		dir := filepath.Join(checkpointDir(t), "full")
		require.NoError(t, os.Mkdir(dir, 0o700))
		require.NoError(t, syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=64k,mode=0700"))
		t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
		for _, remove := range []bool{false, true} {
			v, p := warmVM(ctx, t, env, h(false))
			_, err := vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{Dir: dir, Remove: remove})
			t.Logf("TakeCheckpoint with Remove %v: %v", remove, err)
			require.Error(t, err)
			assert.True(t, errors.Is(err, syscall.ENOSPC) || strings.Contains(err.Error(), "no space left"), "the error says the disk is full: %v", err)
			entries, _ := os.ReadDir(dir)
			assert.Empty(t, entries, "nothing half-written")
			// With Remove, the dump stopped the sandbox before the export
			// broke off: it is suspended, and comes back as it was.
			require.Equal(t, remove, errors.Is(err, vm.ErrSuspended), "suspended exactly when the dump stops the sandbox")
			if remove {
				_, rerr := v.Run(ctx, exec.Command{Name: "true"})
				require.ErrorIs(t, rerr, vm.ErrSuspended)
				require.NoError(t, vm.Resume(ctx, v))
			}
			stillRuns(ctx, t, v, p, 0)
		}
	})
}
