package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/podvm/podvm/internal/agent"
)

// This file is the services of a sandbox as the caller reaches them:
// connections that podvm's agent makes inside the sandbox and carries over
// its channel, so that they work whatever the sandbox's Network ("none"
// included: its loopback is always there), on a remote service and on
// Kubernetes alike, for whoever holds the VM and nobody else.

// ServiceDialer is implemented by a [VM] whose caller can reach services
// in its sandbox (every sandbox with podvm's agent, not
// [Config.PodmanExec]). [Dial], [WaitListening] and [Forward] call it.
type ServiceDialer interface {
	// DialContext connects to address on network ("tcp", "tcp4",
	// "tcp6" or "unix") in the sandbox: net.Dialer's signature, for an
	// http.Transport's or a database driver's dial hook.
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
	// DialListening is DialContext that first waits, while ctx lasts,
	// for something to listen at address.
	DialListening(ctx context.Context, network, address string) (net.Conn, error)
}

// Dial connects, from the caller's process, to address on network in
// sandbox v's own network ("127.0.0.1:5432", "/run/app.sock"): the
// connection is made by podvm's agent inside the sandbox and carried over
// its channel. Nothing is published on the host and the sandbox needs no
// network. A refused connection's error matches the errno the sandbox saw
// (syscall.ECONNREFUSED, syscall.ENOENT for a missing socket). ctx bounds
// the connect alone.
//
// The connection ends when the sandbox's side closes it (Read returns
// io.EOF once what came is read), when it is closed, or when the sandbox
// is removed or dies. Read returns io.EOF only for the first: a
// connection that failed in the sandbox (reset) returns the errno the
// sandbox saw (errors.Is(err, syscall.ECONNRESET)), and one whose
// sandbox was removed [ErrRemoved], or died, what a Run would say of it
// ([ErrNoSuchContainer], [ErrContainerNotRunning], [ErrUnavailable]),
// so that a stream cut short never reads as one that ended. A [Forward] passes such a failure on to its
// client as a TCP reset. Its deadlines work as any net.Conn's, and it has a
// half-close, as a *net.TCPConn has: its CloseWrite method (assert
// interface{ CloseWrite() error }) makes the service read EOF while its
// answer can still be read. A VM that is not a [ServiceDialer] fails
// with [ErrNotSupported].
func Dial(ctx context.Context, v VM, network, address string) (net.Conn, error) {
	d, err := serviceDialer(v, network, address)
	if err != nil {
		return nil, err
	}
	return d.DialContext(ctx, network, address)
}

// WaitListening waits until something in sandbox v listens at address
// on network, or ctx ends: the agent tries to connect every few
// milliseconds, so the caller needs no polling loop of its own.
func WaitListening(ctx context.Context, v VM, network, address string) error {
	d, err := serviceDialer(v, network, address)
	if err != nil {
		return err
	}
	c, err := d.DialListening(ctx, network, address)
	if err != nil {
		return err
	}
	return c.Close()
}

func serviceDialer(v VM, network, address string) (ServiceDialer, error) {
	d, ok := capability[ServiceDialer](v)
	if !ok {
		return nil, fmt.Errorf("%w: vm: dial %s %s: a %T reaches no service in its sandbox (it is not a vm.ServiceDialer)", ErrNotSupported, network, address, v)
	}
	return d, nil
}

// DialContext implements [ServiceDialer]: see [Dial].
func (s *sandbox) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	return s.dial(ctx, network, address, false)
}

// DialListening implements [ServiceDialer]: see [WaitListening].
func (s *sandbox) DialListening(ctx context.Context, network, address string) (net.Conn, error) {
	return s.dial(ctx, network, address, true)
}

func (s *sandbox) dial(ctx context.Context, network, address string, wait bool) (net.Conn, error) {
	c, err := connect(ctx, s, network, address, func(a *agent.Client) (*agent.Conn, <-chan struct{}, error) {
		c, err := a.Dial(ctx, network, address, wait)
		if err != nil {
			return nil, nil, err
		}
		return c, c.Done(), nil
	})
	if err != nil {
		return nil, err // a nil net.Conn, not one holding a nil *agent.Conn
	}
	return &sandboxConn{Conn: c, s: s, what: "read " + network + " " + address}, nil
}

