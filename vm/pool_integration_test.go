package vm_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/vmtest"
)

// poolBoxes lists the containers, running or not, of the pool with this
// ID, through the podman CLI: what the service holds, not what the pool
// believes.
func poolBoxes(ctx context.Context, t *testing.T, env podmantest.Env, id string) []string {
	t.Helper()
	return strings.Fields(podman(ctx, t, env, "ps", "-a", "-q", "--no-trunc", "--filter", "label="+vm.LabelPool+"="+id))
}

// removePoolBoxes removes what a failed test may have left of a pool.
func removePoolBoxes(t *testing.T, env podmantest.Env, id string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if ids := poolBoxes(ctx, t, env, id); len(ids) > 0 {
			podman(ctx, t, env, append([]string{"rm", "-f", "-t", "0", "--ignore"}, ids...)...)
		}
	})
}

// newAPIOn is a pool's constructor of APIVMs on env's service.
func newAPIOn(env podmantest.Env) func(context.Context, vm.Config) (vm.VM, error) {
	return func(ctx context.Context, cfg vm.Config) (vm.VM, error) { return vm.NewAPIVM(ctx, env.Host, cfg) }
}

// A pool works over each backend and over vm.New's discovery: fresh
// sandboxes, each removed when given back, none left after Close.
func TestPoolIntegration(t *testing.T) {
	env := podmantest.Need(t)
	backends := map[string]func(context.Context, vm.Config) (vm.VM, error){
		"api": newAPIOn(env),
		"cli": func(_ context.Context, cfg vm.Config) (vm.VM, error) {
			x, opts := cliMode(env)
			return vm.NewCLIVM(cfg, x, append(opts, vm.WithPodman(env.Podman))...)
		},
		"new": func(ctx context.Context, cfg vm.Config) (vm.VM, error) { return vm.New(ctx, cfg, vm.WithURL(env.Host)) },
	}
	for name, newVM := range backends {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			p, err := vm.NewPool(vm.Config{Image: env.Image}, newVM, vm.WithPoolSize(2), vm.WithPoolCreates(2))
			require.NoError(t, err)
			removePoolBoxes(t, env, p.ID())
			defer p.Close(context.Background())
			require.Eventually(t, func() bool { return p.Stats().Ready == 2 }, 2*time.Minute, 10*time.Millisecond, "the pool fills: %+v", p.Stats())
			require.Len(t, poolBoxes(ctx, t, env, p.ID()), 2)

			seen := map[string]bool{}
			for range 3 {
				v, err := p.Get(ctx)
				require.NoError(t, err)
				require.False(t, seen[v.ID()], "handed out twice")
				seen[v.ID()] = true
				// Fresh: nothing a previous caller did is there.
				res, err := v.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", "test ! -e /tmp/used && touch /tmp/used && echo fresh"}})
				require.NoError(t, err)
				assert.Equal(t, "fresh\n", res.Stdout, "stderr: %s", res.Stderr)
				require.NoError(t, v.Remove(ctx))
				assert.NotContains(t, poolBoxes(ctx, t, env, p.ID()), v.ID(), "giving it back removes it")
			}
			kept, err := p.Get(ctx) // never given back
			require.NoError(t, err)

			require.NoError(t, p.Close(ctx))
			assert.Empty(t, poolBoxes(ctx, t, env, p.ID()), "Close removes everything, the sandbox never given back too")
			_, err = kept.Run(ctx, exec.Command{Name: "true"})
			assert.ErrorIs(t, err, vm.ErrRemoved)
			_, err = p.Get(ctx)
			assert.ErrorIs(t, err, vm.ErrPoolClosed)
		})
	}
}

// A create that fails on the service reaches the caller who waits.
func TestPoolIntegrationCreateFails(t *testing.T) {
	env := podmantest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p, err := vm.NewPool(vm.Config{Image: "localhost/podvm-no-such-image:latest", Pull: vm.PullNever},
		newAPIOn(env),
		vm.WithPoolSize(1), vm.WithPoolCreates(1))
	require.NoError(t, err)
	removePoolBoxes(t, env, p.ID())
	_, err = p.Get(ctx)
	require.ErrorIs(t, err, vm.ErrImageNotFound)
	require.NoError(t, p.Close(ctx))
	assert.Empty(t, poolBoxes(ctx, t, env, p.ID()))
}

// poolChildEnv makes TestPoolChild fill a pool with this ID, take one
// sandbox it never gives back, say "full", and wait to be killed.
const poolChildEnv = "PODVM_TEST_POOL_CHILD"

