package vm_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
)

// CheckpointSupport answers for the service and the kind of sandbox
// without touching the VM it is given, and leaves no probe behind. On
// the Podman 5.4 rig (PODVM_SERVER=podman5: CRIU 4.1) sandboxes with the
// agent can be checkpointed; Podman exec sandboxes cannot, for CRIU 4.1
// does not restore the bind mount of Podman's init (/run/podman-init)
// there. Everywhere else this project tests (Podman 4.3 with Debian 12's
// CRIU, rootless) both are refused, naming why.
//
// Not parallel, nor TestSuspendResume: it looks for probe containers
// left, and a probe of the other's would be one.
func TestCheckpointSupport(t *testing.T) {
	env := podmantest.Need(t)
	rig := os.Getenv("PODVM_SERVER") == "podman5"
	for name, h := range map[string]func(bool) vmHarness{"api": apiNew(env), "cli": cliNew(env)} {
		for _, podmanExec := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/podmanExec=%v", name, podmanExec), func(t *testing.T) { // one at a time: each looks for the other's probe
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				v := testVM(t, env, h(podmanExec))

				err := vm.CheckpointSupport(ctx, v)
				t.Logf("CheckpointSupport: %v", err)
				switch {
				case rig && !podmanExec:
					require.NoError(t, err)
				case rig:
					require.ErrorIs(t, err, vm.ErrNotSupported)
					assert.ErrorContains(t, err, "cannot restore a container")
				default:
					require.ErrorIs(t, err, vm.ErrNotSupported)
					assert.ErrorContains(t, err, "checkpoints: the Podman service")
				}
				assert.Empty(t, v.ID(), "the VM was not created")
				again := vm.CheckpointSupport(ctx, v)
				assert.Equal(t, err, again, "the answer is kept")

				left := podman(ctx, t, env, "ps", "-a", "-q", "--filter", "name=podvm-criu-probe-")
				assert.Empty(t, strings.TrimSpace(left), "probe containers left")
			})
		}
	}
}

// Suspend frees a sandbox and Resume brings it back as it was: a process
// held by handle answers on the same handle, a Run in flight ends after
// Resume, files are kept, and in between the sandbox's calls fail with
// ErrSuspended and its container has stopped; a suspended sandbox is
// removed as any other. Where checkpoints are not supported, Suspend
// says so and changes nothing.
func TestSuspendResume(t *testing.T) {
	env := podmantest.Need(t)
	rig := os.Getenv("PODVM_SERVER") == "podman5"
	eachBackend(t, env, 3*time.Minute, func(ctx context.Context, t *testing.T, name string, h func(bool) vmHarness) {
		v := testVM(t, env, h(false))
		require.NoError(t, v.Create(ctx))
		require.NoError(t, vm.WriteFile(ctx, v, "/tmp/state", []byte("kept"), 0o600))
		p, err := vm.Start(ctx, v, exec.Command{Name: "sh", Args: []string{"-c", "while read l; do echo got $l; done"}})
		require.NoError(t, err)
		out := func() string { _, b := p.Stdout().Bytes(); return string(b) }
		_, err = p.Stdin().Write([]byte("one\n"))
		require.NoError(t, err)
		require.Eventually(t, func() bool { return out() == "got one\n" }, 30*time.Second, 10*time.Millisecond)

		if !rig {
			err := vm.Suspend(ctx, v)
			t.Logf("Suspend: %v", err)
			require.ErrorIs(t, err, vm.ErrNotSupported)
			assert.ErrorContains(t, err, "checkpoints: the Podman service", "the engine's reason")
			res, err := v.Run(ctx, exec.Command{Name: "cat", Args: []string{"/tmp/state"}})
			require.NoError(t, err, "nothing changed")
			assert.Equal(t, "kept", res.Stdout)
			return
		}
		late := runLate(ctx, t, v)
		require.NoError(t, vm.Suspend(ctx, v))
		require.NoError(t, vm.Suspend(ctx, v), "again: nothing to do")
		_, err = v.Run(ctx, exec.Command{Name: "true"})
		require.ErrorIs(t, err, vm.ErrSuspended)
		_, err = vm.ReadFile(ctx, v, "/tmp/state", 100)
		require.ErrorIs(t, err, vm.ErrSuspended)
		assert.Equal(t, "exited", strings.TrimSpace(podman(ctx, t, env, "inspect", "--format", "{{.State.Status}}", v.ID())), "its memory freed")
		time.Sleep(1500 * time.Millisecond) // the Run's sleep would have ended by now

		require.NoError(t, vm.Resume(ctx, v))
		require.NoError(t, vm.Resume(ctx, v), "again: nothing to do")
		late(t, "the Run in flight went on after Resume")
		_, err = p.Stdin().Write([]byte("two\n"))
		require.NoError(t, err)
		require.Eventually(t, func() bool { return out() == "got one\ngot two\n" }, 30*time.Second, 10*time.Millisecond, "the same handle")
		b, err := vm.ReadFile(ctx, v, "/tmp/state", 100)
		require.NoError(t, err)
		assert.Equal(t, "kept", string(b))

		// Suspended, it is removed as any other, its checkpoint with it.
		require.NoError(t, vm.Suspend(ctx, v))
		id := v.ID()
		require.NoError(t, v.Remove(ctx))
		_, err = p.Wait(ctx)
		assert.Error(t, err, "the held process ended with its sandbox")
		assert.Empty(t, strings.TrimSpace(podman(ctx, t, env, "ps", "-a", "-q", "--filter", "id="+id)))
	})
}