// sandboxConn is a connection of [Dial]: the agent's, whose Read names
// the sandbox's end when the channel to it ended under the connection,
// as a Run's error would. That Read asks the engine, once per
// connection, and may take a few seconds (peerBreakWait and a ping at
// most), whatever its deadline.
type sandboxConn struct {
	*agent.Conn
	s    *sandbox
	what string
	once sync.Once
	err  error
}

func (c *sandboxConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && errors.Is(err, agent.ErrChannelClosed) {
		c.once.Do(func() {
			if c.s.state().removed {
				c.err = fmt.Errorf("vm: %s: %w: %w", c.what, ErrRemoved, err)
			} else {
				c.err = c.s.channelClosed(context.Background(), c.what, err)
			}
		})
		err = c.err
	}
	return n, err
}

// splice connects to address on network in the sandbox, as dial does,
// carrying the connection to and from rw itself (see
// [agent.Client.Splice]): a forward's connection.
func (s *sandbox) splice(ctx context.Context, network, address string, rw io.ReadWriter) (*agent.Splice, error) {
	return connect(ctx, s, network, address, func(a *agent.Client) (*agent.Splice, <-chan struct{}, error) {
		sp, err := a.Splice(ctx, network, address, rw)
		if err != nil {
			return nil, nil, err
		}
		return sp, sp.Ended(), nil
	})
}

// connect makes a connection of the sandbox's agent with open, counted
// against MaxConnections until the channel open returns is closed, and
// names its failure.
func connect[C any](ctx context.Context, s *sandbox, network, address string, open func(*agent.Client) (C, <-chan struct{}, error)) (C, error) {
	var zero C
	st, err := s.dialable(network, address)
	if err != nil {
		return zero, err
	}
	what := "dial " + network + " " + address
	if !s.reserve(&s.conns, MaxConnections) {
		return zero, fmt.Errorf("%w: vm: %s: %d connections are open to this sandbox, the most it holds (vm.MaxConnections)", ErrLimit, what, MaxConnections)
	}
	a, release := st.agent.take()
	c, done, err := open(a)
	if err != nil {
		release()
	} else {
		go func() {
			<-done // counted until it ends, whoever ends it
			release()
			s.release(&s.conns)
		}()
		return c, nil
	}
	s.release(&s.conns)
	switch {
	case ctx.Err() != nil:
		return zero, fmt.Errorf("vm: %s: %w", what, ctx.Err())
	case s.state().removed:
		return zero, fmt.Errorf("vm: %s: %w", what, ErrRemoved)
	}
	return zero, s.agentStartError(ctx, what, err)
}

// dialable returns the state of a sandbox that can dial address on
// network, or why not.
func (s *sandbox) dialable(network, address string) (state, error) {
	what := "dial " + network + " " + address
	switch network {
	case "tcp", "tcp4", "tcp6", "unix":
	default:
		return state{}, fmt.Errorf("vm: %s: %w", what, net.UnknownNetworkError(network))
	}
	st, err := s.container()
	if err != nil {
		return st, err
	}
	if st.agent == nil {
		return st, fmt.Errorf("%w: vm: %s: reaching a service in the sandbox needs podvm's agent; with Config.PodmanExec, give the sandbox a Network and dial its address", ErrNotSupported, what)
	}
	return st, nil
}

// canDial reports, without a connection, whether the sandbox can dial
// address on network (for Forward).
func (s *sandbox) canDial(network, address string) error {
	_, err := s.dialable(network, address)
	return err
}