func TestPoolChild(t *testing.T) {
	id := os.Getenv(poolChildEnv)
	if id == "" {
		t.Skip("run by TestPoolKilledWithAFullPool")
	}
	env := podmantest.Need(t)
	cfg := vm.Config{Image: env.Image, Labels: map[string]string{vm.LabelPool: id}}
	p, err := vm.NewPool(cfg, newAPIOn(env),
		vm.WithPoolSize(2), vm.WithPoolCreates(2))
	require.NoError(t, err)
	_, err = p.Get(context.Background())
	require.NoError(t, err)
	require.Eventually(t, func() bool { s := p.Stats(); return s.Ready == 2 && s.Creating == 0 }, 2*time.Minute, 10*time.Millisecond)
	fmt.Println("full")
	time.Sleep(5 * time.Minute) // the parent kills us long before
}

// killedWhenFull runs the test named test of this binary as a child
// process, with env added to its environment, until it says "full",
// then kills it and waits for it to be gone.
func killedWhenFull(t *testing.T, test string, env ...string) {
	t.Helper()
	child := osexec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.timeout=4m")
	child.Env = append(os.Environ(), env...)
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	lines := bufio.NewScanner(out)
	full := false
	for !full && lines.Scan() {
		full = lines.Text() == "full"
	}
	require.NoError(t, child.Process.Kill())
	_ = child.Wait() // a zombie would still count as alive
	require.True(t, full, "%s filled its pool", test)
}

// A process killed with its pool full (and a sandbox it never gave back)
// leaves sandboxes that name it; Reap removes all of them, and only them.
func TestPoolKilledWithAFullPool(t *testing.T) {
	env := podmantest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	id := fmt.Sprintf("killed-%d", time.Now().UnixNano())
	removePoolBoxes(t, env, id)

	// A live pool of this process, of another ID: Reap keeps it.
	alive, err := vm.NewPool(vm.Config{Image: env.Image},
		newAPIOn(env), vm.WithPoolSize(1))
	require.NoError(t, err)
	removePoolBoxes(t, env, alive.ID())
	defer alive.Close(context.Background())

	killedWhenFull(t, "TestPoolChild", poolChildEnv+"="+id)
	left := poolBoxes(ctx, t, env, id)
	require.Len(t, left, 3, "two ready, one handed out")

	require.Eventually(t, func() bool { return alive.Stats().Ready == 1 }, 2*time.Minute, 10*time.Millisecond)
	removed, err := vm.Reap(ctx, 0, vm.WithURL(env.Host), vm.WithLabel(vm.LabelPool, id))
	require.NoError(t, err)
	assert.ElementsMatch(t, left, removed)
	assert.Empty(t, poolBoxes(ctx, t, env, id), "nothing of the killed pool remains")

	removed, err = vm.Reap(ctx, 0, vm.WithURL(env.Host), vm.WithLabel(vm.LabelPool, alive.ID()))
	require.NoError(t, err)
	assert.Empty(t, removed, "a live process's pool is kept")
	assert.Len(t, poolBoxes(ctx, t, env, alive.ID()), 1)
}

// vmtest.Pool hands tests warm sandboxes and cleans up after them.
func TestVMTestPool(t *testing.T) {
	env := podmantest.Need(t)
	pool := vmtest.NewPool(vm.Config{Image: env.Image, Labels: map[string]string{vm.LabelPool: fmt.Sprintf("vmtest-%d", time.Now().UnixNano())}},
		func(ctx context.Context, cfg vm.Config) (vm.VM, error) { return vm.New(ctx, cfg, vm.WithURL(env.Host)) },
		vm.WithPoolSize(2))
	var ids []string
	t.Run("tests", func(t *testing.T) {
		for i := range 3 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				box := pool.Sandbox(t)
				ids = append(ids, box.ID())
				res, err := box.Run(context.Background(), exec.Command{Name: "echo", Args: []string{"warm"}})
				require.NoError(t, err)
				assert.Equal(t, "warm\n", res.Stdout)
			})
		}
	})
	require.NoError(t, pool.Close())
	all := podman(context.Background(), t, env, "ps", "-a", "-q", "--no-trunc")
	require.Len(t, ids, 3)
	for _, id := range ids {
		assert.NotContains(t, all, id, "removed in Cleanup")
	}

	if os.Getenv(vmtest.RequireEnv) == "" {
		var skipped bool
		t.Run("skips without podman", func(t *testing.T) {
			defer func() { skipped = t.Skipped() }()
			nowhere := vmtest.NewPool(vm.Config{Image: env.Image}, func(ctx context.Context, cfg vm.Config) (vm.VM, error) {
				return vm.New(ctx, cfg, vm.WithURL("unix:///nonexistent/podvm.sock"))
			}, vm.WithPoolSize(0))
			defer nowhere.Close()
			nowhere.Sandbox(t)
		})
		assert.True(t, skipped)
	}
}
