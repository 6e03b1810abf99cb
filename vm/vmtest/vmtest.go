// Package vmtest is the conformance suite every podvm [vm.VM] backend must
// pass, in the shape of gocloud's drivertest: one table of cases, each
// stating the promise it checks, each on a fresh sandbox with its own
// deadline. [Run] runs it against one backend; [RunParity] runs each case
// on several backends and requires identical results.
//
// A backend that truly cannot do something returns an error matching
// [vm.ErrNotSupported], and the suite skips that case for it, naming why.
package vmtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// NewVM returns a VM, not yet created, for cfg. cfg.Image is empty: the
// harness sets the image it tests with.
type NewVM func(t *testing.T, cfg vm.Config) (vm.VM, error)

// Case is one promise of the VM contract.
type Case struct {
	// Name names the case in test output.
	Name string
	// Promise says which promise a failure breaks.
	Promise string
	// Config adjusts the sandbox's config; nil keeps the defaults.
	Config func(*vm.Config)
	// Uncreated hands Test a VM on which Create was not called.
	Uncreated bool
	// Deadline bounds the case, as a watchdog; zero means a minute.
	Deadline time.Duration
	// Test exercises v and returns what it observed, for comparison
	// across backends. It reports failures with t.Errorf/t.Fatalf.
	Test func(ctx context.Context, t *testing.T, v vm.VM) []Observation
}

// Observation is one outcome of a case, comparable across backends: the
// Result with its Duration zeroed, and the sentinel the error matched.
type Observation struct {
	Label  string
	Result *exec.Result
	Err    string
}

// sentinels are the errors an Observation names, most specific first.
var sentinels = []error{
	exec.ErrInvalidCommand, exec.ErrNotFound, exec.ErrPermission, exec.ErrDirNotFound, exec.ErrNotAllowed,
	vm.ErrInvalidConfig, vm.ErrNotCreated, vm.ErrAlreadyCreated, vm.ErrRemoved, vm.ErrNoSuchContainer,
	vm.ErrContainerNotRunning, vm.ErrImageNotFound, vm.ErrNameInUse, vm.ErrUnavailable, vm.ErrNotSupported,
	context.DeadlineExceeded, context.Canceled, vm.ErrPodman,
}

// Observe records res and err: Duration is dropped, err is reduced to the
// sentinel it matches ("other: ..." when none does).
func Observe(label string, res *exec.Result, err error) Observation {
	o := Observation{Label: label}
	if res != nil {
		r := *res
		r.Duration = 0
		o.Result = &r
	}
	if err != nil {
		o.Err = "other: " + err.Error()
		for _, s := range sentinels {
			if errors.Is(err, s) {
				o.Err = s.Error()
				break
			}
		}
	}
	return o
}

// Run runs every case of [Cases] against the backend newVM makes, each in
// a parallel subtest with a fresh sandbox.
func Run(t *testing.T, newVM NewVM) {
	for _, c := range Cases() {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			runCase(t, c, newVM)
		})
	}
}

// RunParity runs each case on every backend and requires the observations
// to be identical, field by field (Duration excepted).
func RunParity(t *testing.T, backends map[string]NewVM) {
	for _, c := range Cases() {
		t.Run(c.Name, func(t *testing.T) {
			t.Parallel()
			seen := map[string][]Observation{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			for name, newVM := range backends {
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Each backend in its own subtest, so that its failures
					// and skips stay its own.
					t.Run(name, func(t *testing.T) {
						obs := runCase(t, c, newVM)
						mu.Lock()
						seen[name] = obs
						mu.Unlock()
					})
				}()
			}
			wg.Wait()
			// The comparison's own row, beside each backend's.
			defer func() { writeRecord("parity", c.Name, testOutcome(t)) }()
			var first string
			for name := range backends {
				if seen[name] == nil {
					return // skipped or failed: nothing to compare
				}
				if first == "" {
					first = name
					continue
				}
				if diff := compare(seen[first], seen[name]); diff != "" {
					t.Errorf("%s: %s and %s differ (%s):\n%s", c.Name, first, name, c.Promise, diff)
				}
			}
		})
	}
}

