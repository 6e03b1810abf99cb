package agent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/testkit"
)

// serve serves each connection of l with handle, which closes it, until
// the test ends.
func serve(t *testing.T, l net.Listener, handle func(net.Conn)) {
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
}

// onChannels runs test on an agent of each kind of channel, in parallel
// subtests: stdio (pipes, as the attach stream) and a unix socket the
// agent connects to (local Podman's), whose Dials the agent splices.
func onChannels(t *testing.T, test func(t *testing.T, a *testAgent)) {
	t.Parallel()
	t.Run("stdio", func(t *testing.T) {
		t.Parallel()
		test(t, startAgent(t))
	})
	t.Run("socket", func(t *testing.T) {
		t.Parallel()
		c, _ := startConnectAgent(t)
		t.Cleanup(func() { c.Close() })
		test(t, &testAgent{Client: c})
	})
}

// echoServer serves l: each connection gets its lines back, upper-cased,
// until it closes.
func echoServer(t *testing.T, l net.Listener) {
	serve(t, l, func(c net.Conn) { testkit.UpperEcho(c) })
}

// The agent dials TCP and unix sockets of its network; the bytes go both
// ways, and the agent's end follows the caller's Close.
func TestDial(t *testing.T) {
	onChannels(t, func(t *testing.T, a *testAgent) {
		ctx := context.Background()
		tl, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		echoServer(t, tl)
		sock := filepath.Join(t.TempDir(), "s.sock")
		ul, err := net.Listen("unix", sock)
		require.NoError(t, err)
		echoServer(t, ul)

		for _, target := range []struct{ network, address string }{{"tcp", tl.Addr().String()}, {"unix", sock}} {
			c, err := a.Dial(ctx, target.network, target.address, false)
			require.NoError(t, err, target.network)
			assert.Equal(t, target.address, c.RemoteAddr().String())
			br := bufio.NewReader(c)
			for _, l := range []string{"hello", "again"} {
				_, err := io.WriteString(c, l+"\n")
				require.NoError(t, err)
				got, err := br.ReadString('\n')
				require.NoError(t, err)
				assert.Equal(t, strings.ToUpper(l)+"\n", got)
			}
			require.NoError(t, c.Close())
			_, err = c.Write([]byte("x"))
			assert.Error(t, err, "a write after Close")
		}
	})
}

// A refused dial fails with the errno the sandbox saw; with wait it
// connects once something listens.
func TestDialRefusedAndWait(t *testing.T) {
	onChannels(t, func(t *testing.T, a *testAgent) {
		ctx := context.Background()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		address := l.Addr().String()
		l.Close() // nothing listens there now

		_, err = a.Dial(ctx, "tcp", address, false)
		assert.ErrorIs(t, err, syscall.ECONNREFUSED)
		_, err = a.Dial(ctx, "unix", filepath.Join(t.TempDir(), "none.sock"), false)
		assert.ErrorIs(t, err, syscall.ENOENT)
		_, err = a.Dial(ctx, "udp", address, false)
		assert.ErrorContains(t, err, `network "udp"`)

		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err = a.Dial(wctx, "tcp", address, true)
		cancel()
		assert.ErrorIs(t, err, context.DeadlineExceeded, "nothing listened within the deadline")

		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(200 * time.Millisecond)
			l, err := net.Listen("tcp", address)
			if !assert.NoError(t, err) {
				return
			}
			echoServer(t, l)
		}()
		c, err := a.Dial(ctx, "tcp", address, true)
		require.NoError(t, err)
		defer c.Close()
		_, err = io.WriteString(c, "late\n")
		require.NoError(t, err)
		got, err := bufio.NewReader(c).ReadString('\n')
		require.NoError(t, err)
		assert.Equal(t, "LATE\n", got)
		wg.Wait()
	})
}

// When the sandbox's side closes, the caller reads what came, then EOF;
// a reader that does not read holds back its connection alone.
func TestDialEndAndFlow(t *testing.T) {
	onChannels(t, func(t *testing.T, a *testAgent) {
		ctx := context.Background()
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		const size = 8 << 20
		serve(t, l, func(c net.Conn) {
			_, _ = c.Write(make([]byte, size))
			c.Close()
		})
		slow, err := a.Dial(ctx, "tcp", l.Addr().String(), false)
		require.NoError(t, err)
		defer slow.Close()
		fast, err := a.Dial(ctx, "tcp", l.Addr().String(), false)
		require.NoError(t, err)
		n, err := io.Copy(io.Discard, fast)
		require.NoError(t, err)
		assert.Equal(t, int64(size), n, "the whole stream, then EOF, while the other is not read")
		res := a.sh(ctx, "echo ok")
		require.NoError(t, res.err)
		assert.Equal(t, "ok\n", res.stdout, "runs go on beside a stalled connection")
		n, err = io.Copy(io.Discard, slow)
		require.NoError(t, err)
		assert.Equal(t, int64(size), n)
	})
}

