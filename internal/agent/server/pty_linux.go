package server

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal of rows×cols in the sandbox: its master
// for the agent (pollable, so its reads take deadlines) and its slave as
// a raw fd for the run's command, whose controlling terminal it becomes.
func openPTY(rows, cols uint16) (master *os.File, slave int, err error) {
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, -1, fmt.Errorf("opening a terminal: %w", err)
	}
	fail := func(what string, err error) (*os.File, int, error) {
		m.Close()
		return nil, -1, fmt.Errorf("opening a terminal: %s: %w", what, err)
	}
	var n int
	ctl := func(fd uintptr) {
		if err = unix.IoctlSetPointerInt(int(fd), unix.TIOCSPTLCK, 0); err != nil {
			return
		}
		n, err = unix.IoctlGetInt(int(fd), unix.TIOCGPTN)
	}
	if cerr := control(m, ctl); cerr != nil {
		return fail("control", cerr)
	}
	if err != nil {
		return fail("unlock", err)
	}
	s, err := unix.Open("/dev/pts/"+strconv.Itoa(n), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail("slave", err)
	}
	if err := resize(m, rows, cols); err != nil {
		unix.Close(s)
		return fail("size", err)
	}
	return m, s, nil
}

// resize sets the size of the terminal whose master is m.
func resize(m *os.File, rows, cols uint16) error {
	var err error
	if cerr := control(m, func(fd uintptr) {
		err = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); cerr != nil {
		return cerr
	}
	return err
}

// control runs f on f's fd without taking it out of the poller (as Fd
// would).
func control(file *os.File, f func(fd uintptr)) error {
	rc, err := file.SyscallConn()
	if err != nil {
		return err
	}
	return rc.Control(f)
}
