package agent

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/podvm/podvm/internal/agent/wire"
)

// Dial connects, through the agent, to address on network ("tcp",
// "tcp4", "tcp6" or "unix") in the sandbox's own network, and returns the
// connection: the sandbox needs no network of its own, nor a port of the
// host. With wait, the agent tries again every few milliseconds while
// nothing listens there yet (refused, or no such socket), until ctx ends.
// A failed connection's error wraps the errno the sandbox saw
// (syscall.ECONNREFUSED, say) when there is one. ctx bounds the connect
// alone.
//
// The connection's bytes travel as a run's stdin and stdout, with its
// flow control: a reader that stops reading holds back that connection
// and nothing else. It ends when the sandbox's side closes it (Read
// returns io.EOF once what came before is read), when Close is called,
// or when the channel ends. Deadlines work as net.Conn's; there is no
// half-close.
func (c *Client) Dial(ctx context.Context, network, address string, wait bool) (net.Conn, error) {
	if strings.IndexByte(address, 0) >= 0 {
		return nil, fmt.Errorf("agent: dial %s %q: NUL byte in the address", network, address)
	}
	// The caller holds one end of a pipe, the run the other: the run's
	// stdin is what the caller writes, its stdout what the caller reads.
	theirs, ours := net.Pipe()
	m := wire.DialMsg{Network: network, Address: address, Wait: wait}
	r, err := c.begin(ctx, wire.Frame{Type: wire.Dial, Payload: m.Encode()}, ours, ours, nil)
	if err != nil {
		theirs.Close()
		ours.Close()
		return nil, err
	}
	if err := r.waitStarted(ctx); err != nil {
		theirs.Close()
		ours.Close()
		return nil, fmt.Errorf("agent: dial %s %s in the sandbox: %w", network, address, err)
	}
	go func() {
		// The run's end: once its output is read, the caller reads EOF.
		<-r.ended
		<-r.out[0].done
		ours.Close()
	}()
	return &conn{Conn: theirs, r: r, remote: addr{network, address}}, nil
}

// conn is the caller's end of a Dial.
type conn struct {
	net.Conn
	r      *clientRun
	remote addr
	once   sync.Once
}

// Close closes the connection: the agent closes its side in the sandbox.
func (c *conn) Close() error {
	c.once.Do(func() {
		c.Conn.Close()
		select {
		case <-c.r.ended:
		default:
			_ = c.r.c.send(wire.Frame{Type: wire.Kill, ID: c.r.id})
		}
	})
	return nil
}

// Done is closed once the connection has ended on the agent's side (the
// sandbox's end closed it, Close did, or the channel ended).
func (c *conn) Done() <-chan struct{} { return c.r.ended }

func (c *conn) LocalAddr() net.Addr  { return addr{"podvm-agent", "agent"} }
func (c *conn) RemoteAddr() net.Addr { return c.remote }

// addr is a net.Addr of a Dial.
type addr struct{ network, address string }

func (a addr) Network() string { return a.network }
func (a addr) String() string  { return a.address }