// Closing the channel ends every connection.
func TestDialChannelEnds(t *testing.T) {
	onChannels(t, func(t *testing.T, a *testAgent) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		echoServer(t, l)
		c, err := a.Dial(context.Background(), "tcp", l.Addr().String(), false)
		require.NoError(t, err)
		require.NoError(t, a.Close())
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = c.Read(make([]byte, 1))
		assert.ErrorIs(t, err, ErrChannelClosed, "a connection cut by the channel's end does not read as closed")
	})
}

// A connection the sandbox's service resets is not one it closed: what
// it sent comes, then the reset, in place of EOF, through a Dial and a
// Splice, whichever way the agent moves the bytes; a service that closes
// still reads as EOF.
func TestDialReset(t *testing.T) {
	onChannels(t, func(t *testing.T, a *testAgent) {
		ctx := context.Background()
		const size = 1 << 20
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		serve(t, l, func(c net.Conn) {
			var one [1]byte
			if _, err := c.Read(one[:]); err != nil { // the verdict: r resets, c closes
				c.Close()
				return
			}
			_, _ = c.Write(make([]byte, size))
			if one[0] == 'r' {
				_ = c.(*net.TCPConn).SetLinger(0)
			}
			c.Close()
		})
		for _, verdict := range []string{"r", "c"} {
			c, err := a.Dial(ctx, "tcp", l.Addr().String(), false)
			require.NoError(t, err)
			_, err = io.WriteString(c, verdict)
			require.NoError(t, err)
			require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
			n, err := io.Copy(io.Discard, c)
			assert.LessOrEqual(t, n, int64(size))
			if verdict == "r" {
				assert.ErrorIs(t, err, syscall.ECONNRESET, "a reset after %d bytes", n)
			} else {
				assert.NoError(t, err, "a close reads as EOF")
				assert.Equal(t, int64(size), n)
			}
			c.Close()
		}

		client, ours := tcpPair(t)
		sp, err := a.Splice(ctx, "tcp", l.Addr().String(), ours)
		require.NoError(t, err)
		defer sp.Close()
		_, err = io.WriteString(client, "r")
		require.NoError(t, err)
		go func() { _, _ = io.Copy(io.Discard, client) }()
		select {
		case <-sp.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the splice never ended")
		}
		assert.ErrorIs(t, sp.Err(), syscall.ECONNRESET)
	})
}

// upperAll serves l: each connection's whole input, upper-cased, once
// the caller half-closed it; then it closes.
func upperAll(t *testing.T, l net.Listener) {
	serve(t, l, func(c net.Conn) {
		defer c.Close()
		b, err := io.ReadAll(c)
		if err == nil {
			_, _ = c.Write([]byte(strings.ToUpper(string(b))))
		}
	})
}

// CloseWrite is a half-close: the service reads EOF and its answer still
// comes; a write afterwards fails.
func TestDialHalfClose(t *testing.T) {
	onChannels(t, func(t *testing.T, a *testAgent) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		upperAll(t, l)
		c, err := a.Dial(context.Background(), "tcp", l.Addr().String(), false)
		require.NoError(t, err)
		defer c.Close()
		_, err = io.WriteString(c, "request, then EOF\n")
		require.NoError(t, err)
		require.NoError(t, c.CloseWrite())
		_, err = c.Write([]byte("x"))
		assert.Error(t, err, "a write after CloseWrite")
		require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
		got, err := io.ReadAll(c)
		require.NoError(t, err)
		assert.Equal(t, "REQUEST, THEN EOF\n", string(got))
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the connection never ended")
		}
	})
}

// A splice reads and writes the caller's connection itself: its bytes
// go both ways, its EOF is the service's, and the service's end is Done.
func TestSplice(t *testing.T) {
	onChannels(t, func(t *testing.T, a *testAgent) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		upperAll(t, l)
		client, ours := tcpPair(t)
		sp, err := a.Splice(context.Background(), "tcp", l.Addr().String(), ours)
		require.NoError(t, err)
		defer sp.Close()
		_, err = io.WriteString(client, "spliced\n")
		require.NoError(t, err)
		require.NoError(t, client.(*net.TCPConn).CloseWrite())
		select {
		case <-sp.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the splice never ended")
		}
		require.NoError(t, sp.Err())
		ours.(*net.TCPConn).CloseWrite()
		got, err := io.ReadAll(client)
		require.NoError(t, err)
		assert.Equal(t, "SPLICED\n", string(got))
	})
}