func compare(a, b []Observation) string {
	if len(a) != len(b) {
		return fmt.Sprintf("%d observations vs %d", len(a), len(b))
	}
	var diffs []string
	for i := range a {
		x, y := a[i], b[i]
		if x.Label != y.Label || x.Err != y.Err || (x.Result == nil) != (y.Result == nil) {
			diffs = append(diffs, fmt.Sprintf("%s: error %q vs %q, result %v vs %v", x.Label, x.Err, y.Err, x.Result != nil, y.Result != nil))
			continue
		}
		if x.Result == nil {
			continue
		}
		r, s := *x.Result, *y.Result
		for _, f := range []struct {
			name string
			a, b any
		}{
			{"Stdout", clip(r.Stdout), clip(s.Stdout)},
			{"Stderr", clip(r.Stderr), clip(s.Stderr)},
			{"ExitCode", r.ExitCode, s.ExitCode},
			{"TimedOut", r.TimedOut, s.TimedOut},
			{"Truncated", r.Truncated, s.Truncated},
			{"StdoutBytes", r.StdoutBytes, s.StdoutBytes},
			{"StderrBytes", r.StderrBytes, s.StderrBytes},
		} {
			if f.a != f.b {
				diffs = append(diffs, fmt.Sprintf("%s: %s %v vs %v", x.Label, f.name, f.a, f.b))
			}
		}
		if r.Stdout != s.Stdout && clip(r.Stdout) == clip(s.Stdout) {
			diffs = append(diffs, x.Label+": Stdout differs beyond the first 200 bytes")
		}
	}
	return strings.Join(diffs, "\n")
}

func clip(s string) string {
	if len(s) > 200 {
		return fmt.Sprintf("%q...(%d bytes)", s[:200], len(s))
	}
	return fmt.Sprintf("%q", s)
}

func runCase(t *testing.T, c Case, newVM NewVM) (obs []Observation) {
	deadline := c.Deadline
	if deadline == 0 {
		deadline = time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	// Registered first, so it runs last and sees the cleanup's failures.
	t.Cleanup(func() { record(t, c) })

	var cfg vm.Config
	if c.Config != nil {
		c.Config(&cfg)
	}
	v, err := newVM(t, cfg)
	if err != nil {
		t.Fatalf("new VM: %v", err)
	}
	// Removed even when the case fails, with a context of its own.
	t.Cleanup(func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := v.Remove(rctx); err != nil {
			t.Errorf("Remove: %v", err)
		}
	})
	if !c.Uncreated {
		if err := v.Create(ctx); err != nil {
			skipIfNotSupported(t, err)
			t.Fatalf("Create: %v", err)
		}
	}
	// The watchdog: a case that outlives its deadline by far is hung, and
	// nothing short of stopping the process would unblock it.
	watchdog := time.AfterFunc(deadline+30*time.Second, func() {
		panic(fmt.Sprintf("vmtest watchdog: %s hung 30s past its %v deadline (%s)", t.Name(), deadline, c.Promise))
	})
	defer watchdog.Stop()
	obs = c.Test(ctx, t, v)
	if t.Failed() || t.Skipped() {
		return nil
	}
	return obs
}

func skipIfNotSupported(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, vm.ErrNotSupported) {
		t.Skipf("backend does not support this: %v", err)
	}
}

// record appends "backend<TAB>case<TAB>outcome" to the file named by
// PODVM_CONFORMANCE_LOG, from which `make test` prints its table.
func record(t *testing.T, c Case) {
	// The backend is the top-level test's name, or the parity subtest's.
	parts := strings.Split(t.Name(), "/")
	backend := strings.TrimPrefix(parts[0], "TestConformance")
	if parts[0] == "TestParity" {
		backend = "parity:" + parts[len(parts)-1]
	}
	writeRecord(backend, c.Name, testOutcome(t))
}

func testOutcome(t *testing.T) string {
	switch {
	case t.Failed():
		return "FAIL"
	case t.Skipped():
		return "skip"
	}
	return "pass"
}

func writeRecord(backend, name, outcome string) {
	path := os.Getenv("PODVM_CONFORMANCE_LOG")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s\t%s\t%s\n", backend, name, outcome)
}
