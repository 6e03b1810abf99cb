package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/agent"
	"github.com/podvm/podvm/internal/agent/wire"
)

// fakeAgent returns a client of an agent that says Hello and then reads
// whatever comes, and the agent's end, whose Close ends the channel.
func fakeAgent(t *testing.T) (*agent.Client, net.Conn) {
	t.Helper()
	ours, theirs := net.Pipe()
	go func() {
		_ = wire.Write(theirs, wire.Frame{Type: wire.Hello, Payload: wire.HelloMsg{Version: wire.Version}.Encode()})
		_, _ = io.Copy(io.Discard, theirs)
	}()
	c, err := agent.NewClient(ours)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(); theirs.Close() })
	return c, theirs
}

// fakeLink is a link over fake agents whose every dial makes a peer. It
// returns the link, its first channel, the peers' agent ends in the order
// they were made, how many peers it holds, and how many dials there were.
func fakeLink(t *testing.T) (l *link, main *agent.Client, ends chan net.Conn, peers func() int, dials *atomic.Int32) {
	t.Helper()
	main, _ = fakeAgent(t)
	ends, dials = make(chan net.Conn, 2*maxPeers), new(atomic.Int32)
	l = newLink(main, func(context.Context) (*agent.Client, error) {
		dials.Add(1)
		c, end := fakeAgent(t)
		ends <- end
		return c, nil
	}, nil)
	t.Cleanup(l.close)
	peers = func() int { l.mu.Lock(); defer l.mu.Unlock(); return len(l.peers) }
	return l, main, ends, peers, dials
}

// Without a way to make peers, every call takes the first channel.
func TestLinkWithoutPeers(t *testing.T) {
	main, _ := fakeAgent(t)
	l := newLink(main, nil, nil)
	defer l.close()
	c, done := l.take()
	defer done()
	assert.Same(t, main, c)
}

// The first peer is made at once; calls take the least busy peer, and
// more are made while all are busy, up to maxPeers.
func TestLinkTakesTheLeastBusyPeer(t *testing.T) {
	l, main, _, peers, dials := fakeLink(t)
	require.Eventually(t, func() bool { return peers() == 1 }, 10*time.Second, time.Millisecond)

	first, done1 := l.take()
	assert.NotSame(t, main, first, "a peer, once there is one")
	// The only peer is busy: a second one is made for later calls.
	require.Eventually(t, func() bool { return peers() == 2 }, 10*time.Second, time.Millisecond)
	second, done2 := l.take()
	assert.NotSame(t, first, second, "the idle peer")
	done2()
	again, done3 := l.take()
	assert.Same(t, second, again, "the idle one again, not the busy first")
	done3()

	// Busy calls grow the peers to maxPeers and no further.
	var dones []func()
	for range 3 * maxPeers {
		_, d := l.take()
		dones = append(dones, d)
		time.Sleep(5 * time.Millisecond)
	}
	require.Eventually(t, func() bool { return peers() == maxPeers }, 10*time.Second, time.Millisecond)
	for _, d := range dones {
		d()
	}
	done1()
	assert.EqualValues(t, maxPeers, dials.Load())
}

// Once a peer broke, calls take the first channel: the others may be
// cut too. An idle one closes at once, a busy one once its call ended.
func TestLinkRetiresPeersWhenOneBroke(t *testing.T) {
	l, main, ends, peers, _ := fakeLink(t)
	require.Eventually(t, func() bool { return peers() == 1 }, 10*time.Second, time.Millisecond)
	busy, done := l.take() // and a second peer is made
	require.Eventually(t, func() bool { return peers() == 2 }, 10*time.Second, time.Millisecond)
	idle, idleDone := l.take()
	idleDone()
	require.NotSame(t, busy, idle)

	// The busy one's channel breaks.
	(<-ends).Close()
	require.Eventually(t, func() bool { return isDead(busy) }, 10*time.Second, time.Millisecond)
	for range 3 {
		c, d := l.take()
		assert.Same(t, main, c, "the first channel, once a peer broke")
		d()
	}
	assert.True(t, isDead(idle), "an idle peer closes at once")
	assert.Zero(t, peers())
	done()

	// A busy one that did not break closes once its call is done.
	l2, main2, ends2, peers2, _ := fakeLink(t)
	require.Eventually(t, func() bool { return peers2() == 1 }, 10*time.Second, time.Millisecond)
	first, firstDone := l2.take()
	require.Eventually(t, func() bool { return peers2() == 2 }, 10*time.Second, time.Millisecond)
	second, secondDone := l2.take()
	<-ends2
	(<-ends2).Close() // the second peer's
	require.Eventually(t, func() bool { return isDead(second) }, 10*time.Second, time.Millisecond)
	secondDone()
	c, d := l2.take()
	d()
	assert.Same(t, main2, c)
	assert.False(t, isDead(first), "a busy peer that did not break runs its call to the end")
	firstDone()
	assert.True(t, isDead(first), "and closes then")
}

func isDead(c *agent.Client) bool {
	select {
	case <-c.Dead():
		return true
	default:
		return false
	}
}

