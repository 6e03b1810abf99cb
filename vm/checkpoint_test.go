package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/driver"
)

// localDriver is a driver whose Local alone answers; what a test calls
// beyond it panics on the nil Driver.
type localDriver struct {
	driver.Driver
	service string
}

func (d localDriver) Local() (bool, string) { return true, d.service }

// refusing is a Checkpointer whose engine answers each CheckpointRefusal
// with the next of its answers; it never gets to a probe.
type refusing struct {
	localDriver
	answers []error
	calls   int
}

func (r *refusing) CheckpointRefusal(context.Context) error {
	r.calls++
	return r.answers[r.calls-1]
}
func (r *refusing) Suspend(context.Context, string) error { panic("no probe") }
func (r *refusing) Resume(context.Context, string) error  { panic("no probe") }
func (r *refusing) AttachRunning(context.Context, string) (io.ReadWriteCloser, error) {
	panic("no probe")
}
func (r *refusing) Export(context.Context, string, string, bool) error { panic("no probe") }
func (r *refusing) Import(context.Context, string) (string, error)     { panic("no probe") }

var _ driver.Checkpointer = (*refusing)(nil) // else the tests find no Checkpointer, and test nothing

func TestCheckpointSupportRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("not a Checkpointer", func(t *testing.T) {
		t.Parallel()
		v := &APIVM{}
		v.d = localDriver{service: "engine://nowhere"}
		v.prepare(Config{Image: "x"})
		err := CheckpointSupport(ctx, v)
		require.ErrorIs(t, err, ErrNotSupported)
		assert.ErrorContains(t, err, "engine://nowhere cannot checkpoint")
	})

	t.Run("an answer is kept, a failure to get one is not", func(t *testing.T) {
		t.Parallel()
		unreachable := fmt.Errorf("info: %w", ErrUnavailable)
		failed := fmt.Errorf("info: %w", ErrPodman)
		rootless := fmt.Errorf("%w: rootless", ErrNotSupported)
		d := &refusing{localDriver: localDriver{service: t.Name() + "/" + randomHex()}, answers: []error{unreachable, failed, rootless}}
		v := &APIVM{}
		v.d = d
		v.prepare(Config{Image: "x"})
		require.ErrorIs(t, CheckpointSupport(ctx, v), ErrUnavailable)
		require.ErrorIs(t, CheckpointSupport(ctx, v), ErrPodman, "asked again")
		require.ErrorIs(t, CheckpointSupport(ctx, v), ErrNotSupported, "asked again")
		require.ErrorIs(t, CheckpointSupport(ctx, v), ErrNotSupported, "kept")
		assert.Equal(t, 3, d.calls)
	})

	t.Run("a VM that is no sandbox", func(t *testing.T) {
		t.Parallel()
		err := CheckpointSupport(ctx, struct{ VM }{})
		require.ErrorIs(t, err, ErrNotSupported)
	})
}

// A sandbox whose agent talks over a unix socket of the caller's is
// refused, naming Config.Checkpointable, once the engine has said it
// can: the engine's refusal comes first, for Checkpointable would not
// lift it.
func TestCheckpointableRefusal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, engine := range map[string]error{"engine can": nil, "engine cannot": fmt.Errorf("%w: no CRIU", ErrNotSupported)} {
		d := &refusing{localDriver: localDriver{service: "unix:///checkpointable/" + name}} // its answer kept: no call
		var s sandbox
		s.prepare(Config{Image: "img"})
		s.d = d
		checkpointProbes.Store(checkpointKey{fmt.Sprintf("%T", d), d.service, "img", s.cfg.Network, false}, engine)
		err := CheckpointSupport(ctx, &s) // not created: on a local service, it would talk over a socket
		require.ErrorIs(t, err, ErrNotSupported, name)
		if engine == nil {
			assert.ErrorContains(t, err, "Config.Checkpointable")
			s.cfg.Checkpointable = true
			require.NoError(t, CheckpointSupport(ctx, &s), "with it, it can")
			s.cfg.Checkpointable = false
		}
		s.created, s.chanDir = true, "/run/podvm/ch"
		err = s.checkpointable(ctx, s.chanDir != "")
		require.ErrorIs(t, err, ErrNotSupported, name)
		if engine == nil {
			assert.ErrorContains(t, err, "Config.Checkpointable")
		} else {
			assert.ErrorContains(t, err, "no CRIU")
		}
	}
}

