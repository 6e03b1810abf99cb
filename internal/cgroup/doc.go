// Package cgroup gives each run a cgroup v2 of its own, on Linux: created
// empty under a writable parent, entered by the run's first process at
// clone, killed whole with cgroup.kill, measured, and removed. Elsewhere
// [Find] reports that there is no cgroup v2.
package cgroup

import "errors"

// ErrUnavailable: no writable cgroup v2 with cgroup.kill here.
var ErrUnavailable = errors.New("cgroup: no writable cgroup v2")

// Limits caps a run's cgroup. A zero field means no limit.
type Limits struct {
	MemoryBytes int64 // memory.max (and memory.swap.max 0 where swap is accounted)
	Pids        int64 // pids.max
}
