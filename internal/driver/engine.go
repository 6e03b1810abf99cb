package driver

import (
	"context"
	"sync"
)

// This file is how a driver that package vm does not import (Kubernetes',
// whose client-go only its users should pay for) reaches vm's sandbox:
// the engine's own package (vm/kube) registers an [Opener] under a
// backend's name as it is imported, as database/sql drivers do, and
// builds sandboxes over its driver with [NewSandbox], which vm sets.

// Opener returns a driver for one sandbox of cfg (a vm.Config, as the
// caller gave it: its zero fields not yet defaulted), or, when cfg is
// nil, one to list and remove sandboxes with (vm.Reap). It refuses a
// config the engine cannot honour with an error matching
// [ErrNotSupported] or [ErrInvalidConfig].
type Opener func(ctx context.Context, cfg any) (Driver, error)

var engines sync.Map // backend name → Opener

// Register makes open the driver of the backend name. Registering a name
// twice panics.
func Register(name string, open Opener) {
	if _, dup := engines.LoadOrStore(name, open); dup {
		panic("driver: backend " + name + " registered twice")
	}
}

// Lookup returns the Opener registered for name.
func Lookup(name string) (Opener, bool) {
	o, ok := engines.Load(name)
	if !ok {
		return nil, false
	}
	return o.(Opener), true
}

// NewSandbox returns vm's sandbox (a vm.VM, not yet created) for cfg (a
// vm.Config, valid) over d; it closes d when it fails. Package vm sets it
// as it is initialised, so a package that imports vm may call it.
var NewSandbox func(d Driver, cfg any) (any, error)
