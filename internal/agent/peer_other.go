//go:build !linux

package agent

import (
	"syscall"
	"time"
)

// userTimeout is nil where TCP_USER_TIMEOUT is Linux's alone: keepalives
// still find an idle peer gone.
func userTimeout(time.Duration) func(network, address string, c syscall.RawConn) error {
	return nil
}
