package exec

import (
	"errors"

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
