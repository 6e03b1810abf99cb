//go:build !linux

package exec

// awaitExit cannot wait without reaping here; the group is killed right
// after the leader is reaped instead.
func awaitExit(pid int) {}
