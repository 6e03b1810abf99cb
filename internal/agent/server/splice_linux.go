package server

import (
	"errors"
	"io"
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/podvm/podvm/internal/agent/wire"
)

// A Dial's bytes from the sandbox's side go to the channel without
// passing through the agent's memory: splice(2) moves them from the
// connection into a pipe of the agent's (the kernel's pages, not a
// copy), and from there into the channel behind their frame's header.
// Where read and write they cost two copies more (into the agent's
// buffer, into the frame's), which is a forward's bytes per second
// against a Run's stdout. It takes a channel that is a unix socket (the
// host's, local Podman) and a connection with a file descriptor; the
// others (the stdio stream, a peer's secured stream) take pumpOut.

// splice is unix.Splice; the tests make it refuse.
var splice = unix.Splice

// refused reports whether err is splice's refusal of a kind of file, or
// of the call itself (a seccomp profile that denies it): the bytes then
// go the read-and-write way.
func refused(err error) bool {
	return errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) || errors.Is(err, unix.EOPNOTSUPP)
}

// spliceTarget returns the channel's socket, if the session writes to
// one that splice can fill (and has not refused to).
func (s *session) spliceTarget() syscall.RawConn {
	s.wmu.Lock()
	no := s.noSplice
	s.wmu.Unlock()
	if no {
		return nil
	}
	uc, ok := s.out.(*net.UnixConn)
	if !ok {
		return nil
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// pumpSplice is pumpOut of a Dial's connection c, spliced into the
// channel out: it returns false, having sent nothing, when it cannot
// (the caller pumps with reads instead). When splice refuses c before a
// byte moved, it pumps with reads itself.
func (r *run) pumpSplice(c syscall.Conn, out syscall.RawConn, wg *sync.WaitGroup) bool {
	src, err := c.SyscallConn()
	if err != nil {
		return false
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return false
	}
	// A chunk's worth of pages: what the socket moves in at once goes
	// out as one frame.
	if _, err := unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, wire.ChunkSize); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return false
	}
	go func() {
		moved := false
		defer func() {
			unix.Close(p[0])
			unix.Close(p[1])
		}()
		for {
			r.mu.Lock()
			for r.window[wire.StreamStdout] <= 0 && !r.killed {
				r.cond.Wait()
			}
			n := int(min(int64(wire.ChunkSize), r.window[wire.StreamStdout]))
			killed := r.killed
			r.mu.Unlock()
			if killed {
				break // Kill closed the connection: nothing more goes out
			}
			k, err := spliceIn(src, p[1], n)
			if !moved && refused(err) {
				r.pumpOut(c.(deadlineReader), wire.Stdout, wire.StreamStdout, wg)
				return
			}
			moved = true
			if err != nil {
				r.broken(err)
			}
			if k == 0 || err != nil {
				break // the sandbox's side closed, or failed
			}
			if !r.charge(wire.StreamStdout, k) {
				break
			}
			err = r.s.sendSpliced(wire.Stdout, r, p[0], k, out)
			r.sent(wire.StreamStdout, k)
			if err != nil {
				break
			}
		}
		c.(interface{ Close() error }).Close()
		wg.Done()
	}()
	return true
}

// spliceIn moves up to n bytes from the socket src into the pipe w,
// waiting for some to come: 0 and no error at the socket's end.
func spliceIn(src syscall.RawConn, w, n int) (int, error) {
	var k int64
	var serr error
	err := src.Read(func(fd uintptr) bool {
		k, serr = splice(int(fd), nil, w, nil, n, unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MOVE)
		return !errors.Is(serr, unix.EAGAIN)
	})
	if err == nil {
		err = serr
	}
	return int(k), err
}

// sendSpliced sends a frame of type typ for run ru whose payload is the
// k bytes in pipe r: its header, then the bytes spliced behind it, under
// the lock that keeps frames whole, once the session is not frozen. An
// orphan's (run.send) is an error: its pump stops.
// Where splice refuses the channel, the bytes are read from the pipe and
// written, and the session splices no more. A failure closes the session, as send's does.
func (s *session) sendSpliced(typ wire.Type, ru *run, r, k int, out syscall.RawConn) error {
	s.gate.RLock()
	defer s.gate.RUnlock()
	if ru.orphan.Load() {
		return errOrphan
	}
	id := ru.id
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.werr != nil {
		return s.werr
	}
	var h [wire.HeaderSize]byte
	if _, s.werr = s.out.Write(wire.AppendHeader(h[:0], typ, id, k)); s.werr == nil && !s.noSplice {
		var serr error
		s.werr = out.Write(func(fd uintptr) bool {
			for k > 0 {
				m, err := splice(r, nil, int(fd), nil, k, unix.SPLICE_F_NONBLOCK|unix.SPLICE_F_MOVE)
				switch {
				case errors.Is(err, unix.EAGAIN):
					return false // the channel is full: wait until it drains
				case refused(err):
					s.noSplice = true
					return true
				case err != nil:
					serr = err
					return true
				case m == 0:
					serr = errors.New("splice: the pipe ran dry")
					return true
				}
				k -= int(m)
			}
			return true
		})
		if s.werr == nil {
			s.werr = serr
		}
	}
	if s.werr == nil && k > 0 {
		s.werr = copyPipe(s.out, r, k)
	}
	if s.werr != nil {
		s.close()
	}
	return s.werr
}

// errOrphan stops the pump of a run whose client is gone (run.send).
var errOrphan = errors.New("the run's client is the original's")

// copyPipe writes the k bytes waiting in pipe r to w.
func copyPipe(w io.Writer, r, k int) error {
	buf := make([]byte, k)
	for got := 0; got < k; {
		n, err := unix.Read(r, buf[got:])
		if err != nil {
			return err
		}
		if n == 0 {
			return errors.New("splice: the pipe ran dry")
		}
		got += n
	}
	_, err := w.Write(buf)
	return err
}
