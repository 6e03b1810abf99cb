package vm_test

import (
	"context"
	"os"
	osexec "os/exec"
	"strings"
	"testing"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/vmtest"
)

// brokenVM swaps stdout and stderr and hides the exit status: a backend
// the suite must reject.
type brokenVM struct{ vm.VM }

func (b brokenVM) Run(ctx context.Context, cmd exec.Command) (*exec.Result, error) {
	res, err := b.VM.Run(ctx, cmd)
	if res != nil {
		res.Stdout, res.Stderr, res.ExitCode = res.Stderr, res.Stdout, 0
	}
	return res, err
}

type brokenHarness struct{ vmtest.Harness }

func (b brokenHarness) NewVM(t *testing.T, cfg vm.Config) (vm.VM, error) {
	v, err := b.Harness.NewVM(t, cfg)
	if err != nil {
		return nil, err
	}
	return brokenVM{v}, nil
}

// TestBrokenBackend is the suite run against brokenVM; it only runs when
// TestConformanceCatchesABrokenBackend starts it, and must fail there.
func TestBrokenBackend(t *testing.T) {
	if os.Getenv("PODVM_TEST_BROKEN") == "" {
		t.Skip("run by TestConformanceCatchesABrokenBackend")
	}
	vmtest.Run(t, brokenHarness{cliHarness(podmantest.Need(t), false)})
}

// The suite can fail: against a backend that swaps the streams and
// drops exit codes, the cases that check them fail, and those that do not
// look at them still pass.
func TestConformanceCatchesABrokenBackend(t *testing.T) {
	podmantest.Need(t)
	cmd := osexec.Command(os.Args[0], "-test.run=^TestBrokenBackend$/^(output|exit)$/^(separate|7|empty)$", "-test.v")
	cmd.Env = append(os.Environ(), "PODVM_TEST_BROKEN=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the suite passed a broken backend:\n%s", out)
	}
	for _, want := range []string{"--- FAIL: TestBrokenBackend/output/separate", "--- FAIL: TestBrokenBackend/exit/7", "--- PASS: TestBrokenBackend/output/empty"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
