// Package vmtest is the conformance suite every podvm [vm.VM] backend must
// pass, in the shape of gocloud's drivertest: [Run] takes a [Harness] for
// the backend under test and runs one table of cases, each stating the
// promise it checks, each on a fresh sandbox (those that only run a
// command share one) with its own deadline.
// [RunParity] runs each case on several backends and requires identical
// results. [Sandbox] is for users' own integration tests.
//
// A backend that truly cannot do something returns an error matching
// [vm.ErrNotSupported], and the suite skips that case for it, naming why.
package vmtest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// Harness is what the suite needs of a backend beside its VMs: a way to
// make them, and a view of Podman that does not go through them, to check
// what they did. Each method may be called from parallel subtests.
type Harness interface {
	// NewVM returns a VM, not yet created, for cfg. When cfg.Image is
	// empty it sets the image it tests with: a busybox image with /bin/sh
	// at least. t is the case's test, or, for the sandbox the Shared
	// cases share, the suite's own (called from a case's goroutine: NewVM
	// must not stop t).
	NewVM(t *testing.T, cfg vm.Config) (vm.VM, error)
	// NewUnreachableVM returns a VM, not yet created, whose Podman cannot
	// be reached (no service, no binary), or an error matching
	// [vm.ErrNotSupported].
	NewUnreachableVM(t *testing.T, cfg vm.Config) (vm.VM, error)
	// RemoveContainer removes container id through Podman directly,
	// behind the back of the VM that made it.
	RemoveContainer(ctx context.Context, id string) error
	// Containers lists the containers, running or not, that carry label
	// ("key=value"), as Podman sees them.
	Containers(ctx context.Context, label string) ([]Container, error)
	// Tracked reports whether the VMs it makes run commands the way that
	// tracks every process of a run and reports its usage (podvm's agent).
	// The cases then require both; where it is false (Podman exec
	// sessions) they accept the documented escape and an unknown usage.
	Tracked() bool
}

// Limiter is implemented by a [Harness] whose backend cannot keep some
// promises on the machine under test for a reason outside podvm (a
// cluster whose network plugin enforces no NetworkPolicy, say): Limits
// maps the names of those cases to the reason, and the suite skips them,
// printing it. A limit that a backend could lift must be an error
// matching [vm.ErrNotSupported] instead, from NewVM or Create.
type Limiter interface {
	Limits() map[string]string
}

// LinkGuard is implemented by a [Harness] whose VMs' copies refuse, as
// podvm's agent does, to extract through a symlink that code in the
// sandbox planted under their destination, although their commands are
// not [Harness.Tracked] (the kube backend's exec path, whose tar script
// looks at the paths before it extracts). When GuardsPlantedLinks
// returns true the files/planted-link case requires the agent's results.
type LinkGuard interface {
	GuardsPlantedLinks() bool
}

// Container is a container as [Harness.Containers] lists it.
type Container struct {
	ID, Name string
	Labels   map[string]string
}

// testCase is one promise of the VM contract. Cases stay unexported: a
// backend runs them all through [Run]; their table is the suite's to
// change.
type testCase struct {
	// Name names the case in test output.
	Name string
	// Promise says which promise a failure breaks.
	Promise string
	// Config adjusts the sandbox's config; nil keeps the defaults.
	Config func(*vm.Config)
	// Setup, when set, adjusts the config as Config does, with the
	// case's t: for what must be cleaned up even when the backend
	// refuses the config and Test never runs.
	Setup func(t *testing.T, c *vm.Config)
	// Uncreated hands Test a VM on which Create was not called.
	Uncreated bool
	// Deadline bounds the case, as a watchdog; zero means a minute.
	Deadline time.Duration
	// AcrossPaths: the observations are the same whichever way the
	// calls travel (podvm's agent or Podman's exec sessions and copies,
	// [Harness.Tracked]), and [RunParity] compares them across both.
	// Without it, it compares backends of the same way only.
	AcrossPaths bool
	// Agent: the promise is made through podvm's agent alone (held
	// processes, terminals, services). The suite skips it on a backend
	// that is not [Harness.Tracked] (live/refused checks that such a
	// backend refuses these calls); on one that is, a skip is a failure.
	Agent bool
	// Shared: the case only runs commands that leave nothing behind, so
	// it runs on the one sandbox a run of the suite keeps for such cases
	// on each backend, not on a fresh one of its own (no Config, Setup
	// or Uncreated). A sandbox per command would cost the suite a Create
	// and a Remove each, and test nothing more.
	Shared bool
	// Test exercises v and returns what it observed, for comparison
	// across backends. It reports failures with t.Errorf/t.Fatalf.
	Test func(ctx context.Context, t *testing.T, v vm.VM) []observation
}

// observation is one outcome of a case, comparable across backends: the
// Result with its Duration zeroed, and the sentinel the error matched.
type observation struct {
	Label  string
	Result *exec.Result
	Err    string
}

