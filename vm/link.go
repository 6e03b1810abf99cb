package vm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/podvm/podvm/internal/agent"
	"github.com/podvm/podvm/internal/agent/psk"
	"github.com/podvm/podvm/internal/driver"
)

// This file is how calls reach a sandbox's agent: on the channel Create
// made, whose end is the sandbox's end, or, where the driver gives the
// sandbox a network address ([driver.Addresser]: a pod) and the caller
// reaches it, on peers: TCP connections to the agent at that address (or
// the sandbox's own, as its agent finds it, while the engine has not
// reported one: peerAddress), secured by a key that only the first
// channel carried (package psk).
// On Kubernetes the first channel is the API server's attach stream, a
// relay through the API server and the kubelet that every byte of every
// call would share; peers go the pod network's way, each its own
// stream, so a large copy on one does not hold back a Run on another.
//
// The first peer is made as the sandbox is made: Create waits for it
// (firstPeerWait at most), so that its calls go the same way from the
// first. Then one more is made, in the background, whenever a call takes
// the last idle one, up to maxPeers; once a dial failed, no more are made.
// Until one answers, calls take the first channel. A service whose first
// connection could not be made (the caller does not reach the pod
// network) is not tried again for its later sandboxes, for
// unreachableFor. A call takes
// the peer with the fewest calls in flight. A peer's end fails the calls
// on it (agent.ErrChannelClosed) and kills their processes; the sandbox
// lives on. As the network between may be cut, with the other peers not
// knowing it yet, no call takes a peer from then on: later calls take
// the first channel, and the other peers close once their calls ended.

// maxPeers bounds the peers of one sandbox.
const maxPeers = 4

// firstPeerWait bounds how long Create waits for the first peer: a
// caller that the pod network drops silently pays it once per service
// (unreachableFor).
const firstPeerWait = 3 * time.Second

// unreachableFor is how long a service whose pods a dial did not reach
// is not tried again.
const unreachableFor = 10 * time.Minute

// unreachable holds the services whose pods the caller did not reach:
// service name → when that was found.
var unreachable sync.Map

// peerDial bounds the making of one peer: the pod's address, the
// agent's port, the connection and both handshakes. A caller that does
// not reach the pod network finds out within it, in the background.
const peerDial = 10 * time.Second

// link is the way to a sandbox's agent.
type link struct {
	main *agent.Client
	// dial makes a peer; nil when the sandbox has none (no address, or a
	// dial failed).
	dial func(context.Context) (*agent.Client, error)

	ctx    context.Context // ended by close: it ends a dial under way
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu         sync.Mutex
	peers      []*peer
	dialing    bool
	closed     bool
	settled    chan struct{} // closed once the first dial ended
	settleOnce sync.Once
	reached    bool        // a peer was made: the pod network reaches the sandbox
	failed     func(error) // called with a first dial's error; may be nil
	retired    []*peer     // peers no call takes, busy when retired
}

// peer is a channel over the network, and how many calls are on it.
type peer struct {
	c       *agent.Client
	busy    atomic.Int32
	retired bool // under link.mu: no call takes it; it closes once idle
}

// newLink returns the link over main; with dial, it starts making the
// first peer, and calls failed if a dial fails.
func newLink(main *agent.Client, dial func(context.Context) (*agent.Client, error), failed func(error)) *link {
	l := &link{main: main, dial: dial, settled: make(chan struct{}), failed: failed}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	if dial == nil {
		close(l.settled)
		return l
	}
	l.mu.Lock()
	l.growLocked()
	l.mu.Unlock()
	return l
}

// settle waits until the first dial ended, bound or ctx ends first.
func (l *link) settle(ctx context.Context, bound time.Duration) {
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-l.settled:
	case <-t.C:
	case <-ctx.Done():
	}
}

// take returns the client a call goes on, and done, which the call
// calls once it ended.
func (l *link) take() (c *agent.Client, done func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var best *peer
	idle := 0
	for _, p := range l.peers {
		select {
		case <-p.c.Dead():
			// One broke: the network between us may be cut, and the
			// others not know it yet. No call takes a peer from now on;
			// those in flight finish on theirs.
			l.retireLocked()
			return l.main, func() {}
		default:
		}
		n := p.busy.Load()
		if n == 0 {
			idle++
		}
		if best == nil || n < best.busy.Load() {
			best = p
		}
	}
	if idle <= 1 {
		// This call takes the last idle peer, if any: make one for the
		// next.
		l.growLocked()
	}
	if best == nil {
		return l.main, func() {}
	}
	best.busy.Add(1)
	var once sync.Once
	return best.c, func() { once.Do(func() { l.leave(best) }) }
}

// leave ends a call on p: a retired peer closes once idle.
func (l *link) leave(p *peer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.busy.Add(-1) == 0 && p.retired {
		p.c.Close()
	}
}

