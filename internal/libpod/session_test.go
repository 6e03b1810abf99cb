package libpod

import (
	"bytes"
	"testing"
)

// Podman 4.3's own line about a stdin nobody read is dropped; anything
// else, the same words inside a longer write included, passes.
func TestDropAttachReset(t *testing.T) {
	var b bytes.Buffer
	w := dropAttachReset{&b}
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
}
