package vmtest

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// fakeHarness makes VMs that are never created and remove at once: for
// cases that do not touch their sandbox.
type fakeHarness struct{ Harness }

func (fakeHarness) NewVM(*testing.T, vm.Config) (vm.VM, error) { return fakeVM{}, nil }
func (fakeHarness) Tracked() bool                              { return true }

type fakeVM struct{ vm.VM }

func (fakeVM) Remove(context.Context) error { return nil }

// A run records what a backend observed, bytes that are not UTF-8
// included, and a later run replays it without running the case; a skip
// is replayed as a skip. A recording run never replays.
func TestRecordedObservationsReplay(t *testing.T) {
	file := filepath.Join(t.TempDir(), "parity.rec")
	t.Setenv(RecordEnv, file)
	ran := map[string]int{}
	want := []observation{
		observe("binary", &exec.Result{Stdout: "bad-\xff\xfe\n", Stderr: "e", ExitCode: 7, StdoutBytes: 7, StderrBytes: 1, Truncated: true}, nil),
		observe("failed", nil, vm.ErrNotSupported),
		{Label: "no result", Err: "other: bad-\xff"},
	}
	cs := []testCase{
		{Name: "seen", Uncreated: true, Test: func(context.Context, *testing.T, vm.VM) []observation {
			ran["seen"]++
			return want
		}},
		{Name: "skipped", Uncreated: true, Test: func(_ context.Context, t *testing.T, _ vm.VM) []observation {
			ran["skipped"]++
			t.Skip("not here")
			return nil
		}},
	}
	h := fakeHarness{}
	// Recorded, then replayed.
	for round, k := range []recordKey{{key: "key"}, {key: "key", replay: true}} {
		rec := openRecorder(t)
		for _, c := range cs {
			var got []observation
			skipped := false
			t.Run(c.Name, func(t *testing.T) {
				defer func() { skipped = t.Skipped() }()
				got = observeRecorded(t, rec, k, c, h, newShared(t, h))
			})
			if c.Name == "skipped" {
				if !skipped {
					t.Errorf("round %d: the skipped case did not skip", round)
				}
				continue
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("round %d: observed %#v, want %#v", round, got, want)
			}
		}
	}
	if ran["seen"] != 1 || ran["skipped"] != 1 {
		t.Errorf("the cases ran %v times; want once each, then replayed", ran)
	}
	// Another key, no key, or recording again runs the case live.
	rec := openRecorder(t)
	for _, k := range []recordKey{{key: "other", replay: true}, {}, {key: "key"}} {
		t.Run("live", func(t *testing.T) { observeRecorded(t, rec, k, cs[0], h, newShared(t, h)) })
	}
	if ran["seen"] != 4 {
		t.Errorf("the case ran %d times; want 4", ran["seen"])
	}
}

// A record file that is not one fails the run that reads it, naming the
// line; a missing one holds nothing.
func TestRecordFileDamaged(t *testing.T) {
	file := filepath.Join(t.TempDir(), "parity.rec")
	if r, err := readRecord(file); err != nil || len(r.had) != 0 {
		t.Fatalf("a missing file: %v, %v", r, err)
	}
	r := &recorder{path: file}
	if err := r.add(record{Key: "k", Case: "c"}); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(file, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("not base64 gob\n")
	f.Close()
	if _, err := readRecord(file); err == nil || err.Error()[:6] != "line 2" {
		t.Errorf("a damaged line: %v; want line 2's error", err)
	}
}
