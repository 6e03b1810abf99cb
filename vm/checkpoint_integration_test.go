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
func TestCheckpointSupport(t *testing.T) {
	t.Parallel()
	env := podmantest.Need(t)
	rig := os.Getenv("PODVM_SERVER") == "podman5"
	for name, h := range map[string]func(bool) vmHarness{"api": apiNew(env), "cli": cliNew(env)} {
		for _, podmanExec := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/podmanExec=%v", name, podmanExec), func(t *testing.T) { // one at a time: each looks for the other's probe
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
				defer cancel()
				cfg := vm.Config{Image: env.Image}
				if env.PidsUnenforced {
					cfg.Pids = vm.NoPidsLimit
				}
				v, err := h(podmanExec)(cfg)
				require.NoError(t, err)
				defer func() { assert.NoError(t, v.Remove(context.Background())) }()

				err = vm.CheckpointSupport(ctx, v)
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