// A splice that cannot connect ends with the errno; Close ends one that
// is carrying, and the agent closes its side.
func TestSpliceRefusedAndClose(t *testing.T) {
	onChannels(t, func(t *testing.T, a *testAgent) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		address := l.Addr().String()
		l.Close()
		_, ours := tcpPair(t)
		sp, err := a.Splice(context.Background(), "tcp", address, ours)
		require.NoError(t, err, "a splice returns before the connect")
		<-sp.Done()
		assert.ErrorIs(t, sp.Err(), syscall.ECONNREFUSED)

		l, err = net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		accepted, closed := make(chan struct{}), make(chan struct{})
		serve(t, l, func(c net.Conn) {
			close(accepted)
			_, _ = io.Copy(io.Discard, c)
			c.Close()
			close(closed)
		})
		_, ours = tcpPair(t)
		sp, err = a.Splice(context.Background(), "tcp", l.Addr().String(), ours)
		require.NoError(t, err)
		select {
		case <-accepted: // a Close before the connect would stop the connect
		case <-time.After(10 * time.Second):
			t.Fatal("the agent never connected")
		}
		require.NoError(t, sp.Close())
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatal("the service's connection was not closed")
		}
		<-sp.Ended()
	})
}

// Dead is closed when the channel ends.
func TestDead(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	select {
	case <-a.Dead():
		t.Fatal("dead at once")
	default:
	}
	require.NoError(t, a.Close())
	select {
	case <-a.Dead():
	case <-time.After(10 * time.Second):
		t.Fatal("Dead never closed")
	}
}

// tcpPair returns both ends of a loopback TCP connection, closed when
// the test ends.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	server = <-accepted
	require.NotNil(t, server)
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	return client, server
}

// Once the service's side closed, a write fails at once, even one that
// nobody in the sandbox would read.
func TestDialWriteAfterTheServiceClosed(t *testing.T) {
	onChannels(t, func(t *testing.T, a *testAgent) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		serve(t, l, func(c net.Conn) { c.Close() })
		c, err := a.Dial(context.Background(), "tcp", l.Addr().String(), false)
		require.NoError(t, err)
		defer c.Close()
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the connection never ended")
		}
		require.NoError(t, c.SetWriteDeadline(time.Now().Add(10*time.Second)))
		_, err = c.Write(make([]byte, 1<<20))
		require.Error(t, err)
		assert.NotErrorIs(t, err, os.ErrDeadlineExceeded, "the write waited for a reader")
	})
}

// Every byte a service sends arrives, in order, while runs' output
// shares the channel: frames of spliced bytes are whole and never
// interleaved with others. Closing a connection mid-stream ends it.
func TestDialCarriesEveryByte(t *testing.T) {
	onChannels(t, func(t *testing.T, a *testAgent) {
		ctx := context.Background()
		data := make([]byte, 24<<20+12345)
		_, _ = rand.Read(data)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		serve(t, l, func(c net.Conn) {
			defer c.Close()
			for p := data; len(p) > 0; { // writes of every size
				n := min(len(p), 1+len(p)%70001)
				if _, err := c.Write(p[:n]); err != nil {
					return
				}
				p = p[n:]
			}
		})
		var wg sync.WaitGroup
		stop := make(chan struct{})
		wg.Add(1)
		go func() { // output of runs beside the connection
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				res := a.sh(ctx, "head -c 300000 /dev/zero | tr '\\0' x")
				if assert.NoError(t, res.err) {
					assert.Equal(t, strings.Repeat("x", 300000), res.stdout)
				}
			}
		}()
		c, err := a.Dial(ctx, "tcp", l.Addr().String(), false)
		require.NoError(t, err)
		require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Minute)))
		got, err := io.ReadAll(c)
		close(stop)
		wg.Wait()
		require.NoError(t, err)
		require.NoError(t, c.Close())
		assert.Equal(t, len(data), len(got))
		assert.True(t, bytes.Equal(data, got), "the bytes differ")

		// Closed mid-stream, with bytes under way: it ends, and the
		// channel goes on.
		c, err = a.Dial(ctx, "tcp", l.Addr().String(), false)
		require.NoError(t, err)
		_, err = io.ReadFull(c, make([]byte, 1<<20))
		require.NoError(t, err)
		require.NoError(t, c.Close())
		select {
		case <-c.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the connection did not end after Close")
		}
		res := a.sh(ctx, "echo after")
		require.NoError(t, res.err)
		assert.Equal(t, "after\n", res.stdout)
	})
}
