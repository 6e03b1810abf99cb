package testkit

import (
	"os/exec"
	"testing"
)

// Shells returns the POSIX shells of this machine that scripts run in
// sandboxes must work on, each as its argv (images have busybox's ash,
// dash or bash as /bin/sh). It fails t when there is none.
func Shells(t testing.TB) [][]string {
	t.Helper()
	var found [][]string
	for _, sh := range [][]string{{"dash"}, {"bash"}, {"busybox", "sh"}} {
		if p, err := exec.LookPath(sh[0]); err == nil {
			found = append(found, append([]string{p}, sh[1:]...))
		}
	}
	if len(found) == 0 {
		t.Fatal("no POSIX shell on this machine: dash, bash or busybox")
	}
	return found
}