// testVM returns a VM of the test image made by h, not created, removed
// when the test ends, checkpointable (its agent on its stdio); without a
// pids limit where the service enforces none.
func testVM(t *testing.T, env podmantest.Env, h vmHarness) vm.VM {
	t.Helper()
	cfg := vm.Config{Image: env.Image, Checkpointable: true}
	if env.PidsUnenforced {
		cfg.Pids = vm.NoPidsLimit
	}
	v, err := h(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, v.Remove(context.Background())) })
	return v
}

// A checkpoint of a running sandbox restores as copies of their own that
// go on from its instant: a process held by handle answers in each, on a
// new handle, with the memory it had (its counter; and its random
// generator, seeded before the checkpoint, yields the same numbers in
// every copy and in the original); files are kept; a Run in flight at
// the checkpoint ends in the original and is gone from the copies; each
// copy has its own container, name, token and owner. The checkpoint is
// listed, opened by ID, removed; a restore of a removed one is
// ErrCheckpointNotFound. Where checkpoints are not supported,
// TakeCheckpoint says so and writes nothing.
func TestCheckpointRestore(t *testing.T) {
	env := podmantest.Need(t)
	rig := os.Getenv("PODVM_SERVER") == "podman5"
	eachBackend(t, env, 3*time.Minute, func(ctx context.Context, t *testing.T, name string, h func(bool) vmHarness) {
		dir := checkpointDir(t)
		v := testVM(t, env, h(false))
		require.NoError(t, v.Create(ctx))
		require.NoError(t, vm.WriteFile(ctx, v, "/tmp/state", []byte("kept"), 0o600))
		// A warm process: what it counted, and its generator's state,
		// are in its memory alone.
		p, err := vm.Start(ctx, v, exec.Command{Name: "sh", Args: []string{"-c", `RANDOM=42; n=0; while read l; do n=$((n+1)); echo "$n $l $RANDOM"; done`}})
		require.NoError(t, err)
		_, err = p.Stdin().Write([]byte("a\n"))
		require.NoError(t, err)
		require.Eventually(t, func() bool { return strings.HasPrefix(outputOf(p), "1 a ") }, 30*time.Second, 10*time.Millisecond)

		if !rig {
			_, err := vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{Dir: dir})
			t.Logf("TakeCheckpoint: %v", err)
			require.ErrorIs(t, err, vm.ErrNotSupported)
			assert.ErrorContains(t, err, "checkpoints: the Podman service", "the engine's reason")
			entries, _ := os.ReadDir(dir)
			assert.Empty(t, entries, "nothing written")
			return
		}
		hostname := outputOfRun(ctx, t, v, "hostname")
		late := runLate(ctx, t, v)
		taken := time.Now().Unix()
		cp, err := vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{Dir: dir, Labels: map[string]string{"test": t.Name()}})
		require.NoError(t, err)
		assert.Equal(t, v.ID(), cp.Source)
		assert.Equal(t, env.Image, cp.Image)
		assert.Equal(t, "true", cp.Labels[vm.LabelCheckpoint])
		assert.Equal(t, t.Name(), cp.Labels["test"])
		fi, err := os.Stat(cp.Path)
		require.NoError(t, err)
		assert.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the archive is the caller's alone")
		assert.Equal(t, fi.Size(), cp.Size)

		late(t, "the Run in flight ended in the original")
		_, err = p.Stdin().Write([]byte("b\n"))
		require.NoError(t, err)
		require.Eventually(t, func() bool { return strings.Count(outputOf(p), "\n") == 2 }, 30*time.Second, 10*time.Millisecond, "the original goes on")
		want := strings.SplitAfter(outputOf(p), "\n")[1] // "2 b N": N its generator's next number

		copies := make([]vm.VM, 2)
		errs := make(chan error, len(copies))
		for i := range copies {
			go func() {
				c, err := vm.Restore(ctx, cp, vm.RestoreOptions{Labels: map[string]string{"copy": fmt.Sprint(i)}}, backendOf(env, name)...)
				if err == nil {
					copies[i] = c
					t.Cleanup(func() { assert.NoError(t, c.Remove(context.Background())) })
				}
				errs <- err
			}()
		}
		for range copies {
			require.NoError(t, <-errs)
		}
		ids := map[string]bool{v.ID(): true}
		for i, c := range copies {
			ids[c.ID()] = true
			labels := podman(ctx, t, env, "inspect", "--format", "{{json .Config.Labels}}", c.ID())
			assert.Contains(t, labels, fmt.Sprintf(`"%s":"%s"`, vm.LabelRestoredFrom, cp.ID))
			assert.Contains(t, labels, fmt.Sprintf(`"copy":"%d"`, i))
			procs := vm.Processes(c)
			require.Len(t, procs, 1, "the held process, adopted")
			assert.Equal(t, p.PID(), procs[0].PID())
			_, err = procs[0].Stdin().Write([]byte("b\n"))
			require.NoError(t, err)
			require.Eventually(t, func() bool { return outputOf(procs[0]) == want }, 30*time.Second, 10*time.Millisecond,
				"the copy goes on from the checkpoint: its counter, and its generator's next number, the original's")
			b, err := vm.ReadFile(ctx, c, "/tmp/state", 100)
			require.NoError(t, err)
			assert.Equal(t, "kept", string(b))
			res, err := c.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", "ps -o args | grep -c '[s]leep 1' || true"}})
			require.NoError(t, err)
			assert.Equal(t, "0\n", res.Stdout, "the Run in flight is the original's: gone from the copy")
			assert.Equal(t, hostname, outputOfRun(ctx, t, c, "hostname"), "the hostname is the source's")
			now, err := strconv.ParseInt(strings.TrimSpace(outputOfRun(ctx, t, c, "date", "+%s")), 10, 64)
			require.NoError(t, err)
			assert.True(t, now >= taken && now <= time.Now().Unix()+1, "the copy's clock is the host's, not the checkpoint's: %d, taken at %d", now, taken)
			require.NoError(t, vm.WriteFile(ctx, c, "/tmp/copy", []byte(fmt.Sprint(i)), 0o600))
		}
		assert.Len(t, ids, 3, "each copy is a container of its own")
		// No copy reaches another's channel, or the original's: each
		// held process heard its own input alone, and each sandbox
		// has its own files.
		assert.Equal(t, 2, strings.Count(outputOf(p), "\n"), "the original's process heard nothing of the copies'")
		for i, c := range copies {
			assert.Equal(t, want, outputOf(vm.Processes(c)[0]), "copy %d's process heard its own input alone", i)
			b, err := vm.ReadFile(ctx, c, "/tmp/copy", 100)
			require.NoError(t, err)
			assert.Equal(t, fmt.Sprint(i), string(b), "copy %d's files are its own", i)
		}
		_, err = vm.ReadFile(ctx, v, "/tmp/copy", 100)
		assert.ErrorIs(t, err, fs.ErrNotExist, "the original's files are its own")

		list, err := vm.ListCheckpoints(ctx, vm.WithCheckpointDir(dir), vm.WithLabel("test", t.Name()))
		require.NoError(t, err)
		require.Len(t, list, 1)
		assert.Equal(t, cp.ID, list[0].ID)
		opened, err := vm.OpenCheckpoint(cp.ID, vm.WithCheckpointDir(dir))
		require.NoError(t, err)
		assert.Equal(t, cp.Path, opened.Path)
		require.NoError(t, vm.RemoveCheckpoint(ctx, cp.ID, vm.WithCheckpointDir(dir)))
		entries, _ := os.ReadDir(dir)
		assert.Empty(t, entries, "nothing of it is left")
		_, err = vm.Restore(ctx, cp, vm.RestoreOptions{}, backendOf(env, name)...)
		require.ErrorIs(t, err, vm.ErrCheckpointNotFound)
	})
}