// sentinels are the errors an observation names, most specific first.
var sentinels = []error{
	exec.ErrInvalidCommand, exec.ErrNotFound, exec.ErrPermission, exec.ErrDirNotFound, exec.ErrNotAllowed, exec.ErrUnsupported,
	vm.ErrInvalidConfig, vm.ErrNotCreated, vm.ErrAlreadyCreated, vm.ErrRemoved, vm.ErrNoSuchContainer,
	vm.ErrContainerNotRunning, vm.ErrImageNotFound, vm.ErrNameInUse, vm.ErrUnavailable, vm.ErrNotSupported,
	vm.ErrLimit, vm.ErrProcessDone, context.DeadlineExceeded, context.Canceled, vm.ErrPodman,
}

// Observe records res and err: Duration is dropped, err is reduced to the
// sentinel it matches ("other: ..." when none does).
func observe(label string, res *exec.Result, err error) observation {
	o := observation{Label: label}
	if res != nil {
		r := *res
		r.Duration, r.Usage = 0, nil // they differ from run to run
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

// Run runs every case against the backend h makes, each in a subtest
// with a fresh sandbox (the Shared ones on one they share), as many at
// once as -test.parallel allows.
func Run(t *testing.T, h Harness) { runSuite(t, h, "") }

func runSuite(t *testing.T, h Harness, sample string) {
	sh := newShared(t, h)
	cs := cases(h)
	at := selectCases(t, cs, sample)
	kept := make([]testCase, len(at))
	for j, i := range at {
		kept[j] = cs[i]
	}
	inOrder(t, kept, func(t *testing.T, j int) { runCase(t, kept[j], h, sh) })
}

// inOrder runs each case in a subtest, -test.parallel of them at a time,
// starting them in their order, and returns when all have ended. Not
// t.Parallel: parallel subtests start in no order, and a four-minute
// case that starts last runs on alone at the end (cases puts the
// longest first).
func inOrder(t *testing.T, cs []testCase, run func(t *testing.T, i int)) {
	n := runtime.GOMAXPROCS(0)
	if f := flag.Lookup("test.parallel"); f != nil {
		if v, err := strconv.Atoi(f.Value.String()); err == nil && v > 0 {
			n = v
		}
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(n, len(cs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				t.Run(cs[i].Name, func(t *testing.T) { run(t, i) })
			}
		}()
	}
	for i := range cs {
		next <- i
	}
	close(next)
	wg.Wait()
}

// shared is the sandbox the [testCase.Shared] cases of one run use on
// one backend: made by the first that asks, removed when the run ends.
type shared struct {
	parent *testing.T
	h      Harness
	mu     sync.Mutex
	v      vm.VM
}

// newShared returns t's shared sandbox on h, made on first use and
// removed in t's cleanup, after every subtest. h's NewVM is handed t,
// the suite's own test.
func newShared(t *testing.T, h Harness) *shared { return &shared{parent: t, h: h} }

// get returns the shared sandbox, created: the first call makes it, and
// a call after one that failed tries again (the failure is that case's,
// not every later one's).
func (s *shared) get(ctx context.Context) (vm.VM, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.v != nil {
		return s.v, nil
	}
	v, err := s.h.NewVM(s.parent, vm.Config{})
	if err != nil {
		return nil, err
	}
	if err := v.Create(ctx); err != nil {
		_ = remove(v) // what a failed Create made, if anything
		return nil, err
	}
	s.v = v
	s.parent.Cleanup(func() {
		if err := remove(v); err != nil {
			s.parent.Errorf("Remove of the shared sandbox: %v", err)
		}
	})
	return v, nil
}

// remove removes v, a minute at most.
func remove(v vm.VM) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return v.Remove(ctx)
}

// RunParity runs each case on every backend and requires the observations
// to be identical, field by field (Duration excepted): those of backends
// that run commands the same way ([Harness.Tracked]), and, for a case
// whose promise holds on every path, those of all backends. A backend
// named by a [Recorded] option lends its observations to a later run,
// one named by [Replayed] takes them from an earlier one (see
// [RecordEnv]).
func RunParity(t *testing.T, backends map[string]Harness, opts ...ParityOption) {
	o := parityOptions{keys: map[string]recordKey{}}
	for _, opt := range opts {
		opt(&o)
	}
	for name := range o.keys {
		if backends[name] == nil {
			t.Fatalf("vmtest: Recorded or Replayed names %q, not a backend of this run", name)
		}
	}
	rec := openRecorder(t)
	var names []string
	for name := range backends {
		names = append(names, name)
	}
	slices.Sort(names)
	sh := map[string]*shared{}
	for name, h := range backends {
		sh[name] = newShared(t, h)
	}
	// Each backend's cases, built once; every list in the suite's order.
	all := cases(nil)
	of := map[string][]testCase{}
	for name, h := range backends {
		of[name] = cases(h)
		if len(of[name]) != len(all) {
			t.Fatalf("vmtest: %s has %d cases, the suite %d", name, len(of[name]), len(all))
		}
		for i, c := range of[name] {
			if c.Name != all[i].Name {
				t.Fatalf("vmtest: the cases of %s are not in the order of the suite's: %s where %s is", name, c.Name, all[i].Name)
			}
		}
	}
	at := selectCases(t, all, "") // kept[j] is all[at[j]]
	kept := make([]testCase, len(at))
	for j, i := range at {
		kept[j] = all[i]
	}
	inOrder(t, kept, func(t *testing.T, j int) {
		c, i := kept[j], at[j]
		seen := map[string][]observation{}
		var mu sync.Mutex
		// The backends of one path at once, then those of the other:
		// as many sandboxes at a time as a parity run of one path.
		for _, tracked := range []bool{true, false} {
			var wg sync.WaitGroup
			for name, h := range backends {
				if h.Tracked() != tracked {
					continue
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					// Each backend in its own subtest, so that its failures
					// and skips stay its own; the case is built for it.
					t.Run(name, func(t *testing.T) {
						obs := observeRecorded(t, rec, o.keys[name], of[name][i], h, sh[name])
						mu.Lock()
						seen[name] = obs
						mu.Unlock()
					})
				}()
			}
			wg.Wait()
		}
		for j, a := range names {
			for _, b := range names[j+1:] {
				if !c.AcrossPaths && backends[a].Tracked() != backends[b].Tracked() {
					continue // the documented differences of the paths
				}
				if seen[a] == nil || seen[b] == nil {
					continue // skipped or failed: nothing to compare
				}
				if diff := compare(seen[a], seen[b]); diff != "" {
					t.Errorf("%s: %s and %s differ (%s):\n%s", c.Name, a, b, c.Promise, diff)
				}
			}
		}
	})
}

func compare(a, b []observation) string {
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

func runCase(t *testing.T, c testCase, h Harness, sh *shared) (obs []observation) {
	if l, ok := h.(Limiter); ok {
		if why, limited := l.Limits()[c.Name]; limited {
			t.Skipf("the backend cannot keep this promise here: %s", why)
		}
	}
	if c.Agent && !h.Tracked() {
		// live/refused checks, once per backend, that this path refuses
		// what only the agent does, naming why: a sandbox per case to
		// see each refuse again would cost the suite, not test more.
		t.Skip("a promise of podvm's agent: this path refuses it (see live/refused)")
	}
	if c.Agent && h.Tracked() {
		defer func() {
			if t.Skipped() {
				t.Errorf("skipped on a backend with podvm's agent, which must keep this promise (%s)", c.Promise)
			}
		}()
	}
	deadline := c.deadline()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	defer warnOnThinMargin(t, time.Now(), deadline)

	v, err := sandboxFor(ctx, t, c, h, sh)
	if err != nil {
		skipIfNotSupported(t, err)
		t.Fatal(err)
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

// deadline is the case's Deadline, a minute when it has none.
func (c testCase) deadline() time.Duration {
	if c.Deadline == 0 {
		return time.Minute
	}
	return c.Deadline
}

// sandboxFor returns the sandbox case c runs on: the shared one, or a
// fresh one of its own, made as c says and removed when t ends (even
// when the case fails, with a context of its own).
func sandboxFor(ctx context.Context, t *testing.T, c testCase, h Harness, sh *shared) (vm.VM, error) {
	if c.Shared {
		v, err := sh.get(ctx)
		if err != nil {
			return nil, fmt.Errorf("the shared sandbox: %w", err)
		}
		return v, nil
	}
	var cfg vm.Config
	if c.Config != nil {
		c.Config(&cfg)
	}
	if c.Setup != nil {
		c.Setup(t, &cfg)
	}
	v, err := h.NewVM(t, cfg)
	if err != nil {
		return nil, fmt.Errorf("new VM: %w", err)
	}
	t.Cleanup(func() {
		if err := remove(v); err != nil {
			t.Errorf("Remove: %v", err)
		}
	})
	if !c.Uncreated {
		if err := v.Create(ctx); err != nil {
			return nil, fmt.Errorf("Create: %w", err)
		}
	}
	return v, nil
}

// warnOnThinMargin logs a case that took more than half its deadline:
// on a colder or busier machine it is the next to time out. A log, not a
// failure: how long a case takes is the machine's, not the code's.
func warnOnThinMargin(t *testing.T, start time.Time, deadline time.Duration) {
	if took := time.Since(start); took > deadline/2 {
		t.Logf("vmtest: thin margin: took %v of its %v deadline", took.Round(time.Second), deadline)
	}
}

func skipIfNotSupported(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, vm.ErrNotSupported) {
		t.Skipf("backend does not support this: %v", err)
	}
}
