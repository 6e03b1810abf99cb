//go:build !linux

package exec

import osexec "os/exec"

// awaitExit cannot wait without reaping here; the group is killed right
// after the leader is reaped instead.
func awaitExit(pid int) {}

// enterCgroup is never called off Linux: there is no cgroup containment.
func enterCgroup(c *osexec.Cmd, fd int) {}
