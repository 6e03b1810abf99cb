package exec

import (
	"errors"
	osexec "os/exec"

	"golang.org/x/sys/unix"
)

// awaitExit blocks until process pid has exited without reaping it, so its
// pid, and hence its process group id, cannot be reused while the group is
// killed.
func awaitExit(pid int) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// enterCgroup makes c start in the cgroup whose directory fd is open:
// clone3 with CLONE_INTO_CGROUP, so the child never runs outside it.
func enterCgroup(c *osexec.Cmd, fd int) {
	c.SysProcAttr.UseCgroupFD = true
	c.SysProcAttr.CgroupFD = fd
}
