// Package deadline classifies how a run ended when its context or its own
// timeout stopped it, once for every podvm executor.
package deadline

import (
	"context"
	"fmt"
	"time"
)

// Start returns ctx bounded by timeout (unbounded when timeout is zero).
func Start(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout > 0 {
		return context.WithTimeout(ctx, timeout)
	}
	return context.WithCancel(ctx)
}

// Err returns nil when run is not done. Otherwise it returns an error for
// the run of what, prefixed by pkg ("exec", "vm"): when the caller's
// context ended, one wrapping its cause (context.Canceled or
// context.DeadlineExceeded); when only the timeout fired, one wrapping
// context.DeadlineExceeded and stating the timeout.
func Err(pkg string, parent, run context.Context, what string, timeout time.Duration) error {
	if run.Err() == nil {
		return nil
	}
	if err := parent.Err(); err != nil {
		if cause := context.Cause(parent); cause != err {
			return fmt.Errorf("%s: %s: %w: %w", pkg, what, err, cause)
		}
		return fmt.Errorf("%s: %s: %w", pkg, what, err)
	}
	return fmt.Errorf("%s: %s: timed out after %v: %w", pkg, what, timeout, context.DeadlineExceeded)
}
