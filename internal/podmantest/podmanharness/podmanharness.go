// Package podmanharness is the [vmtest.Harness] of podvm's Podman
// backends on the service of a [podmantest.Env], shared by the tests of
// vm (the conformance and parity suites of APIVM and CLIVM) and of
// vm/kube (its parity against APIVM). It is a package of its own, not
// part of podmantest, because it imports vm, whose in-package tests
// import podmantest. It never runs a command itself.
package podmanharness

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

// Harness is a Podman backend on Env's service as the suite sees it: VMs
// made by New, and Podman seen through its API directly.
type Harness struct {
	// Env is the service the VMs run on.
	Env podmantest.Env
	// New makes a VM, not yet created, for cfg: with the options
	// Unreachable when NewUnreachableVM calls it, with none otherwise.
	New func(cfg vm.Config, opts ...vm.Option) (vm.VM, error)
	// Unreachable are the options that point New at no Podman.
	Unreachable []vm.Option
	// PodmanExec runs the VMs' commands as Podman exec sessions, set as
	// their Config.PodmanExec; otherwise they go through podvm's agent.
	PodmanExec bool
	// Restore are the options that make vm.Restore use New's backend on
	// Env's service.
	Restore []vm.Option
}

var (
	_ vmtest.Harness    = Harness{}
	_ vmtest.MountDirer = Harness{}
	_ vmtest.Restorer   = Harness{}
)

// RestoreOptions implements [vmtest.Restorer].
func (h Harness) RestoreOptions() []vm.Option { return h.Restore }

// unreachableURL is a Podman service that does not exist.
const unreachableURL = "unix:///nonexistent/podvm.sock"

// API is APIVM on env's service; podmanExec runs its commands as Podman
// exec sessions instead of through the agent.
func API(env podmantest.Env, podmanExec bool) Harness {
	return Harness{Env: env, New: func(cfg vm.Config, opts ...vm.Option) (vm.VM, error) {
		uri := env.Host
		if len(opts) > 0 {
			uri = unreachableURL
		}
		return vm.NewAPIVM(context.Background(), uri, cfg)
	}, Unreachable: []vm.Option{vm.WithURL(unreachableURL)}, PodmanExec: podmanExec,
		Restore: []vm.Option{vm.WithBackend(vm.BackendAPI), vm.WithURL(env.Host)}}
}

// NewVM returns New's VM for cfg as [Sandbox] adjusts it, with Env's
// image when cfg has none.
func (h Harness) NewVM(t *testing.T, cfg vm.Config) (vm.VM, error) {
	if cfg.Image == "" {
		cfg.Image = h.Env.Image
	}
	cfg.PodmanExec = h.PodmanExec
	return h.New(Sandbox(h.Env, cfg))
}

// NewUnreachableVM returns New's VM for cfg, with Env's image, pointed
// at no Podman.
func (h Harness) NewUnreachableVM(t *testing.T, cfg vm.Config) (vm.VM, error) {
	cfg.Image = h.Env.Image
	cfg.PodmanExec = h.PodmanExec
	return h.New(cfg, h.Unreachable...)
}

// Tracked reports whether runs go through podvm's agent: when they are
// not Podman exec sessions.
func (h Harness) Tracked() bool { return !h.PodmanExec }

// MountDir is $PODVM_TEST_MOUNT_DIR, a directory the service can
// bind-mount (scripts/test-matrix.sh sets it for Podman 5, whose service
// has a filesystem of its own), else the system's temporary directory.
func (h Harness) MountDir() string { return cmp.Or(os.Getenv("PODVM_TEST_MOUNT_DIR"), os.TempDir()) }

// RemoveContainer removes container id through Podman's API.
func (h Harness) RemoveContainer(ctx context.Context, id string) error {
	c, err := libpod.Connect(ctx, h.Env.Host)
	if err != nil {
		return err
	}
	defer c.CloseIdleConnections()
	return c.ContainerRemove(ctx, id)
}

// Containers lists, through Podman's API, the containers that carry
// label; one removed while it lists is left out.
func (h Harness) Containers(ctx context.Context, label string) ([]vmtest.Container, error) {
	c, err := libpod.Connect(ctx, h.Env.Host)
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

// NoPidsEnv, set to 1, tells a test's child process (vm's
// crashAfterCreate) to ask for no pids limit, as [Sandbox] does.
const NoPidsEnv = "PODVM_TEST_NO_PIDS_LIMIT"

// Sandbox is cfg as the tests run it on env's service: with
// vm.NoPidsLimit where the service refuses every pids limit (rootless
// Podman without the pids controller) and cfg asks for none, so that
// what does not depend on the limit is tested there too.
func Sandbox(env podmantest.Env, cfg vm.Config) vm.Config {
	if cfg.Pids == 0 && (env.PidsUnenforced || os.Getenv(NoPidsEnv) == "1") {
		cfg.Pids = vm.NoPidsLimit
	}
	return cfg
}