// runLate starts a Run in v that ends a second later, saying "late",
// and returns once it is under way; what it returns checks that the Run
// ended so, within 30 s.
func runLate(ctx context.Context, t *testing.T, v vm.VM) func(t *testing.T, what string) {
	late := make(chan *exec.Result, 1)
	go func() {
		res, err := v.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", "sleep 1; echo late"}})
		assert.NoError(t, err)
		late <- res
	}()
	time.Sleep(300 * time.Millisecond)
	return func(t *testing.T, what string) {
		t.Helper()
		select {
		case res := <-late:
			assert.Equal(t, "late\n", res.Stdout, what)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: it did not end", what)
		}
	}
}

// backendOf is the options that make vm.New (and Restore) take the
// backend of that name, as apiNew and cliNew make it.
func backendOf(env podmantest.Env, name string) []vm.Option {
	if name == "api" {
		return []vm.Option{vm.WithBackend(vm.BackendAPI), vm.WithURL(env.Host)}
	}
	x, mode := cliMode(env)
	opts := append(mode, vm.WithBackend(vm.BackendCLI), vm.WithPodman(env.Podman))
	if x != nil {
		opts = append(opts, vm.WithExecutor(x))
	}
	return opts
}

// outputOfRun is the stdout of a Run of name and args in v, which must
// succeed.
func outputOfRun(ctx context.Context, t *testing.T, v vm.VM, name string, args ...string) string {
	t.Helper()
	res, err := v.Run(ctx, exec.Command{Name: name, Args: args})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, "%s %v: %s", name, args, res.Stderr)
	return res.Stdout
}

