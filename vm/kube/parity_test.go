package kube_test

import (
	"testing"

	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/internal/podmantest/podmanharness"
	"github.com/podvm/podvm/vm/vmtest"
)

// TestParity runs every conformance case on the kube backend and on
// APIVM and requires the same results, field by field (Duration and
// Usage excepted); a case either skips is not compared. It needs both a
// cluster and a Podman service. With TestParityExec, it is the
// conformance suite on Kubernetes, through the agent and through exec
// sessions: -run 'TestParity///kube$' runs the kube backend alone.
//
// APIVM's side of a case is taken from vm's parity when vmtest.RecordEnv
// names its record (make test runs vm's tests first, on the same service
// and code): then a case runs on Podman only where the record lacks it.
func TestParity(t *testing.T) {
	e := need(t)
	vmtest.RunParity(t, map[string]vmtest.Harness{"api": podmanharness.API(podmantest.Need(t), false), "kube": harness{e: e}}, vmtest.Replayed("api", "podman-api-agent"))
}

func TestParityExec(t *testing.T) {
	e := need(t)
	vmtest.RunParity(t, map[string]vmtest.Harness{"api": podmanharness.API(podmantest.Need(t), true), "kube": execParity{harness{e: e, exec: true}}}, vmtest.Replayed("api", "podman-api-exec"))
}

// execParity is the exec path's harness, with the one case whose result
// differs from Podman's by design named.
type execParity struct{ harness }

func (h execParity) Limits() map[string]string {
	l := h.harness.Limits()
	l["files/planted-link"] = "through exec sessions the kube backend's copies refuse a symlink the sandbox planted under their destination and replace one in a directory entry's place, as the agent's do, where Podman's archive endpoint follows the one (within the sandbox) and refuses the other; both keep the case's promise, the results differ"
	return l
}
