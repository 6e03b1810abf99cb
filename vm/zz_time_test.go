package vm_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

func TestZZTime(t *testing.T) {
	env, backends := checkpointRig(t)
	ctx := context.Background()
	for name, h := range backends {
		t.Run(name, func(t *testing.T) {
			dir := checkpointDir(t)
			v := testVM(t, env, h(false))
			require.NoError(t, v.Create(ctx))
			for range 3 {
				t0 := time.Now()
				cp, err := vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{Dir: dir})
				require.NoError(t, err)
				t1 := time.Now()
				c, err := vm.Restore(ctx, cp, vm.RestoreOptions{}, backendOf(env, name)...)
				require.NoError(t, err)
				t2 := time.Now()
				_, err = c.Run(ctx, exec.Command{Name: "true"})
				require.NoError(t, err)
				t3 := time.Now()
				t.Logf("checkpoint %v (%d KiB) restore %v first run %v", t1.Sub(t0), cp.Size>>10, t2.Sub(t1), t3.Sub(t2))
				require.NoError(t, c.Remove(ctx))
			}
		})
	}
}
