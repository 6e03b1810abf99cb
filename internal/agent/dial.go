package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

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
// and nothing else. See [Conn] for how it ends.
func (c *Client) Dial(ctx context.Context, network, address string, wait bool) (*Conn, error) {
	if err := checkAddress(network, address); err != nil {
		return nil, err
	}
	// Two pipes, one each way, so that the caller's half-close (its end
	// of the writing pipe closed) is the run's stdin EOF while its
	// output still comes.
	rTheirs, rOurs := net.Pipe()
	wTheirs, wOurs := net.Pipe()
	closeAll := func() {
		for _, p := range []net.Conn{rTheirs, rOurs, wTheirs, wOurs} {
			p.Close()
		}
	}
	m := wire.DialMsg{Network: network, Address: address, Wait: wait}
	r, err := c.begin(ctx, wire.Frame{Type: wire.Dial, Payload: m.Encode()}, wOurs, rOurs, nil)
	if err != nil {
		closeAll()
		return nil, err
	}
	// When ctx ends, the pipes close first: a service that spoke at once
	// would otherwise hold the stopped run's delivery in a write nobody
	// reads.
	stop := context.AfterFunc(ctx, closeAll)
	err = r.waitStarted(ctx)
	if !stop() && err == nil { // connected as ctx ended
		_ = c.send(wire.Frame{Type: wire.Kill, ID: r.id})
		err = ctx.Err()
	}
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("agent: dial %s %s in the sandbox: %w", network, address, err)
	}
	go func() {
		// The run's end: a write fails at once instead of waiting for a
		// reader; once the output is read, the caller reads EOF.
		<-r.ended
		wOurs.Close()
		<-r.out[0].done
		rOurs.Close()
	}()
	return &Conn{r: r, rd: rTheirs, wr: wTheirs, remote: addr{network, address}}, nil
}

func checkAddress(network, address string) error {
	if strings.IndexByte(address, 0) >= 0 {
		return fmt.Errorf("agent: dial %s %q: NUL byte in the address", network, address)
	}
	return nil
}

// Conn is the caller's end of a [Client.Dial]: a net.Conn with a
// half-close. It ends when the sandbox's side closes it (Read returns
// io.EOF once what came before is read, and Write fails), when Close is
// called, or when the channel ends. Deadlines work as net.Conn's.
type Conn struct {
	r      *clientRun
	rd, wr net.Conn // the caller's ends of the pipes the run reads and writes
	remote addr
	once   sync.Once
	closed atomic.Bool // Close was called
}

// Read reads what the sandbox's side sent. Once that is read, it
// returns io.EOF when the sandbox's side closed the connection; when
// the connection failed there instead (reset), or the channel to the
// agent ended, an error that says so ([syscall.ECONNRESET], say, or
// [ErrChannelClosed]): what came before may be cut short.
func (c *Conn) Read(p []byte) (int, error) {
	n, err := c.rd.Read(p)
	if err == io.EOF {
		if broke := c.r.broken(); broke != nil {
			err = fmt.Errorf("agent: read %s %s in the sandbox: %w", c.remote.network, c.remote.address, broke)
		}
	}
	return n, err
}

// Write sends p to the sandbox's side.
func (c *Conn) Write(p []byte) (int, error) { return c.wr.Write(p) }

// CloseWrite ends the caller's side of the stream, as a TCP
// connection's CloseWrite: the service in the sandbox reads EOF, and its
// answer can still be read.
func (c *Conn) CloseWrite() error { return c.wr.Close() }

