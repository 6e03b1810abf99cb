package agent

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/netip"
	"os"
	osexec "os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/agent/psk"
	"github.com/podvm/podvm/internal/testkit"
)

// listenPeers asks a for its peers' port with a fresh key and returns
// the address and the key.
func listenPeers(t *testing.T, a *testAgent) (string, []byte) {
	t.Helper()
	key := psk.NewKey()
	l, err := a.Listen(context.Background(), key, 0)
	require.NoError(t, err)
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(l.Port)), key
}

// A peer with the key is a channel like the first: same agent, runs
// and connections; the agent listens once.
func TestPeer(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := context.Background()
	addr, key := listenPeers(t, a)
	_, err := a.Listen(ctx, psk.NewKey(), 0)
	assert.ErrorContains(t, err, "already listening")

	p, err := DialPeer(ctx, addr, key)
	require.NoError(t, err)
	defer p.Close()
	assert.Equal(t, a.Info().PID, p.Info().PID, "the same agent")
	var out, errs bytes.Buffer
	ex, err := p.Run(ctx, Request{Argv: []string{"echo", "over the peer"}}, nil, &out, &errs)
	require.NoError(t, err)
	assert.Equal(t, 0, ex.Code)
	assert.Equal(t, "over the peer\n", out.String())

	// Two peers at once, and the first channel, each its own run ids.
	q, err := DialPeer(ctx, addr, key)
	require.NoError(t, err)
	defer q.Close()
	for _, c := range []*Client{a.Client, p, q} {
		var out bytes.Buffer
		_, err := c.Run(ctx, Request{Argv: []string{"echo", "ok"}}, nil, &out, io.Discard)
		require.NoError(t, err)
		assert.Equal(t, "ok\n", out.String())
	}
}

// Without the key nothing is served, and a port nobody asked for is
// not open.
func TestPeerWithoutTheKey(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	addr, _ := listenPeers(t, a)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := DialPeer(ctx, addr, psk.NewKey())
	assert.ErrorIs(t, err, ErrChannelClosed)
	assert.ErrorIs(t, err, psk.ErrAuth)

	// A client that says nothing is dropped; the agent serves others.
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = a.Listen(ctx, []byte("short"), 0)
	assert.ErrorContains(t, err, "a key of 5 bytes")
}

// A peer's end kills its runs, and only its own: the agent and its
// first channel live on.
func TestPeerEndKillsItsRuns(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := context.Background()
	addr, key := listenPeers(t, a)
	p, err := DialPeer(ctx, addr, key)
	require.NoError(t, err)
	proc, err := p.Start(ctx, Request{Argv: []string{"sleep", "1000"}}, nil, io.Discard, io.Discard)
	require.NoError(t, err)
	mine, err := a.Start(ctx, Request{Argv: []string{"sleep", "1001"}}, nil, io.Discard, io.Discard)
	require.NoError(t, err)
	defer mine.Kill()
	require.NoError(t, p.Close())

	alive := func(pid int) bool {
		ex, err := a.Run(ctx, Request{Argv: []string{"test", "-e", "/proc/" + strconv.Itoa(pid)}}, nil, io.Discard, io.Discard)
		require.NoError(t, err)
		return ex.Code == 0
	}
	require.Eventually(t, func() bool { return !alive(proc.PID()) }, 30*time.Second, 50*time.Millisecond, "the peer's sleep outlived it")
	assert.True(t, alive(mine.PID()), "the first channel's run died with a peer")
}

// Listen names the sandbox's own addresses: those of its interfaces that
// are up, global unicast only (not loopback, not link-local). The agent
// runs in a network namespace of its own, with a veth pair: v0 up with
// an IPv4 and an IPv6 address, v1 down with one more.
func TestListenNamesOwnAddresses(t *testing.T) {
	t.Parallel()
	needAgent(t)
	if _, err := osexec.LookPath("ip"); err != nil {
		testkit.SkipOrFail(t, "", "needs ip (iproute2) to give the agent a network of its own")
	}
	want := []netip.Addr{netip.MustParseAddr("192.0.2.7")}
	v6 := ""
	if _, err := os.Stat("/proc/net/if_inet6"); err == nil { // a kernel with IPv6
		want = append(want, netip.MustParseAddr("2001:db8::7"))
		v6 = `ip -6 addr add 2001:db8::7/64 dev v0 nodad && `
	}
	setup := `ip link add v0 type veth peer name v1 && ip addr add 192.0.2.7/24 dev v0 && ` + v6 +
		`ip addr add 198.51.100.9/24 dev v1 && ip link set lo up && ip link set v0 up || exit; exec "$0"`
	a := startAgentCommand(t, []string{"--net", "--pid", "--fork", "--mount-proc", "--kill-child", "/bin/sh", "-c", setup, agentBin},
		func(out io.Reader, in io.Writer) io.ReadWriteCloser {
			return &pipes{Reader: out, Writer: in, closers: []io.Closer{in.(io.Closer), out.(io.Closer)}}
		})
	l, err := a.Listen(context.Background(), psk.NewKey(), 0)
	require.NoError(t, err)
	assert.NotZero(t, l.Port)
	assert.ElementsMatch(t, want, l.Addrs)
}
