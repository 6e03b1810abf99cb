package agent

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// userTimeout returns a Dialer.Control that sets TCP_USER_TIMEOUT to d:
// data left unacknowledged that long breaks the connection.
func userTimeout(d time.Duration) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d.Milliseconds()))
		})
		if err != nil {
			return err
		}
		return serr
	}
}