// Forward listens on the caller's loopback (127.0.0.1, a port of the
// system's choosing) and carries each connection it accepts to address
// on network in sandbox v, as [Dial] makes them: for a client that takes
// an address (a database DSN, a browser, a test runner in another
// process). A connection that cannot be made is closed at once; a
// client's half-close reaches the service, and the service's end reaches
// the client as EOF. The forward lasts until it is closed, or the
// sandbox is removed or dies; each closes its listener and every
// connection it carries. ctx bounds the setting up alone.
func Forward(ctx context.Context, v VM, network, address string, opts ...ForwardOption) (*Forwarder, error) {
	d, err := serviceDialer(v, network, address)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var o forwardOptions
	for _, opt := range opts {
		opt(&o)
	}
	// Whether it can dial at all, without a connection: the service
	// need not listen yet, and may take one connection only.
	if c, ok := capability[interface {
		canDial(network, address string) error
	}](v); ok {
		if err := c.canDial(network, address); err != nil {
			return nil, err
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("vm: forward to %s %s: %w", network, address, err)
	}
	f := &Forwarder{l: l, d: d, network: network, address: address, conns: map[net.Conn]bool{}}
	f.sp, _ = capability[splicer](v)
	f.warm = o.warm && f.sp != nil
	f.ctx, f.cancel = context.WithCancel(context.Background())
	var dead <-chan struct{} // the sandbox's death, when it can tell
	if s, ok := capability[interface {
		holdForward(*Forwarder) (<-chan struct{}, bool)
	}](v); ok {
		if dead, ok = s.holdForward(f); !ok {
			f.cancel()
			l.Close()
			return nil, fmt.Errorf("vm: forward to %s %s: %w", network, address, ErrRemoved)
		}
	}
	select {
	case <-dead:
		f.Close()
		return nil, fmt.Errorf("vm: forward to %s %s: the sandbox's agent is gone: %w", network, address, ErrContainerNotRunning)
	default:
	}
	f.prepare()
	f.wg.Add(1)
	go f.serve()
	if dead != nil {
		go func() {
			select {
			case <-dead: // killed from outside, say
				f.Close()
			case <-f.ctx.Done():
			}
		}()
	}
	return f, nil
}

// A ForwardOption adjusts a [Forward].
type ForwardOption func(*forwardOptions)

type forwardOptions struct{ warm bool }

// WithWarmConnection keeps one connection to the service made ahead of
// the next client, so that a client's connect costs no connect in the
// sandbox: at the forward's start, then again once each client's
// connection ended. The service sees that connection open before any
// client comes (and closed, unused, at the forward's end), and it counts
// against [MaxConnections]: leave the option out for a service that
// counts or limits its connections. One the service closed while it
// waited is not used. A VM whose agent cannot carry a client's socket
// itself (a ServiceDialer of the caller's) makes no warm connection.
func WithWarmConnection() ForwardOption {
	return func(o *forwardOptions) { o.warm = true }
}

// splicer is a sandbox that carries a forward's connection without a
// copy of its own ([agent.Client.Splice]).
type splicer interface {
	splice(ctx context.Context, network, address string, rw io.ReadWriter) (*agent.Splice, error)
}

// Forwarder is a forward of [Forward]: a listener on the caller's
// loopback whose connections go to one address in a sandbox.
type Forwarder struct {
	l                net.Listener
	d                ServiceDialer
	sp               splicer // nil: connections through d, copied
	network, address string
	warm             bool
	wg               sync.WaitGroup
	release          func() // forgets f in its sandbox, if any
	ctx              context.Context
	cancel           context.CancelFunc // ends the dials in flight, at Close

	mu        sync.Mutex
	conns     map[net.Conn]bool // the client's ends, and a copy's sandbox ends
	spare     *late             // a warm connection, waiting for a client
	preparing chan struct{}     // one is being made; closed when it is
	closed    bool
}

// Addr is the address the forward listens on: 127.0.0.1 and its port.
func (f *Forwarder) Addr() net.Addr { return f.l.Addr() }

// Close closes the listener and every connection the forward carries,
// and returns once it has stopped.
func (f *Forwarder) Close() error {
	f.cancel()
	f.mu.Lock()
	f.closed = true
	for c := range f.conns {
		c.Close()
	}
	spare := f.spare
	f.spare = nil
	f.mu.Unlock()
	if spare != nil {
		spare.discard()
	}
	err := f.l.Close()
	f.wg.Wait()
	if f.release != nil {
		f.release()
	}
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

const (
	// forwardDial bounds the dial of one forwarded connection.
	forwardDial = 30 * time.Second
	// forwardLinger bounds how long a forwarded connection whose
	// service's end closed waits for its client to close, after the
	// client read EOF: closing a socket with bytes unread would reset it,
	// and the client could lose the end of the answer.
	forwardLinger = time.Second
)

func (f *Forwarder) serve() {
	defer f.wg.Done()
	for {
		c, err := f.l.Accept()
		if err != nil {
			return
		}
		if !f.track(c) {
			c.Close()
			return
		}
		f.wg.Add(1)
		if f.sp != nil {
			go f.carrySplice(c)
		} else {
			go f.carry(c)
		}
	}
}

// track adds c to the connections to close, unless the forward is
// closed.
func (f *Forwarder) track(c net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return false
	}
	f.conns[c] = true
	return true
}

func (f *Forwarder) untrack(cs ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range cs {
		delete(f.conns, c)
		c.Close()
	}
}

// carrySplice carries client connection c to the sandbox's address: the
// agent's client reads and writes c itself. Once the service's end
// closed, c gets EOF and, forwardLinger at most, its unread bytes are
// drained before it is closed; a client gone (a write to it failed, or
// its connection reset) ends the service's side too.
func (f *Forwarder) carrySplice(c net.Conn) {
	defer f.wg.Done()
	defer f.prepare() // the next warm connection, once this one is over
	rw := &clientConn{Conn: c, failed: make(chan struct{}), gone: make(chan struct{})}
	var sp *agent.Splice
	if spare := f.takeSpare(); spare != nil {
		sp = spare.sp
		spare.attach(rw)
	} else {
		var err error
		// f.ctx: the agent's own timeout bounds the connect, Close
		// ends it.
		if sp, err = f.sp.splice(f.ctx, f.network, f.address, rw); err != nil {
			f.untrack(c)
			return
		}
	}
	failed, gone := rw.failed, rw.gone
	for done := false; !done; {
		select {
		case <-sp.Done():
			done = true
		case <-failed: // the client's EOF: a half-close, or its end
			if rw.err() != io.EOF {
				sp.Close()
			}
			failed = nil
		case <-gone:
			sp.Close()
			gone = nil
		case <-f.ctx.Done():
			sp.Close()
			t := time.NewTimer(agent.KillWait)
			select {
			case <-sp.Done():
			case <-t.C: // an agent that does not answer holds no Close
			}
			t.Stop()
			f.untrack(c)
			return
		}
	}
	switch err := sp.Err(); {
	case err != nil && sp.Connected():
		reset(c) // the service's side failed: the client is not told it closed
	case err != nil: // never connected (nothing listens there): closed, as by the copy
	default:
		if cw, ok := c.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
			_ = c.SetReadDeadline(time.Now().Add(forwardLinger))
			_, _ = io.Copy(io.Discard, rw)
		}
	}
	f.untrack(c)
}