// stopper is a Checkpointer whose Suspend answers err after delay, and
// whose List says the container is in state (an error when "").
type stopper struct {
	localDriver
	delay time.Duration
	err   error
	state string
}

func (d *stopper) CheckpointRefusal(context.Context) error { return nil }
func (d *stopper) Suspend(context.Context, string) error {
	time.Sleep(d.delay)
	return d.err
}
func (d *stopper) Resume(context.Context, string) error { panic("not here") }
func (d *stopper) AttachRunning(context.Context, string) (io.ReadWriteCloser, error) {
	panic("not here")
}
func (d *stopper) Export(context.Context, string, string, bool) error { panic("not here") }
func (d *stopper) Import(context.Context, string) (string, error)     { panic("not here") }
func (d *stopper) List(context.Context, string) ([]driver.Container, error) {
	if d.state == "" {
		return nil, fmt.Errorf("%w: no list", ErrUnavailable)
	}
	return []driver.Container{{ID: "c1", State: d.state}}, nil
}

var _ driver.Checkpointer = (*stopper)(nil)

// Where a dump that stops the sandbox leaves it, as the engine says: a
// failed dump that stopped it anyway leaves it suspended, one that
// succeeded after ctx ended is done, one whose outcome nothing can tell
// (no agent, no list) leaves it suspended for Remove.
func TestSuspendAfterDump(t *testing.T) {
	t.Parallel()
	failed := fmt.Errorf("%w: the export broke off", ErrPodman)
	for _, c := range []struct {
		name          string
		d             *stopper
		ctx           time.Duration // 0: none
		wantErr       bool
		wantSuspended bool
		errIs         error
	}{
		{"failed, stopped", &stopper{err: failed, state: "exited"}, 0, true, true, ErrSuspended},
		{"failed, running", &stopper{err: failed, state: "running"}, 0, true, false, ErrPodman},
		{"failed, unknown", &stopper{err: failed}, 0, true, true, ErrPodman},
		{"done after ctx ended", &stopper{delay: 200 * time.Millisecond, state: "exited"}, 20 * time.Millisecond, false, true, nil},
		{"failed after ctx ended, stopped", &stopper{delay: 200 * time.Millisecond, err: failed, state: "exited"}, 20 * time.Millisecond, true, true, ErrSuspended},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.d.service = "unix:///stopper/" + c.name
			var s sandbox
			s.prepare(Config{Image: "img", PodmanExec: true})
			s.d = c.d
			s.created = true
			s.st.Store(&state{id: "c1"})
			checkpointProbes.Store(checkpointKey{fmt.Sprintf("%T", c.d), c.d.service, "img", s.cfg.Network, true}, nil)
			ctx := context.Background()
			if c.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, c.ctx)
				defer cancel()
			}
			err := Suspend(ctx, &s)
			t.Logf("Suspend: %v", err)
			if c.wantErr {
				require.Error(t, err)
				require.ErrorIs(t, err, c.errIs)
				if c.ctx > 0 {
					assert.ErrorContains(t, err, "the export broke off", "the dump's own words, beside ctx's")
				}
			} else {
				require.NoError(t, err)
			}
			assert.Equal(t, c.wantSuspended, s.state().suspended)
			_, err = s.container()
			assert.Equal(t, c.wantSuspended, errors.Is(err, ErrSuspended))
		})
	}
}
