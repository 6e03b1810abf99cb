package vm_test

import (
	"context"
	"testing"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// On rootless Podman without the pids controller (this host's cgroup v1,
// scripts/rootless-up.sh), podvm says so instead of pretending: the
// default pids limit, a memory and a CPU limit are refused by Create on
// both backends, leaving nothing behind, and a sandbox with NoPidsLimit
// runs. It skips on a service that enforces its limits.
func TestRootlessLimits(t *testing.T) {
	t.Parallel()
	env := podmantest.Need(t)
	if !env.PidsUnenforced {
		t.Skip("the service enforces pids limits (rootful, or cgroup v2 with delegation)")
	}
	for name, h := range map[string]func(bool) vmHarness{"api": apiNew(env), "cli": cliNew(env)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			for limit, cfg := range map[string]vm.Config{
				"pids":   {},
				"memory": {Pids: vm.NoPidsLimit, Memory: 64 << 20},
				"CPU":    {Pids: vm.NoPidsLimit, CPUs: 1},
			} {
				cfg.Image = env.Image
				v, err := h(false)(cfg)
				require.NoError(t, err)
				err = v.Create(ctx)
				require.ErrorIs(t, err, vm.ErrNotSupported, limit)
				assert.ErrorContains(t, err, "a "+limit+" limit: rootless Podman on cgroup")
				assert.Empty(t, v.ID(), "nothing was made")
				require.NoError(t, v.Remove(ctx))
			}
			for _, podmanExec := range []bool{false, true} {
				v, err := h(podmanExec)(vm.Config{Image: env.Image, Pids: vm.NoPidsLimit})
				require.NoError(t, err)
				require.NoError(t, v.Create(ctx))
				res, err := v.Run(ctx, exec.Command{Name: "echo", Args: []string{"hi"}})
				if assert.NoError(t, err) {
					assert.Equal(t, "hi\n", res.Stdout)
				}
				require.NoError(t, v.Remove(ctx))
			}
		})
	}
}

// vmHarness makes a VM for cfg.
type vmHarness func(cfg vm.Config) (vm.VM, error)

func apiNew(env podmantest.Env) func(bool) vmHarness {
	return func(podmanExec bool) vmHarness {
		return func(cfg vm.Config) (vm.VM, error) {
			cfg.PodmanExec = podmanExec
			return vm.NewAPIVM(context.Background(), env.Host, cfg)
		}
	}
}

func cliNew(env podmantest.Env) func(bool) vmHarness {
	return func(podmanExec bool) vmHarness {
		return func(cfg vm.Config) (vm.VM, error) {
			x, mode := cliMode(env)
			cfg.PodmanExec = podmanExec
			return vm.NewCLIVM(cfg, x, append(mode, vm.WithPodman(env.Podman))...)
		}
	}
}