// outputOf is what p wrote to its stdout so far.
func outputOf(p *vm.Process) string { _, b := p.Stdout().Bytes(); return string(b) }

// checkpointDir is a directory for a test's checkpoints, out of the
// temporary directory (which vm refuses), removed when the test ends.
func checkpointDir(t *testing.T) string {
	t.Helper()
	base, err := vm.DefaultCheckpointDir()
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(base, 0o700))
	dir, err := os.MkdirTemp(base, "test-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// A pool of copies of one checkpoint hands out copies restored ahead of
// the Get, each its own (its own container, its held process going on
// from the checkpoint on a handle of its own, its own answers), labelled
// with the pool; Close removes what is left, handed out or not.
func TestRestorePoolIntegration(t *testing.T) {
	env := checkpointRig(t)
	eachBackend(t, env, 4*time.Minute, func(ctx context.Context, t *testing.T, name string, h func(bool) vmHarness) {
		dir := checkpointDir(t)
		v, p := warmVM(ctx, t, env, h(false))
		stillRuns(ctx, t, v, p, 0) // it has counted one line
		cp, err := vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{Dir: dir, Remove: true})
		require.NoError(t, err)

		pool, err := vm.NewRestorePool(cp, vm.RestoreOptions{Labels: map[string]string{"suite": "restore-pool"}},
			func(ctx context.Context, cp *vm.Checkpoint, ro vm.RestoreOptions) (vm.VM, error) {
				return vm.Restore(ctx, cp, ro, backendOf(env, name)...)
			}, vm.WithPoolSize(2))
		require.NoError(t, err)
		defer func() {
			require.NoError(t, pool.Close(context.Background()))
			assert.Empty(t, copiesOf(context.Background(), t, env, cp.ID), "the pool's copies outlived Close")
		}()
		require.Eventually(t, func() bool { return pool.Stats().Ready == 2 }, 2*time.Minute, 10*time.Millisecond, "%+v", pool.Stats())

		var ids []string
		for range 3 { // two ready, one restored for the Get
			c, err := pool.Get(ctx)
			require.NoError(t, err)
			ids = append(ids, c.ID())
			procs := vm.Processes(c)
			require.Len(t, procs, 1, "the copy's held process")
			stillRuns(ctx, t, c, procs[0], 1)
			labelled := podman(ctx, t, env, "ps", "-q", "--no-trunc", "--filter", "label="+vm.LabelPool+"="+pool.ID(), "--filter", "label=suite=restore-pool", "--filter", "id="+c.ID())
			assert.Equal(t, c.ID(), strings.TrimSpace(labelled), "the copy carries the pool's label and the caller's")
			if len(ids) == 1 {
				require.NoError(t, c.Remove(ctx)) // the others Close removes
			}
		}
		assert.Len(t, slices.Compact(slices.Sorted(slices.Values(ids))), 3, "each Get a copy of its own")
		assert.Equal(t, int64(3), pool.Stats().Handed)
	})
}

