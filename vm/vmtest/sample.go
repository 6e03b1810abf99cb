package vmtest

import (
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"testing"
)

// CasesEnv names the environment variable that, set to a regular
// expression, keeps [Run] and [RunParity] to the cases whose names it
// matches (unanchored).
const CasesEnv = "PODVM_PARITY_CASES"

// SampleEnv names the environment variable that, set to the name of one
// of the suite's samples ("transport", "server" or "rootless"), keeps [Run] and
// [RunParity] to its cases; with [CasesEnv] too, to the cases both keep.
// A run of what one kind of service adds (a transport, another Podman
// version, rootless) needs each kind of case that reaches that service,
// not every case again: see [RunSample].
const SampleEnv = "PODVM_PARITY_SAMPLE"

// samples are the suite's samples, by name, as lists of case names: a
// name that is not a case fails the run that asks for the sample, so a
// renamed case cannot drop out of one unseen.
var samples = map[string][]string{
	// What a transport adds (ssh://, tcp://, the service's attach as
	// the agent's channel): runs, streams, cancels and timeouts, the
	// lifecycle, a Config's every field as create flags, copies and file
	// calls, snapshots, held processes, services, the channel's cut.
	"transport": transport,
	// What another Podman (a version, rootless) adds to a transport:
	// every way a Podman call can fail or differ. Exec sessions' exit
	// codes and start errors, copies and each file call's failures,
	// every create flag and limit, kills of whole trees by timeout and
	// cancel, usage, every snapshot call. Left out are the cases that
	// differ only in what podvm does with Podman's answer, run in full
	// on Podman 4.3 rootful: names (glob-names and dash-names, the
	// costliest on the exec path), the agent's own streams and live
	// calls beyond a sample of each.
	"server": append(slices.Clone(transport),
		"exit/1", "exit/125-with-error-line", "exit/127-is-data", "exit/not-executable", "exit/not-found",
		"output/over-cap", "output/separate", "args/verbatim", "args/not-utf8",
		"stdin/unread", "stdin-stuck",
		"timeout/no-shell", "timeout/setsid-fork-bomb", "escape/timeout", "escape/cancel",
		"files/write-read", "files/write-size", "files/read-only", "files/planted-link", "files/socket",
		"files/failures", "files/copy-dir-out-unsafe", "files/no-host-copy", "files/lifecycle", "copy/paths",
		"hardening/fork-bomb", "hardening/large-input", "hardening/memory", "hardening/no-network",
		"hardening/read-only-rootfs", "hardening/restrict", "limits/per-command",
		"usage/cpu", "usage/memory", "workdir/not-a-directory",
		"lifecycle/create-cancelled", "lifecycle/remove-twice", "lifecycle/uncreated",
		"snapshot/holds-the-layer", "snapshot/invalid", "snapshot/read-only-tmpfs", "snapshot/remove",
		"process/timeout", "service/limit", "checkpoint/support", "checkpoint/fork"),
	// What rootless Podman adds to a transport: limits it may not
	// enforce, ownership through a user namespace, kills of whole trees
	// in a delegated cgroup, usage, snapshots of its own storage. Its
	// Podman is the version the full suite runs on, rootful: its calls
	// fail and answer as there.
	"rootless": append(slices.Clone(transport),
		"hardening/fork-bomb", "hardening/memory", "hardening/no-network", "hardening/read-only-rootfs",
		"hardening/restrict", "limits/per-command", "usage/cpu", "usage/memory",
		"timeout/setsid-fork-bomb", "escape/timeout", "escape/cancel", "process/timeout",
		"files/write-read", "files/write-size", "files/read-only", "copy/paths",
		"snapshot/holds-the-layer", "snapshot/remove", "checkpoint/support"),
}

var transport = []string{
	"exit/0", "exit/7", "exit/signal", "output/10MB", "output/both-busy",
	"stdin", "stdin/large-unread", "cancel", "cancel/in-flight", "timeout", "timeout/in-flight", "concurrent",
	"lifecycle/config", "hardening/defaults", "env/merge", "user", "workdir",
	"lifecycle/create-failures", "lifecycle/remove-during-run", "lifecycle/removed-behind-its-back", "lifecycle/unavailable",
	"copy/round-trip", "files/read-dir", "files/errors", "files/copy-dir",
	"snapshot/lifecycle", "snapshot/run-in-flight",
	"process/held", "process/kill", "process/container-gone",
	"service/dial", "service/forward", "service/unix", "service/container-gone",
	"channel/cut", "terminal/shell", "live/refused", "agent/hostile-root", "agent/replaced-file",
}

// RunSample is [Run] on the cases of the suite's sample name (see
// [SampleEnv]): for a backend that is another way to reach a service the
// full suite runs on.
func RunSample(t *testing.T, h Harness, name string) {
	runSuite(t, h, name)
}

// selectCases returns the indices in cs of the cases in sample (all when
// it is ""),
// further kept to those of the environment's [SampleEnv] and [CasesEnv].
// A sample that names an unknown case, a bad expression or a selection
// that keeps nothing fails t.
func selectCases(t *testing.T, cs []testCase, sample string) []int {
	t.Helper()
	keep := func(testCase) bool { return true }
	and := func(f func(testCase) bool) {
		prev := keep
		keep = func(c testCase) bool { return prev(c) && f(c) }
	}
	for _, name := range []string{sample, os.Getenv(SampleEnv)} {
		if name == "" {
			continue
		}
		in, err := sampleOf(cs, name)
		if err != nil {
			t.Fatal(err)
		}
		and(func(c testCase) bool { return in[c.Name] })
	}
	if expr := os.Getenv(CasesEnv); expr != "" {
		re, err := regexp.Compile(expr)
		if err != nil {
			t.Fatalf("%s: %v", CasesEnv, err)
		}
		and(func(c testCase) bool { return re.MatchString(c.Name) })
	}
	var kept []int
	for i, c := range cs {
		if keep(c) {
			kept = append(kept, i)
		}
	}
	if len(kept) == 0 {
		t.Fatalf("vmtest: the selection (sample %q, %s=%q, %s=%q) keeps no case", sample, SampleEnv, os.Getenv(SampleEnv), CasesEnv, os.Getenv(CasesEnv))
	}
	if len(kept) < len(cs) {
		t.Logf("vmtest: %d cases of %d (sample %q, %s=%q, %s=%q)", len(kept), len(cs), sample, SampleEnv, os.Getenv(SampleEnv), CasesEnv, os.Getenv(CasesEnv))
	}
	return kept
}

// sampleOf returns the case names of the sample name, each checked to be
// a case of cs.
func sampleOf(cs []testCase, name string) (map[string]bool, error) {
	names, ok := samples[name]
	if !ok {
		return nil, fmt.Errorf("vmtest: no sample %q (want one of %q)", name, slices.Sorted(maps.Keys(samples)))
	}
	in := map[string]bool{}
	for _, n := range names {
		if !slices.ContainsFunc(cs, func(c testCase) bool { return c.Name == n }) {
			return nil, fmt.Errorf("vmtest: sample %q names %q, which is no case of the suite", name, n)
		}
		in[n] = true
	}
	return in, nil
}
