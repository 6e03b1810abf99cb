package vm_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/mock/gomock"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/vmmock"
)

// fakeService makes mock sandboxes for a Pool and keeps the books: which
// exist (created and not removed), how many creates ran at once.
type fakeService struct {
	ctrl *gomock.Controller
	// gate, if set, holds every Create until a value arrives on it.
	gate chan struct{}
	// deaf: a held Create ignores its context (a create that completes
	// although Close cancelled it).
	deaf bool
	// fail returns the error of the n-th Create (from 1); nil: none fail.
	fail func(n int) error

	mu             sync.Mutex
	made, started  int
	inFlight, peak int
	live           map[string]bool
	removes        map[string]int
	cfgs           []vm.Config
}

func newFakeService(t *testing.T) *fakeService {
	return &fakeService{ctrl: gomock.NewController(t), live: map[string]bool{}, removes: map[string]int{}}
}

// newVM is the Pool's constructor.
func (f *fakeService) newVM(_ context.Context, cfg vm.Config) (vm.VM, error) {
	f.mu.Lock()
	f.made++
	id := fmt.Sprintf("box-%d", f.made)
	f.cfgs = append(f.cfgs, cfg)
	f.mu.Unlock()
	m := vmmock.NewMockVM(f.ctrl)
	m.EXPECT().ID().Return(id).AnyTimes()
	m.EXPECT().Create(gomock.Any()).DoAndReturn(func(ctx context.Context) error { return f.create(ctx, id) }).MaxTimes(1)
	m.EXPECT().Run(gomock.Any(), gomock.Any()).Return(&exec.Result{Stdout: id}, nil).AnyTimes()
	m.EXPECT().Remove(gomock.Any()).DoAndReturn(func(context.Context) error {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.live, id)
		f.removes[id]++
		return nil
	}).AnyTimes()
	return m, nil
}

func (f *fakeService) create(ctx context.Context, id string) error {
	f.mu.Lock()
	f.started++
	n := f.started
	f.inFlight++
	f.peak = max(f.peak, f.inFlight)
	f.mu.Unlock()
	defer func() {
		f.mu.Lock()
		f.inFlight--
		f.mu.Unlock()
	}()
	if f.gate != nil {
		done := ctx.Done()
		if f.deaf {
			done = nil
		}
		select {
		case <-f.gate:
		case <-done:
			return ctx.Err()
		}
	}
	if f.fail != nil {
		if err := f.fail(n); err != nil {
			return err
		}
	}
	f.mu.Lock()
	f.live[id] = true
	f.mu.Unlock()
	return nil
}

// snapshot returns the books: sandboxes alive, creates started, creates
// in flight.
func (f *fakeService) snapshot() (live, started, inFlight int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.live), f.started, f.inFlight
}

var poolConfig = vm.Config{Image: "localhost/podvm-test:latest", Labels: map[string]string{"suite": "pool"}}

// newPool makes a pool on f, closed when the test ends.
func newPool(t *testing.T, f *fakeService, opts ...vm.PoolOption) *vm.Pool {
	t.Helper()
	p, err := vm.NewPool(poolConfig, f.newVM, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	return p
}

// eventually waits, generously, until cond holds.
func eventually(t *testing.T, cond func() bool, msg string, args ...any) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, time.Millisecond, append([]any{msg}, args...)...)
}

func readyIs(p *vm.Pool, n int) func() bool {
	return func() bool { return p.Stats().Ready == n }
}

func TestPoolHandsOutFreshSandboxes(t *testing.T) {
	t.Parallel()
	f := newFakeService(t)
	p := newPool(t, f, vm.WithPoolSize(3), vm.WithPoolCreates(2))
	eventually(t, readyIs(p, 3), "the pool fills in the background")

	ctx := context.Background()
	seen := map[string]bool{}
	for range 10 {
		v, err := p.Get(ctx)
		require.NoError(t, err)
		require.False(t, seen[v.ID()], "%s handed out twice", v.ID())
		seen[v.ID()] = true
		res, err := v.Run(ctx, exec.Command{Name: "true"})
		require.NoError(t, err)
		assert.Equal(t, v.ID(), res.Stdout, "Run reaches the sandbox itself")
		require.NoError(t, v.Remove(ctx))
	}
	eventually(t, readyIs(p, 3), "the pool refills")
	s := p.Stats()
	assert.Equal(t, vm.PoolStats{Ready: 3, Created: 13, Handed: 10}, s)

	require.NoError(t, p.Close(ctx))
	live, _, _ := f.snapshot()
	assert.Zero(t, live, "Close removes the ready sandboxes")
	_, err := p.Get(ctx)
	assert.ErrorIs(t, err, vm.ErrPoolClosed)
	assert.NoError(t, p.Close(ctx), "a second Close returns the first one's result")
}

func TestPoolConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		cfg     vm.Config
		wantErr error
		wantID  string // "" : a random one
	}{
		{name: "labels added", cfg: poolConfig},
		{name: "named pool", cfg: vm.Config{Image: "img", Labels: map[string]string{vm.LabelPool: "nightly"}}, wantID: "nightly"},
		{name: "invalid", cfg: vm.Config{Image: "--privileged"}, wantErr: vm.ErrInvalidConfig},
		{name: "a name cannot be shared", cfg: vm.Config{Image: "img", Name: "one"}, wantErr: vm.ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeService(t)
			labels := map[string]string{}
			for k, v := range tt.cfg.Labels {
				labels[k] = v
			}
			p, err := vm.NewPool(tt.cfg, f.newVM, vm.WithPoolSize(1))
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				assert.Nil(t, p)
				_, started, _ := f.snapshot()
				assert.Zero(t, started, "nothing starts")
				return
			}
			require.NoError(t, err)
			defer p.Close(context.Background())
			eventually(t, readyIs(p, 1), "filled")
			if tt.wantID != "" {
				assert.Equal(t, tt.wantID, p.ID())
			} else {
				assert.Len(t, p.ID(), 16, "a random ID")
			}
			f.mu.Lock()
			got := f.cfgs[0]
			f.mu.Unlock()
			assert.Equal(t, p.ID(), got.Labels[vm.LabelPool])
			for k, v := range labels {
				assert.Equal(t, v, got.Labels[k], "the user's label %s is kept", k)
			}
			assert.Equal(t, labels, tt.cfg.Labels, "the caller's map is not changed")
		})
	}
}

// Two pools of one config have distinct IDs, so Reap can tell them apart.
func TestPoolIDsDiffer(t *testing.T) {
	t.Parallel()
	a, b := newPool(t, newFakeService(t), vm.WithPoolSize(0)), newPool(t, newFakeService(t), vm.WithPoolSize(0))
	assert.NotEqual(t, a.ID(), b.ID())
}

func TestPoolBoundsConcurrentCreates(t *testing.T) {
	t.Parallel()
	f := newFakeService(t)
	f.gate = make(chan struct{})
	p := newPool(t, f, vm.WithPoolSize(8), vm.WithPoolCreates(3))
	eventually(t, func() bool { _, _, n := f.snapshot(); return n == 3 }, "three creates start")

	// Waiting Gets add demand, not creates beyond the bound.
	ctx := context.Background()
	got := make(chan vm.VM, 4)
	for range 4 {
		go func() {
			v, err := p.Get(ctx)
			assert.NoError(t, err)
			got <- v
		}()
	}
	eventually(t, func() bool { return p.Stats().Waiting == 4 }, "four Gets wait")
	for range 12 {
		f.gate <- struct{}{}
	}
	for range 4 {
		require.NoError(t, (<-got).Remove(ctx))
	}
	eventually(t, readyIs(p, 8), "filled after the waiters were served")
	f.mu.Lock()
	defer f.mu.Unlock()
	assert.Equal(t, 3, f.peak, "never more than three creates at once")
	assert.Equal(t, 12, f.started)
}

// With nothing ready, a Get starts a create of its own when the bound
// allows, rather than waiting for a refill that serves someone else.
func TestPoolGetCreatesOnDemand(t *testing.T) {
	t.Parallel()
	f := newFakeService(t)
	f.gate = make(chan struct{})
	p := newPool(t, f, vm.WithPoolSize(1), vm.WithPoolCreates(4))
	eventually(t, func() bool { _, n, _ := f.snapshot(); return n == 1 }, "the refill starts")

	got := make(chan vm.VM)
	go func() {
		v, err := p.Get(context.Background())
		assert.NoError(t, err)
		got <- v
	}()
	eventually(t, func() bool { _, n, _ := f.snapshot(); return n == 2 }, "the Get starts a second create")
	f.gate <- struct{}{}
	v := <-got
	assert.NotNil(t, v)
	f.gate <- struct{}{}
	eventually(t, readyIs(p, 1), "the other create refills the pool")
	_, started, _ := f.snapshot()
	assert.Equal(t, 2, started)
}

var errBoom = fmt.Errorf("%w: the service is down", vm.ErrUnavailable)

