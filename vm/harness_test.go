package vm_test

import (
	"cmp"
	"context"
	"os"
	"testing"

	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/vmtest"
)

// harness is the conformance suite's view of one backend on env's
// service: VMs made by newVM, and Podman seen through its API directly.
type harness struct {
	env   podmantest.Env
	newVM func(cfg vm.Config, opts ...vm.Option) (vm.VM, error)
	// unreachable are the options that point newVM at no Podman.
	unreachable []vm.Option
	// tracked: runs go through podvm's agent, not Podman exec sessions.
	tracked bool
}

// apiHarness is APIVM on env's service; podmanExec runs its commands as
// Podman exec sessions instead of through the agent.
func apiHarness(env podmantest.Env, podmanExec bool) vmtest.Harness {
	return harness{env: env, newVM: func(cfg vm.Config, opts ...vm.Option) (vm.VM, error) {
		uri := env.Host
		if len(opts) > 0 {
			uri = "unix:///nonexistent/podvm.sock"
		}
		cfg.PodmanExec = podmanExec
		return vm.NewAPIVM(context.Background(), uri, cfg)
	}, unreachable: []vm.Option{vm.WithURL("unix:///nonexistent/podvm.sock")}, tracked: !podmanExec}
}

// cliHarness is CLIVM on env's service, as cliMode runs it.
func cliHarness(env podmantest.Env, podmanExec bool) vmtest.Harness {
	return harness{env: env, newVM: func(cfg vm.Config, opts ...vm.Option) (vm.VM, error) {
		x, mode := cliMode(env)
		cfg.PodmanExec = podmanExec
		return vm.NewCLIVM(cfg, x, append(append(mode, vm.WithPodman(env.Podman)), opts...)...)
	}, unreachable: []vm.Option{vm.WithPodman("/nonexistent/podman")}, tracked: !podmanExec}
}

func (h harness) NewVM(t *testing.T, cfg vm.Config) (vm.VM, error) {
	if cfg.Image == "" {
		cfg.Image = h.env.Image
	}
	return h.newVM(sandbox(h.env, cfg))
}

// noPidsEnv tells a test's child process (crashAfterCreate) to ask for
// no pids limit, as sandbox does.
const noPidsEnv = "PODVM_TEST_NO_PIDS_LIMIT"

// sandbox is cfg as the tests run it on env's service: with
// vm.NoPidsLimit where the service refuses every pids limit (rootless
// Podman without the pids controller) and cfg asks for none, so that
// what does not depend on the limit is tested there too.
func sandbox(env podmantest.Env, cfg vm.Config) vm.Config {
	if cfg.Pids == 0 && (env.PidsUnenforced || os.Getenv(noPidsEnv) == "1") {
		cfg.Pids = vm.NoPidsLimit
	}
	return cfg
}

func (h harness) NewUnreachableVM(t *testing.T, cfg vm.Config) (vm.VM, error) {
	cfg.Image = h.env.Image
	return h.newVM(cfg, h.unreachable...)
}

func (h harness) Tracked() bool { return h.tracked }

// MountDir is $PODVM_TEST_MOUNT_DIR, a directory the service can
// bind-mount (scripts/test-matrix.sh sets it for Podman 5, whose service
// has a filesystem of its own), else the system's temporary directory.
func (h harness) MountDir() string { return cmp.Or(os.Getenv("PODVM_TEST_MOUNT_DIR"), os.TempDir()) }

func (h harness) client(ctx context.Context) (*libpod.Client, error) {
	return libpod.Connect(ctx, h.env.Host)
}

func (h harness) RemoveContainer(ctx context.Context, id string) error {
	c, err := h.client(ctx)
	if err != nil {
		return err
	}
	defer c.CloseIdleConnections()
	return c.ContainerRemove(ctx, id)
}

func (h harness) Containers(ctx context.Context, label string) ([]vmtest.Container, error) {
	c, err := h.client(ctx)
	if err != nil {
		return nil, err
	}
	defer c.CloseIdleConnections()
	list, err := c.ContainerList(ctx, label)
	if err != nil {
		return nil, err
	}
	var out []vmtest.Container
	for _, l := range list {
		info, err := c.ContainerInspect(ctx, l.ID)
		if err != nil {
			continue // removed meanwhile
		}
		out = append(out, vmtest.Container{ID: l.ID, Name: info.Name, Labels: l.Labels})
	}
	return out, nil
}

// The suite on every combination: each backend, with each way a Run
// travels (podvm's agent, the default, and Podman exec sessions).
func TestConformanceAPI(t *testing.T)     { vmtest.Run(t, apiHarness(podmantest.Need(t), false)) }
func TestConformanceCLI(t *testing.T)     { vmtest.Run(t, cliHarness(podmantest.Need(t), false)) }
func TestConformanceAPIExec(t *testing.T) { vmtest.Run(t, apiHarness(podmantest.Need(t), true)) }
func TestConformanceCLIExec(t *testing.T) { vmtest.Run(t, cliHarness(podmantest.Need(t), true)) }

// TestParity runs every conformance case on both backends and on both
// ways a call travels (podvm's agent and Podman exec sessions), and
// requires their Results to be identical, Duration and Usage excepted:
// the backends' always, the ways' where the case's promise holds on
// both (the file calls' failures, say). PODVM_PARITY_PATHS=agent keeps
// it to the agent's way (the matrix's ssh row: Podman exec over a remote
// connection is the 5.4 row's).
func TestParity(t *testing.T) {
	env := podmantest.Need(t)
	backends := map[string]vmtest.Harness{"cli": cliHarness(env, false), "api": apiHarness(env, false)}
	if os.Getenv("PODVM_PARITY_PATHS") != "agent" {
		backends["cli-exec"], backends["api-exec"] = cliHarness(env, true), apiHarness(env, true)
	}
	vmtest.RunParity(t, backends)
}
