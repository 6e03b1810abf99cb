//go:build !linux

package exec

import "github.com/podvm/podvm/internal/cgroup"

// Init does nothing off Linux, where there is no subreaper containment.
// See the Linux documentation of Init.
func Init() {}

func helperReady() bool { return false }

const helperWhy = "Linux only"

func startHelper(cmd Command, env []string, files stdio, cg *cgroup.Run) (proc, error) {
	return nil, ErrUnsupported
}
