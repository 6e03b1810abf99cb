package driver

import (
	"context"
	"sync"
)

// This file is how a driver that package vm does not import (Kubernetes',
// whose client-go only its users should pay for) reaches vm's sandbox:
// the engine's own package (vm/kube) registers an [Opener] under a
// backend's name as it is imported, as database/sql drivers do, and
// vm.New opens it by that name.

// Opener returns a driver for one sandbox of spec (vm's Config, mapped
// and defaulted; the driver must not keep the pointer), or, when spec is
// nil, one to list and remove sandboxes with (vm.Reap). It refuses a spec
// the engine cannot honour with an error matching [ErrNotSupported] or
// [ErrInvalidConfig], before anything is sent to the engine.
type Opener func(ctx context.Context, spec *Spec) (Driver, error)

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
