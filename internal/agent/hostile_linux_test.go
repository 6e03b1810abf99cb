package agent

import (
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/agent/wire"
)

// An agent is code in the sandbox: whatever frames it sends, unasked,
// the client opens nothing on the host (no socket: no listener, no
// connection) and is never wedged: each frame is ignored or ends the
// channel as a protocol error, and a frame that breaks the protocol
// after it still ends the channel at once. Not parallel: it counts this
// process's sockets.
func TestHostileAgentOpensNothing(t *testing.T) {
	types := []wire.Type{0, 200}
	for ty := wire.Hello; ty <= wire.Resume; ty++ {
		types = append(types, ty)
	}
	// Nothing, noise, and each message well formed.
	payloads := [][]byte{nil, {1, 2, 3}, make([]byte, 64),
		wire.HelloMsg{Version: wire.Version}.Encode(), wire.ExitMsg{}.Encode(), wire.ByeMsg{OK: true}.Encode(),
		wire.CreditMsg{Stream: wire.StreamStdin, N: 1 << 20}.Encode(), wire.StartedMsg{PID: 1}.Encode(),
		wire.DialMsg{Network: "tcp", Address: "127.0.0.1:1"}.Encode(), wire.ListenMsg{Key: make([]byte, 32)}.Encode(),
		wire.ListeningMsg{Port: 1}.Encode(), wire.SignalMsg{Signo: 9}.Encode(), wire.ResizeMsg{Rows: 1, Cols: 1}.Encode(),
		wire.StartMsg{Argv: []string{"/bin/sh"}}.Encode()}
	before := sockets(t)
	for _, ty := range types {
		for _, id := range []uint32{0, 999} {
			for _, payload := range payloads {
				ours, theirs := net.Pipe()
				go func() {
					hello := wire.HelloMsg{Version: wire.Version}
					_ = wire.Write(theirs, wire.Frame{Type: wire.Hello, Payload: hello.Encode()})
					for range 3 {
						if wire.Write(theirs, wire.Frame{Type: ty, ID: id, Payload: payload}) != nil {
							return
						}
					}
					// Whatever came before, this ends the channel.
					_ = wire.Write(theirs, wire.Frame{Type: 200, ID: id})
				}()
				go func() { _, _ = io.Copy(io.Discard, theirs) }()
				c, err := NewClient(ours)
				require.NoError(t, err)
				select {
				case <-c.Dead():
					assert.True(t, errors.Is(c.err, ErrChannelClosed), "type %d id %d: %v", ty, id, c.err)
				case <-time.After(5 * time.Second):
					t.Errorf("type %d id %d payload %d bytes: the client did not end the channel: its reading is wedged", ty, id, len(payload))
				}
				c.Close()
				theirs.Close()
			}
		}
	}
	assert.Equal(t, before, sockets(t), "the process's sockets")
}

// sockets returns this process's sockets: their descriptors' targets.
func sockets(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	var socks []string
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "socket:") {
			socks = append(socks, l)
		}
	}
	return socks
}
