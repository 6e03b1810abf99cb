package vmtest

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/podvm/podvm/vm"
)

// Pool gives the tests of a suite warm sandboxes: like [Sandbox], but
// taken from a [vm.Pool] that creates them ahead of time, so a suite with
// many sandboxes does not wait for Podman to create each. One Pool serves
// every test of a package; close it when the tests are done:
//
//	var pool = vmtest.NewPool(vm.Config{Image: "localhost/podvm-test:latest"}, nil)
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		pool.Close()
//		os.Exit(code)
//	}
//
//	func TestBuild(t *testing.T) {
//		t.Parallel()
//		box := pool.Sandbox(t)
//		...
//	}
//
// The pool starts with the first Sandbox, so a package whose tests are
// all skipped or filtered out creates nothing. A process killed before
// Close leaves its ready sandboxes to [vm.Reap].
type Pool struct {
	cfg   vm.Config
	newVM func(ctx context.Context, cfg vm.Config) (vm.VM, error)
	opts  []vm.PoolOption

	mu          sync.Mutex
	pool        *vm.Pool
	unavailable error // set once Podman proved unusable: later tests skip at once
}

// NewPool returns a Pool of sandboxes of cfg, made by newVM (nil: [vm.New]
// with no options) with the pool options opts, as [vm.NewPool] takes them.
// Nothing is created before the first Sandbox.
func NewPool(cfg vm.Config, newVM func(ctx context.Context, cfg vm.Config) (vm.VM, error), opts ...vm.PoolOption) *Pool {
	return &Pool{cfg: cfg, newVM: newVM, opts: opts}
}

// Sandbox returns a fresh, created sandbox from the pool, removed in
// t.Cleanup, also when the test fails or panics. When no Podman is usable
// it skips t, or fails t when $PODVM_REQUIRE_PODMAN is set; any other
// error fails t.
func (p *Pool) Sandbox(t testing.TB) vm.VM {
	t.Helper()
	pool, err := p.start()
	if err != nil {
		t.Fatalf("vmtest: pool: %v", err)
	}
	if err := p.unusable(); err != nil {
		skipUnavailable(t, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := pool.Get(ctx)
	if err != nil {
		if errors.Is(err, vm.ErrUnavailable) {
			p.mu.Lock()
			p.unavailable = err
			p.mu.Unlock()
			skipUnavailable(t, err)
		}
		t.Fatalf("vmtest: pool sandbox: %v", err)
	}
	t.Cleanup(func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := v.Remove(rctx); err != nil {
			t.Errorf("vmtest: removing the sandbox: %v", err)
		}
	})
	return v
}

// Close removes every sandbox the pool holds and waits for it (a minute
// at most). It is a no-op when no Sandbox was taken.
func (p *Pool) Close() error {
	p.mu.Lock()
	pool := p.pool
	p.mu.Unlock()
	if pool == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return pool.Close(ctx)
}

// start makes the vm.Pool on first use.
func (p *Pool) start() (*vm.Pool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pool == nil {
		pool, err := vm.NewPool(p.cfg, p.newVM, p.opts...)
		if err != nil {
			return nil, err
		}
		p.pool = pool
	}
	return p.pool, nil
}

func (p *Pool) unusable() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unavailable
}

// skipUnavailable skips t for want of Podman, or fails it when Podman is
// required.
func skipUnavailable(t testing.TB, err error) {
	t.Helper()
	if os.Getenv(RequireEnv) != "" {
		t.Fatalf("vmtest: Podman is required ($%s) but unavailable: %v", RequireEnv, err)
	}
	t.Skipf("vmtest: no Podman (set %s to fail instead): %v", RequireEnv, err)
}
