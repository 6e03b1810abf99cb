// Package podman is how podvm talks to Podman: one [driver.Driver] per transport
// ([API] over the service's REST API, [CLI] through the podman command),
// and the one table by which Podman's failures are recognised for both
// (errors.go). A driver only talks Podman; the sandbox contract (vm's
// lifecycle, Run, the kill of a stopped run, the copies' guard) is written
// once, over a driver.Driver, in package vm.
package podman

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/podvm/podvm/internal/driver"
)

// initEntrypoint makes PID 1 Podman's init (catatonit) in pause mode: it
// keeps the sandbox alive and reaps orphans, and needs nothing from the
// image, not even /bin/sh.
var initEntrypoint = []string{"/run/podman-init", "-P"}

// IsLocal reports whether a Podman service URI (or none) is on this
// machine, where bind mount sources can be checked.
func IsLocal(uri string) bool { return uri == "" || strings.HasPrefix(uri, "unix://") }

// removeAgain calls remove until it does not fail with
// [driver.ErrContainerNotRunning], at most four times. Podman before 4.4 can
// refuse a forced removal of a container that exits by itself meanwhile
// ("cannot remove container … as it could not be stopped: … container
// state improper", podman#16142); by then it has stopped, and removing it
// again succeeds.
func removeAgain(ctx context.Context, remove func() error) error {
	err := remove()
	for try := 1; try < 4 && errors.Is(err, driver.ErrContainerNotRunning); try++ {
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
		err = remove()
	}
	return err
}