// The env of TestRestorePoolChild: the pool's ID and the directory of its
// checkpoint.
const (
	restorePoolChildEnv = "PODVM_TEST_RESTORE_POOL_CHILD"
	restorePoolDirEnv   = "PODVM_TEST_RESTORE_POOL_DIR"
)

// TestRestorePoolChild checkpoints a sandbox (removing it), fills a
// restore pool of the checkpoint with the ID it is given, takes a copy it
// never gives back, says "full", and waits to be killed.
func TestRestorePoolChild(t *testing.T) {
	id, dir := os.Getenv(restorePoolChildEnv), os.Getenv(restorePoolDirEnv)
	if id == "" || dir == "" {
		t.Skip("run by TestRestorePoolKilledWithAFullPool")
	}
	env := podmantest.Need(t)
	ctx := context.Background()
	cfg := vm.Config{Image: env.Image, Checkpointable: true}
	if env.PidsUnenforced {
		cfg.Pids = vm.NoPidsLimit
	}
	v, err := apiNew(env)(false)(cfg)
	require.NoError(t, err)
	require.NoError(t, v.Create(ctx))
	cp, err := vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{Dir: dir, Remove: true})
	require.NoError(t, err)
	p, err := vm.NewRestorePool(cp, vm.RestoreOptions{Labels: map[string]string{vm.LabelPool: id}},
		func(ctx context.Context, cp *vm.Checkpoint, ro vm.RestoreOptions) (vm.VM, error) {
			return vm.Restore(ctx, cp, ro, backendOf(env, "api")...)
		}, vm.WithPoolSize(2))
	require.NoError(t, err)
	_, err = p.Get(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool { s := p.Stats(); return s.Ready == 2 && s.Creating == 0 }, 2*time.Minute, 10*time.Millisecond)
	fmt.Println("full")
	time.Sleep(5 * time.Minute) // the parent kills us long before
}

// A process killed with a full restore pool (and a copy it never gave
// back) leaves copies that name it, and its checkpoint; Reap removes
// them: the copies by the pool's label (the checkpoint carries none),
// the checkpoint as a dead process's, by its source's.
func TestRestorePoolKilledWithAFullPool(t *testing.T) {
	env := checkpointRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	id := fmt.Sprintf("killed-restore-%d", time.Now().UnixNano())
	removePoolBoxes(t, env, id)
	dir := checkpointDir(t)

	killedWhenFull(t, "TestRestorePoolChild", restorePoolChildEnv+"="+id, restorePoolDirEnv+"="+dir)
	left := poolBoxes(ctx, t, env, id)
	require.Len(t, left, 3, "two ready, one handed out")
	cps, err := vm.ListCheckpoints(ctx, vm.WithCheckpointDir(dir))
	require.NoError(t, err)
	require.Len(t, cps, 1, "the child's checkpoint")

	removed, err := vm.Reap(ctx, 0, vm.WithURL(env.Host), vm.WithLabel(vm.LabelPool, id))
	require.NoError(t, err)
	assert.ElementsMatch(t, left, removed)
	assert.Empty(t, poolBoxes(ctx, t, env, id), "nothing of the killed pool remains")
	// The checkpoint is no pool's: narrowed by its source instead.
	removed, err = vm.Reap(ctx, 0, vm.WithURL(env.Host), vm.WithCheckpoints(), vm.WithCheckpointDir(dir),
		vm.WithLabel(vm.LabelCheckpointSource, cps[0].Labels[vm.LabelCheckpointSource]))
	require.NoError(t, err)
	assert.Equal(t, []string{cps[0].ID}, removed)
	cps, err = vm.ListCheckpoints(ctx, vm.WithCheckpointDir(dir))
	require.NoError(t, err)
	assert.Empty(t, cps, "the dead process's checkpoint is gone")
}
