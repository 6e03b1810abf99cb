package kube_test

import (
	"context"
	"testing"

	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/vmtest"
)

// apiHarness is APIVM on the Podman service of env, for the parity test:
// the kube backend's results must be Podman's, case by case.
type apiHarness struct {
	env  podmantest.Env
	exec bool
}

func (h apiHarness) NewVM(t *testing.T, cfg vm.Config) (vm.VM, error) {
	if cfg.Image == "" {
		cfg.Image = h.env.Image
	}
	cfg.PodmanExec = h.exec
	return vm.NewAPIVM(context.Background(), h.env.Host, cfg)
}

func (h apiHarness) NewUnreachableVM(t *testing.T, cfg vm.Config) (vm.VM, error) {
	cfg.Image = h.env.Image
	cfg.PodmanExec = h.exec
	return vm.NewAPIVM(context.Background(), "unix:///nonexistent/podvm.sock", cfg)
}

func (h apiHarness) RemoveContainer(ctx context.Context, id string) error {
	c, err := libpod.Connect(ctx, h.env.Host)
	if err != nil {
		return err
	}
	defer c.CloseIdleConnections()
	return c.ContainerRemove(ctx, id)
}

func (h apiHarness) Containers(ctx context.Context, label string) ([]vmtest.Container, error) {
	c, err := libpod.Connect(ctx, h.env.Host)
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
		if info, err := c.ContainerInspect(ctx, l.ID); err == nil {
			out = append(out, vmtest.Container{ID: l.ID, Name: info.Name, Labels: l.Labels})
		}
	}
	return out, nil
}

func (h apiHarness) Tracked() bool { return !h.exec }

// TestParity runs every conformance case on the kube backend and on
// APIVM and requires the same results, field by field (Duration and
// Usage excepted); a case either skips is not compared. It needs both a
// cluster and a Podman service.
func TestParity(t *testing.T) {
	e := need(t)
	vmtest.RunParity(t, map[string]vmtest.Harness{"api": apiHarness{env: podmantest.Need(t)}, "kube": harness{e: e}})
}

func TestParityExec(t *testing.T) {
	e := need(t)
	vmtest.RunParity(t, map[string]vmtest.Harness{"api": apiHarness{env: podmantest.Need(t), exec: true}, "kube": execParity{harness{e: e, exec: true}}})
}

// execParity is the exec path's harness, with the one case whose result
// differs from Podman's by design named.
type execParity struct{ harness }

func (h execParity) Limits() map[string]string {
	l := h.harness.Limits()
	l["files/planted-link"] = "through exec sessions the kube backend's copies refuse a symlink the sandbox planted under their destination and replace one in a directory entry's place, as the agent's do, where Podman's archive endpoint follows the one (within the sandbox) and refuses the other; both keep the case's promise, the results differ"
	return l
}
