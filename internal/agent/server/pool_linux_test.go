package server

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// idleShim is a shim handle whose process is the test: the returned
// conn reads EOF once the pool closed the shim's socket.
func idleShim(t *testing.T, idle time.Time) (*shim, net.Conn) {
	t.Helper()
	ours, theirs := unixPair(t)
	return &shim{conn: ours, idle: idle}, theirs
}

func closed(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	_, err := c.Read(make([]byte, 1))
	return err == io.EOF
}

func TestPoolTrimEndsShimsIdleTooLong(t *testing.T) {
	t.Parallel()
	now := time.Now()
	tests := []struct {
		name     string
		idle     []time.Duration // how long each has been idle, bottom of the stack first
		wantKept int             // from the top
	}{
		{name: "old ones go, down to the spares", idle: []time.Duration{time.Hour, time.Hour, time.Second}, wantKept: 1},
		{name: "the spares stay however old", idle: []time.Duration{time.Hour}, wantKept: 1},
		{name: "recent ones stay", idle: []time.Duration{time.Second, time.Second, time.Second}, wantKept: 3},
		{name: "a recent one shields those above it", idle: []time.Duration{time.Hour, time.Second, time.Hour}, wantKept: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := &pool{live: map[int]*shim{}}
			peers := make([]net.Conn, len(tt.idle))
			for i, d := range tt.idle {
				var s *shim
				s, peers[i] = idleShim(t, now.Add(-d))
				p.idle = append(p.idle, s)
			}
			p.trim(now.Add(-idleLife))
			require.Len(t, p.idle, tt.wantKept)
			gone := len(tt.idle) - tt.wantKept
			for i, c := range peers {
				assert.Equal(t, i < gone, closed(c), "shim %d", i)
			}
		})
	}
}
