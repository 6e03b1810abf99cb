package vmtest

import (
	"slices"
	"testing"
)

// Every sample names cases of the suite only, each once, and keeps fewer
// than all: a renamed case fails here before it drops out of a CI row.
func TestSamplesNameCases(t *testing.T) {
	all := cases(nil)
	for name, list := range samples {
		in, err := sampleOf(all, name)
		if err != nil {
			t.Error(err)
			continue
		}
		if len(in) != len(list) {
			t.Errorf("sample %q names a case twice", name)
		}
		if len(in) >= len(all) {
			t.Errorf("sample %q keeps all %d cases: no sample", name, len(all))
		}
	}
	if _, err := sampleOf(all, "no-such-sample"); err == nil {
		t.Error("an unknown sample is accepted")
	}
	if !slices.Contains(samples["server"], "files/failures") || !slices.Contains(samples["server"], "agent/hostile-root") {
		t.Error("the server sample lost a file call's failures or the transport's cases")
	}
}

// The transport sample is in every other: a service that differs in its
// Podman differs in how it is reached too.
func TestSamplesHoldTransport(t *testing.T) {
	for name, list := range samples {
		for _, n := range samples["transport"] {
			if !slices.Contains(list, n) {
				t.Errorf("%s is in the transport sample, not in the %s sample", n, name)
			}
		}
	}
}
