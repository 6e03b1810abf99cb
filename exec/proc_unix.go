//go:build unix

package exec

import (
	"os"
	osexec "os/exec"
	"runtime"
	"syscall"
	"time"
)

// setProcessGroup starts c in a new process group whose id is its pid.
func setProcessGroup(c *osexec.Cmd) {
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// killGroup kills every process of the group led by pid.
func killGroup(pid int) { _ = syscall.Kill(-pid, syscall.SIGKILL) }

// exitStatus maps a finished process's state: its exit status, or
// 128+signal when a signal killed it, and whether that was SIGKILL.
func exitStatus(ps *os.ProcessState) (code int, killed bool) {
	ws, ok := ps.Sys().(syscall.WaitStatus)
	if !ok {
		return ps.ExitCode(), false
	}
	return waitStatus(ws)
}

func waitStatus(ws syscall.WaitStatus) (code int, killed bool) {
	if ws.Signaled() {
		return 128 + int(ws.Signal()), ws.Signal() == syscall.SIGKILL
	}
	return ws.ExitStatus(), false
}

// rusage is the usage the kernel reported for a waited process: its own
// and that of the descendants it waited for.
func rusage(ps *os.ProcessState) *Usage {
	ru, ok := ps.SysUsage().(*syscall.Rusage)
	if !ok {
		return nil
	}
	unit := int64(1024) // ru_maxrss is in KiB, except on macOS
	if runtime.GOOS == "darwin" || runtime.GOOS == "ios" {
		unit = 1
	}
	return &Usage{
		UserCPU:   time.Duration(ru.Utime.Nano()),
		SystemCPU: time.Duration(ru.Stime.Nano()),
		PeakRSS:   int64(ru.Maxrss) * unit,
	}
}
