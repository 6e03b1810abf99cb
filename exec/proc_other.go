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

func exitCode(ps *os.ProcessState) int { return ps.ExitCode() }

func wasKilled(ps *os.ProcessState) bool { return !ps.Exited() }
