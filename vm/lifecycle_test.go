package vm

import (
	"context"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/agent/wire"
)

func TestToTheEnd(t *testing.T) {
	t.Run("ends first", func(t *testing.T) {
		v, err := finishDespiteCancel(context.Background(), "x", func(context.Context) (string, error) { return "id", errors.New("boom") })
		assert.Equal(t, "id", v)
		assert.EqualError(t, err, "boom")
	})
	t.Run("ctx ends first", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		release := make(chan struct{})
		var fctxErr error
		go func() {
			time.Sleep(20 * time.Millisecond)
			cancel()
			time.Sleep(50 * time.Millisecond) // finishDespiteCancel still waits
			close(release)
		}()
		v, err := finishDespiteCancel(ctx, "create from img", func(fctx context.Context) (string, error) {
			<-release
			fctxErr = fctx.Err()
			return "made", nil
		})
		assert.Equal(t, "made", v, "what f made, to remove")
		assert.NoError(t, fctxErr, "f's context outlives ctx")
		assert.ErrorIs(t, err, context.Canceled)
		assert.EqualError(t, err, "vm: create from img: context canceled")
	})
	t.Run("f's goroutine exits", func(t *testing.T) {
		_, err := finishDespiteCancel(context.Background(), "start", func(context.Context) (int, error) {
			runtime.Goexit()
			return 0, nil
		})
		assert.EqualError(t, err, "vm: start: the call did not return")
	})
}

// A Create whose ctx ends while it waits for the agent's hello closes the
// channel only once the hello is in: closing it sooner could cut the
// podman client behind it between the runtime's create and start.
func TestHandshakeWaitsForTheHelloAfterCtx(t *testing.T) {
	channel, agentSide := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() {
		_, err := (&sandbox{}).handshake(ctx, channel)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // the handshake has seen ctx end
	hello := wire.Frame{Type: wire.Hello, Payload: wire.HelloMsg{Version: wire.Version}.Encode()}
	require.NoError(t, wire.Write(agentSide, hello), "the channel was closed before the hello")
	err := <-done
	assert.ErrorIs(t, err, context.Canceled)
	_, err = agentSide.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "closed after the hello")
}
