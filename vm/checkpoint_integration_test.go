package vm_test

import (
	"context"
	"fmt"
	"os"
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
	for name, h := range map[string]func(bool) vmHarness{"api": apiNew(env), "cli": cliNew(env)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
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
				res, err := v.Run(ctx, exec.Command{Name: "cat", Args: []string{"/tmp/state"}})
				require.NoError(t, err, "nothing changed")
				assert.Equal(t, "kept", res.Stdout)
				return
			}
			late := make(chan *exec.Result, 1)
			go func() {
				res, err := v.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", "sleep 1; echo late"}})
				assert.NoError(t, err)
				late <- res
			}()
			time.Sleep(300 * time.Millisecond) // the Run is under way
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
			select {
			case res := <-late:
				assert.Equal(t, "late\n", res.Stdout, "the Run in flight went on")
			case <-time.After(30 * time.Second):
				t.Fatal("the Run in flight did not end after Resume")
			}
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
}

// testVM returns a VM of the test image made by h, not created, removed
// when the test ends; without a pids limit where the service enforces
// none.
func testVM(t *testing.T, env podmantest.Env, h vmHarness) vm.VM {
	t.Helper()
	cfg := vm.Config{Image: env.Image}
	if env.PidsUnenforced {
		cfg.Pids = vm.NoPidsLimit
	}
	v, err := h(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, v.Remove(context.Background())) })
	return v
}