// A failing create is the waiting caller's error; then the pool backs off.
func TestPoolReportsFailuresAndBacksOff(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("every unserved waiter fails", func(t *testing.T) {
		t.Parallel()
		f := newFakeService(t)
		f.gate = make(chan struct{})
		f.fail = func(int) error { return errBoom }
		p := newPool(t, f, vm.WithPoolSize(0), vm.WithPoolCreates(1), vm.WithPoolBackoff(time.Hour, time.Hour))
		errs := make(chan error, 3)
		for range 3 {
			go func() {
				_, err := p.Get(ctx)
				errs <- err
			}()
		}
		eventually(t, func() bool { return p.Stats().Waiting == 3 }, "three Gets wait on one create")
		f.gate <- struct{}{}
		for range 3 {
			err := <-errs
			require.ErrorIs(t, err, vm.ErrUnavailable)
			assert.Contains(t, err.Error(), "vm: pool: creating a sandbox")
		}
		s := p.Stats()
		assert.Equal(t, int64(1), s.Failed)
		assert.ErrorIs(t, s.LastErr, errBoom)

		// Backing off: a Get now waits for the next try, an hour away.
		short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		_, err := p.Get(short)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		_, started, _ := f.snapshot()
		assert.Equal(t, 1, started, "no create during the backoff")
	})

	t.Run("recovers after failures", func(t *testing.T) {
		t.Parallel()
		f := newFakeService(t)
		f.fail = func(n int) error {
			if n <= 2 {
				return errBoom
			}
			return nil
		}
		p := newPool(t, f, vm.WithPoolSize(0), vm.WithPoolBackoff(time.Millisecond, 2*time.Millisecond))
		for i := range 2 {
			_, err := p.Get(ctx)
			require.ErrorIs(t, err, vm.ErrUnavailable, "Get %d", i+1)
		}
		v, err := p.Get(ctx)
		require.NoError(t, err)
		require.NoError(t, v.Remove(ctx))
		s := p.Stats()
		assert.Equal(t, int64(2), s.Failed)
		assert.Equal(t, int64(1), s.Created)
	})
}

// A cancelled Get leaves the sandbox it was waiting for to the pool.
func TestPoolCancelledGet(t *testing.T) {
	t.Parallel()
	f := newFakeService(t)
	f.gate = make(chan struct{})
	p := newPool(t, f, vm.WithPoolSize(0))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() {
		_, err := p.Get(ctx)
		errc <- err
	}()
	eventually(t, func() bool { _, _, n := f.snapshot(); return n == 1 }, "the Get's create starts")
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	f.gate <- struct{}{}
	eventually(t, readyIs(p, 1), "the sandbox goes to the pool, unused")
	assert.Zero(t, p.Stats().InUse)

	require.NoError(t, p.Close(context.Background()))
	live, _, _ := f.snapshot()
	assert.Zero(t, live)
}

// Close removes everything: ready, being created, handed out and never
// given back.
func TestPoolCloseRemovesEverything(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFakeService(t)
	f.gate = make(chan struct{})
	f.deaf = true // the creates finish although Close cancels them
	p := newPool(t, f, vm.WithPoolSize(2), vm.WithPoolCreates(2))
	f.gate <- struct{}{}
	f.gate <- struct{}{}
	eventually(t, readyIs(p, 2), "filled")
	kept, err := p.Get(ctx) // never given back
	require.NoError(t, err)
	eventually(t, func() bool { _, _, n := f.snapshot(); return n == 1 }, "a refill is in flight")
	waiting := make(chan error)
	go func() {
		p.Get(ctx) // takes the ready one
		_, err := p.Get(ctx)
		waiting <- err
	}()
	eventually(t, func() bool { s := p.Stats(); return s.Waiting == 1 && s.Creating == 2 }, "a Get waits on two creates")

	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, p.Close(short), context.DeadlineExceeded, "Close waits for the create in flight")
	assert.ErrorIs(t, <-waiting, vm.ErrPoolClosed, "a waiting Get is told")
	f.gate <- struct{}{} // the creates complete after Close
	f.gate <- struct{}{}
	require.NoError(t, p.Close(ctx))

	f.mu.Lock()
	assert.Empty(t, f.live, "nothing is left")
	assert.Equal(t, 1, f.removes[kept.ID()], "the sandbox never given back is removed")
	f.mu.Unlock()
	assert.NoError(t, kept.Remove(ctx), "its caller may still remove it")
}

