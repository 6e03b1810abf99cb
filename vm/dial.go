package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
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
// the connect alone. The connection ends when the sandbox's side closes
// it, when it is closed, or when the sandbox is removed or dies; its
// deadlines work as any net.Conn's, and it has no half-close. A VM that
// is not a [ServiceDialer] fails with [ErrNotSupported].
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
	st, err := s.dialable(network, address)
	if err != nil {
		return nil, err
	}
	what := "dial " + network + " " + address
	if !s.reserve(&s.conns, MaxConnections) {
		return nil, fmt.Errorf("%w: vm: %s: %d connections are open to this sandbox, the most it holds (vm.MaxConnections)", ErrLimit, what, MaxConnections)
	}
	c, err := st.agent.Dial(ctx, network, address, wait)
	if err == nil {
		// Counted until the connection ends, whoever ends it.
		go func() {
			<-c.(interface{ Done() <-chan struct{} }).Done()
			s.release(&s.conns)
		}()
		return c, nil
	}
	s.release(&s.conns)
	switch {
	case ctx.Err() != nil:
		return nil, fmt.Errorf("vm: %s: %w", what, ctx.Err())
	case s.state().removed:
		return nil, fmt.Errorf("vm: %s: %w", what, ErrRemoved)
	}
	return nil, s.agentStartError(ctx, what, err)
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
// process). A connection that cannot be made is closed at once. The
// forward lasts until it is closed or the sandbox is removed; either
// closes its listener and every connection it carries. ctx bounds the
// setting up alone.
func Forward(ctx context.Context, v VM, network, address string) (*Forwarder, error) {
	d, err := serviceDialer(v, network, address)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
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
	f.ctx, f.cancel = context.WithCancel(context.Background())
	if s, ok := capability[interface{ holdForward(*Forwarder) bool }](v); ok && !s.holdForward(f) {
		l.Close()
		return nil, fmt.Errorf("vm: forward to %s %s: %w", network, address, ErrRemoved)
	}
	f.wg.Add(1)
	go f.serve()
	return f, nil
}

// Forwarder is a forward of [Forward]: a listener on the caller's
// loopback whose connections go to one address in a sandbox.
type Forwarder struct {
	l                net.Listener
	d                ServiceDialer
	network, address string
	wg               sync.WaitGroup
	release          func() // forgets f in its sandbox, if any
	ctx              context.Context
	cancel           context.CancelFunc // ends the dials in flight, at Close

	mu     sync.Mutex
	conns  map[net.Conn]bool // both ends of every pair carried
	closed bool
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
	f.mu.Unlock()
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

// forwardDial bounds the dial of one forwarded connection.
const forwardDial = 30 * time.Second

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
		go f.carry(c)
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

// carry connects c to the sandbox's address and copies both ways until
// either side ends; then both are closed (a connection to the sandbox
// has no half-close to pass a client's on with).
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
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(sc, c)
		f.untrack(c, sc)
		close(done)
	}()
	_, _ = io.Copy(c, sc)
	f.untrack(c, sc)
	<-done
}