// reset closes c with a reset where it is a TCP connection, so that its
// peer reads a failure, not an end: what it read may be cut short.
func reset(c net.Conn) {
	if tc, ok := c.(interface{ SetLinger(int) error }); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// clientConn is a client's connection as a splice reads and writes it:
// failed is closed once a Read failed (io.EOF included), gone once a
// Write did.
type clientConn struct {
	net.Conn
	rOnce, wOnce sync.Once
	failed, gone chan struct{}
	rerr         error
}

func (c *clientConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.rOnce.Do(func() {
			c.rerr = err
			close(c.failed)
		})
	}
	return n, err
}

func (c *clientConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil {
		c.wOnce.Do(func() { close(c.gone) })
	}
	return n, err
}

// err is the Read's error, once failed is closed.
func (c *clientConn) err() error { return c.rerr }

// late is the ReadWriter of a warm connection: its Reads and Writes
// wait until a client's connection is attached, and fail if none is.
type late struct {
	sp    *agent.Splice
	ready chan struct{} // closed by attach or discard
	once  sync.Once
	rw    io.ReadWriter // set before ready is closed; nil when discarded
}

func (l *late) Read(p []byte) (int, error) {
	<-l.ready
	if l.rw == nil {
		return 0, net.ErrClosed
	}
	return l.rw.Read(p)
}