// Close closes the connection: the agent closes its side in the sandbox.
func (c *Conn) Close() error {
	c.once.Do(func() {
		c.closed.Store(true)
		c.rd.Close()
		c.wr.Close()
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
func (c *Conn) Done() <-chan struct{} { return c.r.ended }

// LocalAddr is the agent's end, as a net.Addr.
func (c *Conn) LocalAddr() net.Addr { return addr{"podvm-agent", "agent"} }

// RemoteAddr is the address dialed in the sandbox.
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// SetDeadline sets both deadlines.
func (c *Conn) SetDeadline(t time.Time) error {
	return errors.Join(c.SetReadDeadline(t), c.SetWriteDeadline(t))
}

// SetReadDeadline sets the deadline of Read.
func (c *Conn) SetReadDeadline(t time.Time) error { return c.deadline(c.rd.SetReadDeadline(t)) }

// SetWriteDeadline sets the deadline of Write.
func (c *Conn) SetWriteDeadline(t time.Time) error { return c.deadline(c.wr.SetWriteDeadline(t)) }

// deadline is the error of setting a deadline: none once the sandbox's
// side ended, as on a TCP connection whose peer closed (the pipe's end
// is closed then), only once Close was called.
func (c *Conn) deadline(err error) error {
	if errors.Is(err, io.ErrClosedPipe) && !c.closed.Load() {
		return nil
	}
	return err
}

// addr is a net.Addr of a Dial.
type addr struct{ network, address string }

func (a addr) Network() string { return a.network }
func (a addr) String() string  { return a.address }

// Splice connects, through the agent, to address on network in the
// sandbox, as [Client.Dial] does, and carries the connection to and from
// rw itself: what rw's Read returns goes to the sandbox's side (its
// io.EOF as a half-close), and what comes back is written to rw. It is a
// forward's connection without a pipe or a copying goroutine between.
//
// Splice returns once the Dial is sent, before the agent has connected:
// what rw has to say goes out behind it at once. A failed connect ends
// the splice (Ended, then Done, with Err set). When ctx ends before the
// agent said it connected, the splice is ended as by Close.
//
// Once the splice ended, Splice reads rw at most once more (a Read in
// progress, or one with credit left): the caller drains or closes what
// rw reads.
func (c *Client) Splice(ctx context.Context, network, address string, rw io.ReadWriter) (*Splice, error) {
	if err := checkAddress(network, address); err != nil {
		return nil, err
	}
	m := wire.DialMsg{Network: network, Address: address}
	r, err := c.begin(ctx, wire.Frame{Type: wire.Dial, Payload: m.Encode()}, rw, rw, nil)
	if err != nil {
		return nil, err
	}
	s := &Splice{r: r}
	if ctx.Done() != nil {
		go func() {
			select {
			case <-r.started:
			case <-r.ended:
			case <-ctx.Done():
				s.Close()
			}
		}()
	}
	return s, nil
}

// Splice is a connection of [Client.Splice].
type Splice struct {
	r    *clientRun
	once sync.Once
}

// Ended is closed once the connection ended on the agent's side: the
// sandbox's end closed it, the connect failed, Close was called, or the
// channel ended.
func (s *Splice) Ended() <-chan struct{} { return s.r.ended }

// Done is closed once the splice has ended and all it received was
// written to its ReadWriter (or dropped after Close): the caller may then
// half-close or close what it writes to.
func (s *Splice) Done() <-chan struct{} { return s.r.out[0].done }

// Connected reports that the agent made the connection (it may have
// ended since).
func (s *Splice) Connected() bool {
	select {
	case <-s.r.started:
		return true
	default:
		return false
	}
}

// Err is, once Done is closed, why the connection failed: it could not
// be made, it failed in the sandbox (reset: [syscall.ECONNRESET], say),
// or the channel ended (nil when the connection was closed as
// connections are).
func (s *Splice) Err() error {
	select {
	case <-s.r.exited:
		if s.r.exit.Status == wire.Exited {
			return s.r.broken()
		}
		_, err := s.r.result(nil)
		return err
	default:
	}
	select {
	case <-s.r.ended:
		return s.r.broken()
	default:
		return nil
	}
}

// Close ends the connection: the agent closes its side in the sandbox,
// and what still comes from it is dropped.
func (s *Splice) Close() error {
	s.once.Do(func() {
		select {
		case <-s.r.ended:
		default:
			_ = s.r.c.send(wire.Frame{Type: wire.Kill, ID: s.r.id})
		}
		for i := range s.r.out {
			o := &s.r.out[i]
			o.mu.Lock()
			o.discard = true
			o.cond.Signal()
			o.mu.Unlock()
		}
	})
	return nil
}

// Dead is closed once the channel to the agent has ended: every run and
// connection on it has ended too.
func (c *Client) Dead() <-chan struct{} { return c.dead }

// broken is why a Dial's connection that ended did not end as closed:
// its reading in the sandbox failed (the errno the agent saw), or the
// channel ended before the agent said it ended. Nil for a connection
// closed there, or by Close, and for one not ended.
func (r *clientRun) broken() error {
	select {
	case <-r.exited:
		if r.exit.Status == wire.Exited && !r.exit.Killed && r.exit.Code > 0 {
			return syscall.Errno(r.exit.Code)
		}
		return nil
	default:
	}
	select {
	case <-r.ended:
		if err := r.c.err; err != nil {
			return err
		}
		return ErrChannelClosed
	default:
		return nil
	}
}
