package vm_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/vmtest"
)

// ListSnapshots while snapshots are being removed: Podman's list fails
// when an image it listed goes away before it described it; the list
// must not. Every pass lists a subset of the snapshots, none removed
// before the pass began.
func TestListSnapshotsWhileRemoving(t *testing.T) {
	env := podmantest.Need(t)
	onBothBackends(t, env, func(t *testing.T, name string, h vmtest.Harness) {
		ctx, k, w := snapSetup(t, env) // removes what is left, whatever fails
		v := prepared(ctx, t, h, vm.Config{})
		list := []vm.Option{vm.WithURL(env.Host), vm.WithLabel(k, w)}
		if name == "cli" {
			x, mode := cliMode(env)
			list = append(mode, vm.WithBackend(vm.BackendCLI), vm.WithPodman(env.Podman), vm.WithExecutor(x), vm.WithLabel(k, w))
		}
		const n = 12
		var snaps []*vm.Snapshot
		for range n {
			snap, err := vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Labels: map[string]string{k: w}})
			require.NoError(t, err)
			snaps = append(snaps, snap)
		}
		got, err := vm.ListSnapshots(ctx, list...)
		require.NoError(t, err)
		require.Len(t, got, n)

		work := make(chan *vm.Snapshot)
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for s := range work {
					assert.NoError(t, vm.RemoveSnapshot(ctx, v, s.Image))
				}
			}()
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for _, s := range snaps {
				work <- s
			}
			close(work)
			wg.Wait()
		}()
		passes := 0
		for running := true; running; passes++ {
			select {
			case <-done:
				running = false
			default:
			}
			got, err := vm.ListSnapshots(ctx, list...)
			if !assert.NoError(t, err, "pass %d", passes) {
				break
			}
			assert.LessOrEqual(t, len(got), n)
		}
		<-done
		t.Logf("%d lists while removing", passes)
		got, err = vm.ListSnapshots(ctx, list...)
		require.NoError(t, err)
		assert.Empty(t, got)
	})
}
