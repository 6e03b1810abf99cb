package agent

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/podvm/podvm/internal/agent/psk"
)

// PeerPort is the port a sandbox's agent listens on for peers where the
// driver gives sandboxes addresses of their own (a pod's): a fixed one, so
// that a NetworkPolicy that denies a pod everything else can let just
// that port in. The handshake, not the port, keeps others out.
const PeerPort = 7337

// peerQuiet is how long a peer's connection may go without an answer
// from the other end (an acknowledgement or a keepalive's) before it is
// taken for broken: its calls then fail, instead of waiting for TCP's
// retransmissions to give up, a quarter of an hour later.
const peerQuiet = 30 * time.Second

// DialPeer connects to the port an agent listens on after
// [Client.Listen] with key, at address (host:port), and returns a client
// over that channel, a session of its own beside the first: its runs
// die with it, and the agent lives on. ctx bounds the connection and
// both handshakes (psk's, then the agent's Hello).
func DialPeer(ctx context.Context, address string, key []byte) (*Client, error) {
	d := net.Dialer{
		// A peer gone quiet (a pod network cut without a reset) is found
		// out: idle, by keepalives; with data unacknowledged, by the
		// user timeout (peer_linux.go).
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: peerQuiet / 3, Interval: peerQuiet / 6, Count: 3},
		Control:         userTimeout(peerQuiet),
	}
	c, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, fmt.Errorf("%w: dialing the agent at %s: %w", ErrChannelClosed, address, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	sc, err := psk.Dial(c, key)
	if err != nil {
		return nil, fmt.Errorf("%w: the agent at %s: %w", ErrChannelClosed, address, err)
	}
	cl, err := NewClient(sc)
	if !stop() {
		// ctx ended: the deadline it set may have cut the handshake.
		if cl != nil {
			cl.Close()
		}
		return nil, fmt.Errorf("%w: the agent at %s: %w", ErrChannelClosed, address, ctx.Err())
	}
	if err != nil {
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return cl, nil
}
