//go:build !linux

package cgroup

import (
	"fmt"
	"runtime"
	"time"
)

// Parent is where run cgroups are created; there is none off Linux.
type Parent struct{}

// Find reports that there is no cgroup v2 off Linux.
func Find(string) (*Parent, error) {
	return nil, fmt.Errorf("%w on %s", ErrUnavailable, runtime.GOOS)
}

// Controllers reports none.
func (*Parent) Controllers() (memory, pids bool) { return false, false }

// Dir is empty.
func (*Parent) Dir() string { return "" }

// Run is a run's cgroup; there is none off Linux.
type Run struct{}

// New fails off Linux.
func (*Parent) New(Limits) (*Run, error) { return nil, ErrUnavailable }

// FD is -1.
func (*Run) FD() int { return -1 }

// Kill does nothing.
func (*Run) Kill() {}

// Remove does nothing.
func (*Run) Remove() error { return nil }

// Finish does nothing.
func (*Run) Finish() (user, system time.Duration, peak int64, err error) { return 0, 0, -1, nil }
