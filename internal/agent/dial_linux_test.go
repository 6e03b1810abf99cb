package agent

import (
	"bufio"
	"context"
	"io"
	"net"
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

// echoServer serves l: each connection gets its lines back, upper-cased,
// until it closes.
func echoServer(t *testing.T, l net.Listener) {
	serve(t, l, func(c net.Conn) { testkit.UpperEcho(c) })
}

// The agent dials TCP and unix sockets of its network; the bytes go both
// ways, and the agent's end follows the caller's Close.
func TestDial(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
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
}

// A refused dial fails with the errno the sandbox saw; with wait it
// connects once something listens.
func TestDialRefusedAndWait(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
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
}

// When the sandbox's side closes, the caller reads what came, then EOF;
// a reader that does not read holds back its connection alone.
func TestDialEndAndFlow(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
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
}

// Closing the channel ends every connection.
func TestDialChannelEnds(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	echoServer(t, l)
	c, err := a.Dial(context.Background(), "tcp", l.Addr().String(), false)
	require.NoError(t, err)
	require.NoError(t, a.Close())
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF)
}
