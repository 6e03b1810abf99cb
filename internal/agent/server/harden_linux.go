package server

import (
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/podvm/podvm/internal/agent/wire"
)

// harden makes the process hard to reach from inside the sandbox: not
// dumpable (so no process without CAP_SYS_PTRACE may ptrace it, read its
// memory, open /proc/PID/fd/* or read /proc/PID/environ, or take its fds
// with pidfd_getfd), and deaf to every signal that would end it. PID 1 of
// a PID namespace receives a signal from inside only when it handles it,
// and the Go runtime handles them all, so every catchable signal is
// caught and dropped. Catching, not ignoring: an ignored signal stays
// ignored across execve, and the commands must start with default
// dispositions.
func harden() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE): %w", err)
	}
	var sigs []os.Signal
	for s := 1; s <= 64; s++ {
		switch syscall.Signal(s) {
		case unix.SIGKILL, unix.SIGSTOP, unix.SIGCHLD, unix.SIGURG, 32, 33:
			// Uncatchable; needed for reaping; Go's preemption; libc's.
			continue
		}
		sigs = append(sigs, syscall.Signal(s))
	}
	drop := make(chan os.Signal, 16)
	signal.Notify(drop, sigs...)
	go func() {
		for range drop {
		}
	}()
	return nil
}

// takeStdio moves the channel on stdin and stdout to new close-on-exec
// fds and puts /dev/null on 0, 1 and 2, so nothing the agent starts can
// inherit the channel.
func takeStdio() (in, out *os.File, err error) {
	r, err := unix.FcntlInt(0, unix.F_DUPFD_CLOEXEC, 100)
	if err != nil {
		return nil, nil, fmt.Errorf("dup stdin: %w", err)
	}
	w, err := unix.FcntlInt(1, unix.F_DUPFD_CLOEXEC, 100)
	if err != nil {
		return nil, nil, fmt.Errorf("dup stdout: %w", err)
	}
	null, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/null: %w", err)
	}
	for fd := range 3 {
		if err := unix.Dup3(null, fd, 0); err != nil {
			return nil, nil, fmt.Errorf("dup /dev/null: %w", err)
		}
	}
	unix.Close(null)
	return os.NewFile(uintptr(r), "channel-in"), os.NewFile(uintptr(w), "channel-out"), nil
}

// sendFrame writes f on c, with fds attached to its first byte.
func sendFrame(c *net.UnixConn, f wire.Frame, fds ...int) error {
	b := f.Append(nil)
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	n, _, err := c.WriteMsgUnix(b, oob, nil)
	if err == nil && n < len(b) {
		_, err = c.Write(b[n:])
	}
	return err
}

// recvFrame reads a frame from c and the fds that came with it (opened
// close-on-exec; the caller owns them).
func recvFrame(c *net.UnixConn) (wire.Frame, []int, error) {
	var h [wire.HeaderSize]byte
	oob := make([]byte, unix.CmsgSpace(4*8))
	var fds []int
	fail := func(err error) (wire.Frame, []int, error) {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return wire.Frame{}, nil, err
	}
	for got := 0; got < len(h); {
		n, oobn, _, _, err := c.ReadMsgUnix(h[got:], oob)
		if oobn > 0 {
			msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
			for _, m := range msgs {
				if rights, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, rights...)
				}
			}
			if perr != nil && err == nil {
				err = perr
			}
		}
		got += n
		if err != nil {
			return fail(err)
		}
		if n == 0 {
			return fail(os.ErrClosed)
		}
	}
	f, err := wire.ReadPayload(c, h)
	if err != nil {
		return fail(err)
	}
	return f, fds, nil
}
