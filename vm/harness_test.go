package vm_test

import (
	"os"
	"testing"

	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/internal/podmantest/podmanharness"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/vmtest"
)

// apiHarness is APIVM on env's service; podmanExec runs its commands as
// Podman exec sessions instead of through the agent.
func apiHarness(env podmantest.Env, podmanExec bool) vmtest.Harness {
	return podmanharness.API(env, podmanExec)
}

// cliHarness is CLIVM on env's service, as cliMode runs it.
func cliHarness(env podmantest.Env, podmanExec bool) vmtest.Harness {
	h := podmanharness.Harness{Env: env, New: func(cfg vm.Config, opts ...vm.Option) (vm.VM, error) {
		x, mode := cliMode(env)
		return vm.NewCLIVM(cfg, x, append(append(mode, vm.WithPodman(env.Podman)), opts...)...)
	}, Unreachable: []vm.Option{vm.WithPodman("/nonexistent/podman")}, PodmanExec: podmanExec,
		Restore: backendOf(env, "cli")}
	if podmanExec && env.RemoteOnly {
		return remoteCopies{h}
	}
	return h
}

// remoteCopies is a harness whose copies go through podman-remote's cp
// (Podman 5's client in the matrix), which drops the service's reason
// for a failure: docs/files.md says so, and the cases of those reasons
// are not this harness's to keep.
type remoteCopies struct{ podmanharness.Harness }

func (remoteCopies) Limits() map[string]string {
	why := "podman-remote's cp drops the service's reason (a 500 Internal Server Error): a read-only filesystem or a symlink loop is not told apart there (docs/files.md)"
	return map[string]string{"files/read-only": why, "files/failures": why}
}

// sandbox is cfg as the tests run it on env's service (see
// podmanharness.Sandbox).
var sandbox = podmanharness.Sandbox

// TestParity runs every conformance case on both backends and on both
// ways a call travels (podvm's agent and Podman exec sessions), and
// requires their Results to be identical, Duration and Usage excepted:
// the backends' always, the ways' where the case's promise holds on
// both (the file calls' failures, say). PODVM_PARITY_PATHS=agent keeps
// it to the agent's way (the matrix's ssh row: Podman exec over a remote
// connection is the 5.4 row's).
//
// It is the suite on every combination: each case runs once per backend
// and way, no more (a TestConformance per backend beside it ran every
// case twice). For one backend alone: -run 'TestParity///api$' (cli,
// api-exec, cli-exec).
//
// With vmtest.RecordEnv set, the api and api-exec backends' observations
// are recorded for vm/kube's parity, which compares with them instead
// of running every case on Podman again (make test does this).
func TestParity(t *testing.T) {
	env := podmantest.Need(t)
	backends := map[string]vmtest.Harness{"cli": cliHarness(env, false), "api": apiHarness(env, false)}
	// APIVM's observations are lent to vm/kube's parity through
	// vmtest.RecordEnv (make test sets it): the same keys there.
	recorded := []vmtest.ParityOption{vmtest.Recorded("api", "podman-api-agent")}
	if os.Getenv("PODVM_PARITY_PATHS") != "agent" {
		backends["cli-exec"], backends["api-exec"] = cliHarness(env, true), apiHarness(env, true)
		recorded = append(recorded, vmtest.Recorded("api-exec", "podman-api-exec"))
	}
	vmtest.RunParity(t, backends, recorded...)
}
