package server

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/podvm/podvm/internal/agent/wire"
)

// A Dial's bytes reach the channel whole and in order whether splice
// moves them both ways, is refused on the connection (a seccomp profile
// that denies it: the bytes are read and written), or is refused on the
// channel alone (the bytes are spliced from the connection, read from
// the pipe and written, and the session splices no more).
func TestPumpSpliceFallsBack(t *testing.T) {
	isSocket := func(fd int) bool {
		var st unix.Stat_t
		return unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK
	}
	for _, c := range []struct {
		name   string
		refuse func(rfd, wfd int) bool
		after  bool // the session splices no more
	}{
		{"splices", func(int, int) bool { return false }, false},
		{"refused on the connection", func(rfd, _ int) bool { return isSocket(rfd) }, false},
		{"refused on the channel", func(_, wfd int) bool { return isSocket(wfd) }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			splice = func(rfd int, roff *int64, wfd int, woff *int64, n int, flags int) (int64, error) {
				if c.refuse(rfd, wfd) {
					return 0, unix.EINVAL
				}
				return unix.Splice(rfd, roff, wfd, woff, n, flags)
			}
			t.Cleanup(func() { splice = unix.Splice })
			ours, theirs := unixPair(t)
			s := &session{out: ours, close: func() {}}
			out := s.spliceTarget()
			require.NotNil(t, out)
			r := &run{s: s, id: 7}
			r.cond.L = &r.mu
			r.window[wire.StreamStdout] = 1 << 40
			data := make([]byte, 3<<20+777)
			_, _ = rand.Read(data)
			src := servedBy(t, func(c net.Conn) {
				_, _ = c.Write(data)
				c.Close()
			})
			var wg sync.WaitGroup
			wg.Add(1)
			require.True(t, r.pumpSplice(src.(syscall.Conn), out, &wg))
			got := make(chan []byte, 1)
			go func() {
				var b bytes.Buffer
				br := bufio.NewReader(theirs)
				for b.Len() < len(data) {
					f, err := wire.Read(br)
					if err != nil || f.Type != wire.Stdout || f.ID != 7 {
						break
					}
					b.Write(f.Payload)
				}
				got <- b.Bytes()
			}()
			wg.Wait()
			select {
			case b := <-got:
				assert.True(t, bytes.Equal(data, b), "the bytes differ")
			case <-time.After(10 * time.Second):
				t.Fatal("the pump ended, and the reader still waits for bytes")
			}
			s.wmu.Lock()
			defer s.wmu.Unlock()
			assert.Equal(t, c.after, s.noSplice)
			assert.NoError(t, s.werr)
		})
	}
}

// unixPair returns the two ends of a unix stream socket pair, closed
// when the test ends: the agent's end of a channel or a shim's socket,
// and the other process's.
func unixPair(t *testing.T) (*net.UnixConn, net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		conns[i], err = net.FileConn(f)
		f.Close()
		require.NoError(t, err)
		t.Cleanup(func() { conns[i].Close() })
	}
	return conns[0].(*net.UnixConn), conns[1]
}

// servedBy returns a TCP connection whose other end serve is handed.
// The other end is accepted before the listener closes: a connection
// still in the listener's queue when it closes is reset.
func servedBy(t *testing.T, serve func(net.Conn)) net.Conn {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	s, err := l.Accept()
	require.NoError(t, err)
	go serve(s)
	return c
}
