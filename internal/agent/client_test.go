package agent

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/agent/wire"
)

// fakeAgent speaks the agent's side of the protocol over a net.Pipe:
// every run writes out, then exits 0, within the credit the client
// grants. It counts the Credit frames it gets.
type fakeAgent struct {
	conn    net.Conn
	out     []byte
	credits atomic.Int64
	done    chan struct{} // closed when the channel ended
}

func newFakeAgent(t *testing.T, out []byte) (*Client, *fakeAgent) {
	t.Helper()
	ours, theirs := net.Pipe()
	f := &fakeAgent{conn: theirs, out: out, done: make(chan struct{})}
	go f.serve()
	c, err := NewClient(ours)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(); theirs.Close() })
	return c, f
}

func (f *fakeAgent) serve() {
	hello := wire.HelloMsg{Version: wire.Version}
	if wire.Write(f.conn, wire.Frame{Type: wire.Hello, Payload: hello.Encode()}) != nil {
		return
	}
	frames := make(chan wire.Frame, 64)
	go func() {
		defer close(f.done)
		defer close(frames)
		for {
			fr, err := wire.Read(f.conn)
			if err != nil {
				return
			}
			if fr.Type == wire.Credit {
				f.credits.Add(1)
			}
			frames <- fr
		}
	}()
	for fr := range frames {
		if fr.Type != wire.Start {
			continue
		}
		window := int64(wire.Window)
		for p := f.out; len(p) > 0; {
			for window <= 0 { // wait for credit, as the agent does
				c, ok := <-frames
				if !ok {
					return
				}
				if m, err := wire.DecodeCredit(c.Payload); c.Type == wire.Credit && err == nil {
					window += int64(m.N)
				}
			}
			n := min(len(p), wire.ChunkSize, int(window))
			if wire.Write(f.conn, wire.Frame{Type: wire.Stdout, ID: fr.ID, Payload: p[:n]}) != nil {
				return
			}
			p, window = p[n:], window-int64(n)
		}
		if wire.Write(f.conn, wire.Frame{Type: wire.Exit, ID: fr.ID, Payload: wire.ExitMsg{}.Encode()}) != nil {
			return
		}
	}
}

func TestClientGrantsCreditInBatches(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		size        int
		wantCredits int // at most, per run
	}{
		{name: "a short output costs no credit", size: 3, wantCredits: 0},
		{name: "a window, one per batch", size: wire.Window, wantCredits: wire.Window / wire.CreditBatch},
		{name: "a long one, one per batch", size: 16 * wire.Window, wantCredits: 16 * wire.Window / wire.CreditBatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out := bytes.Repeat([]byte("0123456789abcdef"), tt.size/16+1)[:tt.size]
			c, f := newFakeAgent(t, out)
			const runs = 3 // pooled buffers are reused across runs
			for range runs {
				var got bytes.Buffer
				ex, err := c.Run(context.Background(), Request{Argv: []string{"x"}}, nil, &got, io.Discard)
				require.NoError(t, err)
				require.Equal(t, 0, ex.Code)
				require.True(t, bytes.Equal(out, got.Bytes()), "output differs")
			}
			c.Close()
			<-f.done
			assert.LessOrEqual(t, f.credits.Load(), int64(runs*tt.wantCredits))
		})
	}
}