func (l *late) Write(p []byte) (int, error) {
	<-l.ready
	if l.rw == nil {
		return 0, net.ErrClosed
	}
	return l.rw.Write(p)
}

func (l *late) attach(rw io.ReadWriter) {
	l.once.Do(func() {
		l.rw = rw
		close(l.ready)
	})
}

func (l *late) discard() {
	l.once.Do(func() { close(l.ready) })
	if l.sp != nil {
		l.sp.Close()
	}
}

// prepare makes the warm connection of a forward WithWarmConnection that
// has none.
func (f *Forwarder) prepare() {
	if !f.warm {
		return
	}
	f.mu.Lock()
	if f.closed || f.spare != nil || f.preparing != nil {
		f.mu.Unlock()
		return
	}
	done := make(chan struct{})
	f.preparing = done
	f.mu.Unlock()
	l := &late{ready: make(chan struct{})}
	// f.ctx: the agent's own timeout bounds the connect, Close ends it.
	sp, err := f.sp.splice(f.ctx, f.network, f.address, l)
	f.mu.Lock()
	defer f.mu.Unlock()
	defer close(done)
	f.preparing = nil
	switch {
	case err != nil: // the next client's end tries again
	case f.closed:
		sp.Close()
		l.discard()
	default:
		l.sp, f.spare = sp, l
	}
}

// takeSpare returns the warm connection, if one is made and its service
// has not closed it; the next is made once the client's connection ends.
// A client that comes while one is being made waits for it: it was
// begun before a connection of the client's own could be.
func (f *Forwarder) takeSpare() *late {
	f.mu.Lock()
	if preparing := f.preparing; f.spare == nil && preparing != nil {
		f.mu.Unlock()
		<-preparing // the agent's own timeout bounds it, Close ends it
		f.mu.Lock()
	}
	l := f.spare
	f.spare = nil
	f.mu.Unlock()
	if l == nil {
		return nil
	}
	select {
	case <-l.sp.Ended():
		l.discard()
		return nil
	default:
		return l
	}
}

// carry connects c to the sandbox's address through a ServiceDialer of
// the caller's and copies both ways: a half-close passes on, and once
// the sandbox's side ended, the client has forwardLinger to close.
func (f *Forwarder) carry(c net.Conn) {
	defer f.wg.Done()
	ctx, cancel := context.WithTimeout(f.ctx, forwardDial)
	sc, err := f.d.DialContext(ctx, f.network, f.address)
	cancel()
	if err != nil {
		f.untrack(c)
		return
	}
	if !f.track(sc) {
		f.untrack(c, sc)
		return
	}
	up := make(chan struct{})
	go func() {
		f.pass(sc, c)
		close(up)
	}()
	f.pass(c, sc)
	t := time.NewTimer(forwardLinger)
	select {
	case <-up:
	case <-t.C:
	}
	t.Stop()
	f.untrack(c, sc)
	<-up
}

// pass copies src to dst until src ends, then half-closes dst (closes it
// when it has no half-close). When src failed instead (reset), or dst
// did, dst is reset ([reset]): its peer is not told the stream ended.
// One the forward closed itself (its Close, or the end of its linger)
// is closed.
func (f *Forwarder) pass(dst, src net.Conn) {
	buf := make([]byte, 128<<10)
	_, err := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, buf)
	if err != nil && f.ctx.Err() == nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.ErrClosedPipe) {
		reset(dst)
	} else if cw, ok := dst.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	} else {
		dst.Close()
	}
}