// A dial that fails (the caller does not reach the pod network) is not
// tried again: the first channel carries everything.
func TestLinkStopsDialingOnceADialFailed(t *testing.T) {
	main, _ := fakeAgent(t)
	var dials atomic.Int32
	var failed atomic.Int32
	l := newLink(main, func(context.Context) (*agent.Client, error) {
		dials.Add(1)
		return nil, errors.New("no route to host")
	}, func(error) { failed.Add(1) })
	defer l.close()
	settled := time.Now()
	l.settle(context.Background(), time.Minute)
	assert.Less(t, time.Since(settled), 30*time.Second, "settle returns once the first dial ended")
	l.mu.Lock()
	assert.Nil(t, l.dial, "no dial after one failed")
	l.mu.Unlock()
	assert.EqualValues(t, 1, failed.Load(), "the failure is reported, for the service's later sandboxes")
	for range 10 {
		c, done := l.take()
		assert.Same(t, main, c)
		done()
	}
	assert.EqualValues(t, 1, dials.Load())
}

// close ends a dial under way and closes the first channel.
func TestLinkCloseEndsADial(t *testing.T) {
	main, _ := fakeAgent(t)
	started := make(chan struct{})
	l := newLink(main, func(ctx context.Context) (*agent.Client, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	}, nil)
	<-started
	closed := make(chan struct{})
	go func() { l.close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("close waited for a dial that ctx should have ended")
	}
	assert.True(t, isDead(main))
}

// close closes a peer retired while busy, whose call has not ended.
func TestLinkCloseClosesRetiredPeers(t *testing.T) {
	l, _, ends, peers, _ := fakeLink(t)
	require.Eventually(t, func() bool { return peers() == 1 }, 10*time.Second, time.Millisecond)
	busy, _ := l.take() // never done
	require.Eventually(t, func() bool { return peers() == 2 }, 10*time.Second, time.Millisecond)
	<-ends
	(<-ends).Close() // the other peer breaks: all retire
	require.Eventually(t, func() bool {
		c, d := l.take()
		d()
		return c != busy && peers() == 0
	}, 10*time.Second, time.Millisecond)
	assert.False(t, isDead(busy), "busy: left to its call")
	l.close()
	assert.True(t, isDead(busy), "closed with the link")
}

// addresses is an engine that reports a container's address only from
// its answer number at on (1 the first), and fails with err if set.
type addresses struct {
	ip    string
	at    int
	err   error
	asked int
}

func (a *addresses) Address(context.Context, string) (string, error) {
	a.asked++
	if a.err != nil || a.asked < a.at {
		return "", a.err
	}
	return a.ip, nil
}

// A peer is dialled at the engine's address when it has one, else at the
// agent's own address, when it has exactly one, without waiting for the
// engine (a pod's status names its IP up to a second late); with none or
// several of its own, at the engine's once it reports one. A container
// the engine gives no address is never asked to listen.
func TestPeerAddress(t *testing.T) {
	t.Parallel()
	addrs := func(s ...string) []netip.Addr {
		out := make([]netip.Addr, len(s))
		for i, a := range s {
			out[i] = netip.MustParseAddr(a)
		}
		return out
	}
	noAddress := fmt.Errorf("%w: on the node's network", ErrNotSupported)
	for _, c := range []struct {
		name   string
		engine addresses
		own    []netip.Addr
		listen error
		want   string
		asked  int // the engine's answers
		err    error
	}{
		{name: "the engine's first", engine: addresses{ip: "10.244.0.9", at: 1}, own: addrs("10.244.0.8"), want: "10.244.0.9:7", asked: 1},
		{name: "the agent's own while the engine has none", engine: addresses{ip: "10.244.0.9", at: 5}, own: addrs("10.244.0.9"), want: "10.244.0.9:7", asked: 1},
		{name: "the agent's own IPv6", engine: addresses{at: 5}, own: addrs("fd00::9"), want: "[fd00::9]:7", asked: 1},
		{name: "several of its own: the engine's, waited for", engine: addresses{ip: "10.244.0.9", at: 3}, own: addrs("10.244.0.9", "fd00::9"), want: "10.244.0.9:7", asked: 3},
		{name: "none of its own: the engine's, waited for", engine: addresses{ip: "10.244.0.9", at: 2}, want: "10.244.0.9:7", asked: 2},
		{name: "the engine gives none", engine: addresses{err: noAddress}, own: addrs("10.244.0.9"), asked: 1, err: noAddress},
		{name: "the agent does not listen", engine: addresses{ip: "10.244.0.9", at: 1}, listen: errors.New("already listening"), asked: 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			listened := 0
			got, err := peerAddress(context.Background(), &c.engine, "id", func(context.Context) (agent.Listening, error) {
				listened++
				return agent.Listening{Port: 7, Addrs: c.own}, c.listen
			})
			assert.Equal(t, c.asked, c.engine.asked, "the engine's answers")
			switch {
			case c.err != nil:
				require.ErrorIs(t, err, c.err)
				assert.Zero(t, listened, "asked to listen")
			case c.listen != nil:
				require.ErrorIs(t, err, c.listen)
			default:
				require.NoError(t, err)
				assert.Equal(t, c.want, got)
				assert.Equal(t, 1, listened)
			}
		})
	}
}
