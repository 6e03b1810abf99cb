//go:build !unix

package exec

import (
	"os"
	osexec "os/exec"
)

// Without process groups only the process itself can be killed.
func setProcessGroup(c *osexec.Cmd) {}

func killGroup(pid int) {
	if p, err := os.FindProcess(pid); err == nil {
		_ = p.Kill()
	}
}

func exitStatus(ps *os.ProcessState) (code int, killed bool) {
	return ps.ExitCode(), !ps.Exited()
}

func rusage(ps *os.ProcessState) *Usage { return nil }
