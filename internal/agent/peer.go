package agent

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/podvm/podvm/internal/agent/psk"
)

// DialPeer connects to the port an agent listens on after
// [Client.Listen] with key, at address (host:port), and returns a client
// over that channel, a session of its own beside the first: its runs
// die with it, and the agent lives on. ctx bounds the connection and
// both handshakes (psk's, then the agent's Hello).
func DialPeer(ctx context.Context, address string, key []byte) (*Client, error) {
	var d net.Dialer
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