// A sandbox whose Remove failed stays the pool's to remove at Close.
func TestPoolRemoveFailureKeepsTracking(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ctrl := gomock.NewController(t)
	m := vmmock.NewMockVM(ctrl)
	m.EXPECT().Create(gomock.Any()).Return(nil)
	m.EXPECT().ID().Return("box").AnyTimes()
	gomock.InOrder(
		m.EXPECT().Remove(gomock.Any()).Return(errBoom),
		m.EXPECT().Remove(gomock.Any()).Return(nil),
	)
	p, err := vm.NewPool(poolConfig, func(context.Context, vm.Config) (vm.VM, error) { return m, nil }, vm.WithPoolSize(0), vm.WithPoolCreates(1))
	require.NoError(t, err)
	v, err := p.Get(ctx)
	require.NoError(t, err)
	require.ErrorIs(t, v.Remove(ctx), errBoom)
	assert.Equal(t, 1, p.Stats().InUse)
	require.NoError(t, p.Close(ctx), "Close removes it")
	assert.Zero(t, p.Stats().InUse, "what Close removed is not in use")
}

// Stats after Close counts what is still alive: a sandbox handed out and
// removed by Close is not in use, one whose removal failed still is.
func TestPoolStatsAfterClose(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ctrl := gomock.NewController(t)
	gone, stuck := vmmock.NewMockVM(ctrl), vmmock.NewMockVM(ctrl)
	for _, m := range []*vmmock.MockVM{gone, stuck} {
		m.EXPECT().Create(gomock.Any()).Return(nil)
		m.EXPECT().ID().Return("box").AnyTimes()
	}
	gone.EXPECT().Remove(gomock.Any()).Return(nil)
	stuck.EXPECT().Remove(gomock.Any()).Return(errBoom)
	boxes := make(chan vm.VM, 2)
	boxes <- gone
	boxes <- stuck
	p, err := vm.NewPool(poolConfig, func(context.Context, vm.Config) (vm.VM, error) { return <-boxes, nil }, vm.WithPoolSize(0), vm.WithPoolCreates(1))
	require.NoError(t, err)
	for range 2 {
		_, err := p.Get(ctx)
		require.NoError(t, err)
	}
	require.Equal(t, 2, p.Stats().InUse)
	require.ErrorIs(t, p.Close(ctx), errBoom)
	s := p.Stats()
	assert.Equal(t, 1, s.InUse, "the one Close could not remove")
	assert.Equal(t, int64(2), s.Handed)
}

// A constructor that fails, or returns nothing, is a failed create.
func TestPoolConstructorErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		newVM func(context.Context, vm.Config) (vm.VM, error)
		want  error
	}{
		{"error", func(context.Context, vm.Config) (vm.VM, error) { return nil, errBoom }, vm.ErrUnavailable},
		{"nil VM", func(context.Context, vm.Config) (vm.VM, error) { return nil, nil }, vm.ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := vm.NewPool(poolConfig, tt.newVM, vm.WithPoolSize(0))
			require.NoError(t, err)
			defer p.Close(context.Background())
			_, err = p.Get(context.Background())
			require.ErrorIs(t, err, tt.want)
		})
	}
}

// Many callers at once: each sandbox goes to exactly one of them.
func TestPoolConcurrentGets(t *testing.T) {
	t.Parallel()
	f := newFakeService(t)
	p := newPool(t, f, vm.WithPoolSize(2), vm.WithPoolCreates(2))
	ctx := context.Background()
	var (
		mu   sync.Mutex
		seen = map[string]int{}
		wg   sync.WaitGroup
	)
	for range 8 {
		wg.Go(func() {
			for range 10 {
				v, err := p.Get(ctx)
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				seen[v.ID()]++
				mu.Unlock()
				assert.NoError(t, v.Remove(ctx))
			}
		})
	}
	wg.Wait()
	require.Len(t, seen, 80, "80 Gets, 80 distinct sandboxes")
	require.NoError(t, p.Close(ctx))
	live, _, _ := f.snapshot()
	assert.Zero(t, live)
	assert.Zero(t, p.Stats().InUse)
	assert.False(t, errors.Is(p.Stats().LastErr, errBoom))
}

// Compile many seeds, each in a fresh sandbox, without waiting for
// Podman to create each one.
func ExampleNewPool() {
	ctx := context.Background()
	pool, err := vm.NewPool(vm.Config{Image: "localhost/podvm-test:latest"}, nil, vm.WithPoolSize(4))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close(context.Background())
	for _, seed := range []string{"seed-1", "seed-2"} {
		box, err := pool.Get(ctx) // ready at once when the pool is warm
		if err != nil {
			fmt.Println(err) // a failed create: errors.Is(err, vm.ErrUnavailable), ...
			return
		}
		res, err := box.Run(ctx, exec.Command{Name: "make", Args: []string{seed}, Timeout: time.Minute})
		box.Remove(ctx) // give it back: removed; the pool refills
		fmt.Println(res, err)
	}
}
