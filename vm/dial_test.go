package vm_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/testkit"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/vmmock"
)

// dialVM is a VM whose "sandbox" services are served by serve, one
// net.Pipe per connection.
type dialVM struct {
	vm.VM
	serve   func(net.Conn)
	refused atomic.Bool
	dials   atomic.Int32
	fail    error // the sandbox's connections fail so once served, rather than end
}

func (d *dialVM) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	d.dials.Add(1)
	if d.refused.Load() {
		return nil, syscall.ECONNREFUSED
	}
	a, b := net.Pipe()
	go d.serve(b)
	if d.fail != nil {
		return &failingConn{Conn: a, err: d.fail}, nil
	}
	return a, nil
}

// failingConn is a connection whose reads, once its peer closed it or
// it was closed, fail with err: a stream that broke, or a wrapper whose
// closed reads say something of their own.
type failingConn struct {
	net.Conn
	err error
}

func (c *failingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		err = c.err
	}
	return n, err
}

func (d *dialVM) DialListening(ctx context.Context, network, address string) (net.Conn, error) {
	return d.DialContext(ctx, network, address)
}

func TestForward(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	v := &dialVM{serve: func(c net.Conn) { testkit.UpperEcho(c) }}
	f, err := vm.Forward(ctx, v, "tcp", "127.0.0.1:80")
	require.NoError(t, err)
	assert.Contains(t, f.Addr().String(), "127.0.0.1:")

	var held []net.Conn
	for _, word := range []string{"one", "two"} {
		c, err := net.Dial("tcp", f.Addr().String())
		require.NoError(t, err)
		held = append(held, c)
		_, err = io.WriteString(c, word+"\n")
		require.NoError(t, err)
		got, err := bufio.NewReader(c).ReadString('\n')
		require.NoError(t, err)
		assert.Equal(t, strings.ToUpper(word)+"\n", got)
	}
	require.NoError(t, f.Close())
	for _, c := range held {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		assert.ErrorIs(t, err, io.EOF, "Close closes the connections it carries")
	}
	assert.True(t, testkit.Freed(f.Addr().String(), 0), "nothing listens after Close")
}

// A connection the sandbox refuses is closed at once; the forward lives
// on for the service that comes later.
func TestForwardRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	v := &dialVM{serve: func(c net.Conn) { testkit.UpperEcho(c) }}
	v.refused.Store(true)
	f, err := vm.Forward(ctx, v, "tcp", "127.0.0.1:80")
	require.NoError(t, err, "a service may come later")
	defer f.Close()
	c, err := net.Dial("tcp", f.Addr().String())
	require.NoError(t, err)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF)
	c.Close()

	v.refused.Store(false)
	c, err = net.Dial("tcp", f.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_, err = io.WriteString(c, "later\n")
	require.NoError(t, err)
	got, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "LATER\n", got)
}

// A VM that reaches no service says so.
func TestDialNotSupported(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := vmmock.NewMockVM(nil)
	_, err := vm.Dial(ctx, m, "tcp", "127.0.0.1:80")
	assert.ErrorIs(t, err, vm.ErrNotSupported)
	assert.ErrorIs(t, vm.WaitListening(ctx, m, "tcp", "127.0.0.1:80"), vm.ErrNotSupported)
	_, err = vm.Forward(ctx, m, "tcp", "127.0.0.1:80")
	assert.ErrorIs(t, err, vm.ErrNotSupported)
	_, err = vm.Start(ctx, m, exec.Command{Name: "true"})
	assert.ErrorIs(t, err, vm.ErrNotSupported)
	assert.Empty(t, vm.Processes(m))
	assert.False(t, errors.Is(err, vm.ErrRemoved))
}

// A sandbox not yet created, or removed, holds nothing.
func TestLiveBeforeCreate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	v, err := vm.NewCLIVM(vm.Config{Image: "localhost/x"}, nil)
	require.NoError(t, err)
	_, err = vm.Start(ctx, v, exec.Command{Name: "true"})
	assert.ErrorIs(t, err, vm.ErrNotCreated)
	c, err := vm.Dial(ctx, v, "tcp", "127.0.0.1:80")
	assert.ErrorIs(t, err, vm.ErrNotCreated)
	assert.True(t, c == nil, "a failed Dial returns a nil net.Conn, not one holding a nil pointer: %#v", c)
	_, err = vm.Forward(ctx, v, "tcp", "127.0.0.1:80")
	assert.ErrorIs(t, err, vm.ErrNotCreated)
	_, err = vm.Dial(ctx, v, "sctp", "127.0.0.1:80")
	assert.ErrorContains(t, err, "unknown network sctp")
	require.NoError(t, v.Remove(ctx))
	_, err = vm.Start(ctx, v, exec.Command{Name: "true"})
	assert.ErrorIs(t, err, vm.ErrRemoved)
	_, err = vm.Forward(ctx, v, "tcp", "127.0.0.1:80")
	assert.ErrorIs(t, err, vm.ErrRemoved)
}

// A connection that failed in the sandbox reaches the forward's client
// as a reset, after what came before it: a client never takes a stream
// cut short for one that ended. One that ended reaches it as EOF.
func TestForwardPassesAReset(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, c := range []struct {
		fail error
		want error
	}{{syscall.ECONNRESET, syscall.ECONNRESET}, {nil, nil}} {
		v := &dialVM{fail: c.fail, serve: func(c net.Conn) {
			// The client's byte first: a reset before its connect
			// returned would fail the connect.
			if _, err := c.Read(make([]byte, 1)); err == nil {
				_, _ = io.WriteString(c, "partial")
			}
			c.Close()
		}}
		f, err := vm.Forward(ctx, v, "tcp", "127.0.0.1:80")
		require.NoError(t, err)
		defer f.Close()
		conn, err := net.Dial("tcp", f.Addr().String())
		require.NoError(t, err)
		defer conn.Close()
		_, err = conn.Write([]byte("x"))
		require.NoError(t, err)
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		got, err := io.ReadAll(conn)
		if c.want == nil {
			assert.NoError(t, err, "an end reads as EOF")
		} else {
			assert.ErrorIs(t, err, c.want)
		}
		assert.Equal(t, "partial", string(got))
	}
}