// retireLocked stops using peers for good: the idle ones close now, the
// busy ones once their calls end; no more are made.
func (l *link) retireLocked() {
	l.dial = nil
	for _, p := range l.peers {
		p.retired = true
		if p.busy.Load() == 0 {
			p.c.Close()
		} else {
			l.retired = append(l.retired, p)
		}
	}
	l.peers = nil
}

// growLocked starts making a peer, unless one is being made, there is
// no way to, or there are enough.
func (l *link) growLocked() {
	if l.dial == nil || l.dialing || l.closed || len(l.peers) >= maxPeers {
		return
	}
	l.dialing = true
	dial := l.dial
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		ctx, cancel := context.WithTimeout(l.ctx, peerDial)
		c, err := dial(ctx)
		cancel()
		l.mu.Lock()
		defer l.mu.Unlock()
		defer l.settleOnce.Do(func() { close(l.settled) })
		l.dialing = false
		switch {
		case err != nil:
			l.dial = nil // the caller does not reach it: the first channel it is
			if l.failed != nil && !l.reached && l.ctx.Err() == nil {
				l.failed(err)
			}
		case l.closed || l.dial == nil:
			c.Close() // closed, or the peers retired meanwhile
		default:
			l.peers = append(l.peers, &peer{c: c})
			l.reached = true
		}
	}()
}

// dead is closed once the sandbox's agent is gone: the first channel's
// end.
func (l *link) dead() <-chan struct{} { return l.main.Dead() }

// close closes every channel, the first last, and returns once no peer
// is being made.
func (l *link) close() {
	l.mu.Lock()
	l.closed = true
	peers := append(l.peers, l.retired...)
	l.peers, l.retired = nil, nil
	l.mu.Unlock()
	l.cancel()
	l.wg.Wait()
	for _, p := range peers {
		p.c.Close()
	}
	l.main.Close()
}

// peerDialer returns how to make a peer of the agent of container id,
// reached on main, or nil when the driver gives containers no address.
// The first call asks the agent to listen, with a fresh key; every call
// dials the address and port it answered.
func peerDialer(d driver.Driver, id string, main *agent.Client) func(context.Context) (*agent.Client, error) {
	ad, ok := d.(driver.Addresser)
	if !ok {
		return nil
	}
	_, service := d.Local()
	if at, ok := unreachable.Load(service); ok && time.Since(at.(time.Time)) < unreachableFor {
		return nil
	}
	key := psk.NewKey()
	var address string
	return func(ctx context.Context) (*agent.Client, error) {
		if address == "" {
			a, err := peerAddress(ctx, ad, id, func(ctx context.Context) (agent.Listening, error) {
				return main.Listen(ctx, key, agent.PeerPort)
			})
			if err != nil {
				return nil, err
			}
			address = a
		}
		c, err := agent.DialPeer(ctx, address, key)
		if op := (*net.OpError)(nil); errors.As(err, &op) && op.Op == "dial" {
			err = fmt.Errorf("%w: %w", errUnreached, err)
		}
		return c, err
	}
}

// peerAddress asks the engine once whether container id has an address
// a peer may be dialled at (an error when it has none to offer, as a
// pod on its node's network), has the agent listen, and returns where to
// dial it: the engine's address, or, while the engine has not reported
// one yet, the agent's own when it has exactly one (a pod's status names
// its IP only at the kubelet's next relist, up to a second after the
// container runs), else the engine's once it has one. The agent, the
// sandbox's PID 1, answers for the sandbox as much in this as in every
// Run; a peer must prove it holds the key wherever it is dialled.
func peerAddress(ctx context.Context, ad driver.Addresser, id string, listen func(context.Context) (agent.Listening, error)) (string, error) {
	ip, err := ad.Address(ctx, id)
	if err != nil {
		return "", err
	}
	l, err := listen(ctx)
	if err != nil {
		return "", err
	}
	if ip == "" && len(l.Addrs) == 1 {
		ip = l.Addrs[0].String()
	}
	if ip == "" {
		if ip, err = podAddress(ctx, ad, id); err != nil {
			return "", err
		}
	}
	return net.JoinHostPort(ip, strconv.Itoa(l.Port)), nil
}

// errUnreached: the connection to a sandbox's address could not be made.
var errUnreached = errors.New("vm: the sandbox's address is out of the caller's reach")

// errNoAddress: the container has no address yet.
var errNoAddress = errors.New("vm: the sandbox has no network address")

// podAddress asks ad for container id's address until it has one:
// a pod's status may name its IP a moment after it runs.
func podAddress(ctx context.Context, ad driver.Addresser, id string) (string, error) {
	for {
		ip, err := ad.Address(ctx, id)
		switch {
		case err != nil:
			return "", err
		case ip != "":
			return ip, nil
		case !sleepCtx(ctx, 100*time.Millisecond):
			return "", errNoAddress
		}
	}
}
