package libpod

import (
	"bytes"
	"sync/atomic"
	"testing"
)

// Podman 4.3's own line about a stdin nobody read is dropped; anything
// else, the same words inside a longer write included, passes. Dropping
// it marks the session cut: its output may be short.
func TestDropAttachReset(t *testing.T) {
	var b bytes.Buffer
	var cut atomic.Bool
	w := dropAttachReset{&b, &cut}
	for _, p := range []string{
		"Error: write unixpacket @->/proc/self/fd/16/attach: write: connection reset by peer\n",
		"Error: write unixpacket @->/proc/self/fd/9/attach: write: broken pipe\n",
		"mine\n",
		"x Error: write unixpacket @->/proc/self/fd/16/attach: write: broken pipe\n",
	} {
		n, err := w.Write([]byte(p))
		if err != nil || n != len(p) {
			t.Fatalf("Write(%q) = %d, %v", p, n, err)
		}
	}
	if want := "mine\nx Error: write unixpacket @->/proc/self/fd/16/attach: write: broken pipe\n"; b.String() != want {
		t.Errorf("got %q; want %q", b.String(), want)
	}
	if !cut.Load() {
		t.Error("the session is not marked cut")
	}
}
