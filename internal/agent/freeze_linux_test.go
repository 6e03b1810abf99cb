package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/agent/wire"
)

// While frozen the agent sends nothing: a run that ends in the sandbox
// meanwhile reports its exit only after Thaw, with its output whole.
func TestFreezeHoldsFramesUntilThaw(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := context.Background()
	ended := make(chan result, 1)
	go func() { ended <- a.sh(ctx, "sleep 0.3; echo done") }()
	time.Sleep(100 * time.Millisecond) // the Run has started
	require.NoError(t, a.Freeze(ctx))
	select {
	case r := <-ended:
		t.Fatalf("the run's end came through a frozen channel: %+v", r)
	case <-time.After(1500 * time.Millisecond): // its command has ended
	}
	require.NoError(t, a.Thaw())
	select {
	case r := <-ended:
		require.NoError(t, r.err)
		assert.Equal(t, 0, r.Code)
		assert.Equal(t, "done\n", r.stdout)
	case <-time.After(10 * time.Second):
		t.Fatal("the run did not end after Thaw")
	}
	assert.Equal(t, "hi\n", a.sh(ctx, "echo hi").stdout, "a run after Thaw")
}

// Freezes in the middle of a stream many windows long, both ways (the
// run's stdin echoed back), lose and repeat nothing.
func TestFreezeMidStreamLosesNothing(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := context.Background()
	in := make([]byte, 16<<20)
	_, _ = rand.Read(in)
	ended := make(chan result, 1)
	go func() { ended <- a.run(ctx, Request{Argv: []string{"cat"}}, bytes.NewReader(in)) }()
	deadline := time.After(time.Minute)
	for freezes := 0; ; freezes++ {
		select {
		case r := <-ended:
			require.NoError(t, r.err)
			assert.Equal(t, 0, r.Code)
			assert.True(t, r.stdout == string(in), "stdout is stdin: %d bytes of %d", len(r.stdout), len(in))
			assert.Positive(t, freezes, "frozen while it streamed")
			return
		case <-deadline:
			t.Fatalf("the stream did not end, after %d freezes", freezes)
		default:
		}
		require.NoError(t, a.Freeze(ctx), "freeze %d", freezes)
		time.Sleep(5 * time.Millisecond)
		require.NoError(t, a.Thaw(), "thaw %d", freezes)
		time.Sleep(5 * time.Millisecond)
	}
}

// Freeze and Thaw in the wrong order are errors, and change nothing.
func TestFreezeMisuse(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := context.Background()
	assert.Error(t, a.Thaw(), "Thaw without Freeze")
	require.NoError(t, a.Freeze(ctx))
	assert.Error(t, a.Freeze(ctx), "Freeze twice")
	require.NoError(t, a.Thaw())
	assert.Equal(t, "hi\n", a.sh(ctx, "echo hi").stdout)
}

// A frozen agent takes nothing but Thaw: another frame ends the channel,
// and a channel that ends while frozen ends its runs (the harness checks
// that the agent exits).
func TestFrozenAgentRefusesFrames(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := context.Background()
	ended := make(chan result, 1)
	go func() { ended <- a.sh(ctx, "sleep 100") }()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, a.Freeze(ctx))
	require.NoError(t, a.write(wire.Frame{Type: wire.Kill, ID: 1}), "a frame the client would have held back")
	select {
	case <-a.Dead():
	case <-time.After(10 * time.Second):
		t.Fatal("the agent went on")
	}
	r := <-ended
	assert.True(t, errors.Is(r.err, ErrChannelClosed), "%v", r.err)
}

// A Freeze whose ctx ends before the agent answers leaves it thawed.
func TestFreezeCancelled(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, a.Freeze(ctx), context.Canceled)
	assert.Equal(t, "hi\n", a.sh(context.Background(), "echo hi").stdout, "thawed once the agent answered")
	require.NoError(t, a.Freeze(context.Background()))
	require.NoError(t, a.Thaw())
}
