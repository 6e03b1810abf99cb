package driver

import (
	"context"
	"fmt"
)

// This file is an optional capability of a [Driver]: an engine that may
// not enforce every limit a [Spec] asks for says so before anything is
// made. A driver without it enforces, or refuses, every limit itself.

// Limiter is a [Driver] whose engine can tell what it enforces.
type Limiter interface {
	// Limits checks spec against what the engine enforces, before
	// anything is made. A limit it cannot enforce fails with a
	// *[LimitError] (it matches [ErrNotSupported]). Errors reaching the
	// engine match [ErrUnavailable], as any call's.
	Limits(ctx context.Context, spec Spec) error
}

// LimitError is a limit of a [Spec] the engine cannot enforce (rootless
// Podman without the limit's cgroup controller): it matches
// [ErrNotSupported].
type LimitError struct {
	Limit      string // "pids", "memory", "CPU"
	Controller string // the cgroup controller it needs
	Cgroup     string // the host's cgroup version, "v1" or "v2"
	Engine     string // who cannot: "rootless Podman"
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%v: a %s limit: %s on cgroup %s cannot enforce it (the %s controller is not delegated to the user; it would ignore the limit with a mere warning)",
		ErrNotSupported, e.Limit, e.Engine, e.Cgroup, e.Controller)
}

func (e *LimitError) Unwrap() error { return ErrNotSupported }
