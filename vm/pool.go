package vm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// LabelPool names the [Pool] a sandbox was made for: every sandbox of a
// pool carries LabelPool=[Pool.ID], so that
// Reap(ctx, 0, WithLabel(LabelPool, id)) removes exactly what a killed
// process's pool left behind.
const LabelPool = "io.podvm.pool"

// Pool defaults, used when the option is not given.
const (
	DefaultPoolSize       = 4                      // sandboxes kept ready
	DefaultPoolCreates    = 2                      // creates in flight at most
	DefaultPoolBackoffMin = 100 * time.Millisecond // wait after a failed create
	DefaultPoolBackoffMax = 5 * time.Second        // ... doubling up to this
)

// ErrPoolClosed: [Pool.Get] was called after [Pool.Close].
var ErrPoolClosed = errors.New("vm: pool closed")

// PoolOption configures [NewPool] and [NewRestorePool].
type PoolOption func(*poolOptions)

type poolOptions struct {
	size, creates          int
	backoffMin, backoffMax time.Duration
}

// WithPoolSize sets how many created, never used sandboxes the pool keeps
// ready (default [DefaultPoolSize]). Zero keeps none: every Get creates
// one, still within the create bound. Negative values count as zero.
func WithPoolSize(n int) PoolOption { return func(o *poolOptions) { o.size = max(n, 0) } }

// WithPoolCreates bounds how many sandboxes the pool creates at once,
// refills and Gets together (default [DefaultPoolCreates]; at least 1).
// Podman serialises much of a create, so more mostly adds contention.
func WithPoolCreates(n int) PoolOption { return func(o *poolOptions) { o.creates = max(n, 1) } }

// WithPoolBackoff sets how long the pool waits before creating again after
// a failed create: min after the first failure, doubling with each
// consecutive failure up to max, back to none after a success (defaults
// [DefaultPoolBackoffMin], [DefaultPoolBackoffMax]).
func WithPoolBackoff(minWait, maxWait time.Duration) PoolOption {
	return func(o *poolOptions) { o.backoffMin, o.backoffMax = max(minWait, 0), max(minWait, maxWait) }
}

// Pool hands out fresh sandboxes of one [Config] without the wait for
// Podman to create and start them: it creates up to its size ahead of
// time, in the background, and refills as they are taken. A pool of
// [NewRestorePool] does the same with copies of one [Checkpoint].
//
// A sandbox from [Pool.Get] is fresh: created for this Get, never handed
// out before and never handed out again. Give it back by removing it with
// its own [VM.Remove], as any sandbox (throw-away stays the rule): there
// is no reuse, so there is no Put. Until then the pool tracks it, and
// [Pool.Close] removes it if its caller has not.
//
// Nothing is left behind: [Pool.Close] removes every sandbox the pool
// made, and a process killed with a full pool leaves sandboxes that carry
// its pid, which [Reap] removes (narrowed to one pool with [LabelPool]).
//
// A Pool is safe for concurrent use. Its zero value is not usable: make
// one with [NewPool] or [NewRestorePool].
type Pool struct {
	newSandbox func(ctx context.Context) (VM, error) // one sandbox, created
	o          poolOptions
	id         string

	ctx    context.Context // of the creates; Close cancels it
	cancel context.CancelFunc
	wg     sync.WaitGroup // the create goroutines
	done   chan struct{}  // closed when Close has finished

	mu       sync.Mutex
	ready    []VM               // created, never handed out; oldest first
	out      map[*pooledVM]bool // handed out, not removed yet
	waiters  []chan getResult   // Gets waiting for a sandbox; oldest first
	creating int                // creates in flight
	backoff  time.Duration      // after the last failure; 0 after a success
	retryAt  time.Time          // no create starts before
	timer    *time.Timer        // calls fill at retryAt
	closed   bool               //
	closeErr error              // what the first Close returned
	stats    PoolStats          // the counters; the gauges are computed
}

type getResult struct {
	v   VM
	err error
}

// PoolStats is a snapshot of a [Pool], for tests, benchmarks and metrics.
type PoolStats struct {
	Ready    int // created sandboxes waiting to be handed out
	Creating int // creates in flight
	InUse    int // handed out and not removed yet, by its caller or by Close
	Waiting  int // Gets waiting for a sandbox

	Created int64 // creates that succeeded, since NewPool
	Failed  int64 // creates that failed (not counting those Close cut short)
	Handed  int64 // sandboxes handed out by Get
	// LastErr is the error of the last failed create, nil if none failed.
	LastErr error
}

// NewPool returns a pool of sandboxes of cfg and starts filling it in the
// background. newVM makes each sandbox, uncreated, from cfg: vm.New with
// options of your choice, [NewAPIVM], [NewCLIVM], or a backend of your
// own; if nil, it is [New] with no options. cfg gets the label
// [LabelPool], whose value is cfg.Labels[LabelPool] when set (a name
// stable across runs) or else a random ID; see [Pool.ID].
//
// cfg is checked first: an invalid one, or one with a Name (the pool's
// sandboxes cannot share it), fails with [ErrInvalidConfig] and nothing
// starts. Call [Pool.Close] when done.
func NewPool(cfg Config, newVM func(ctx context.Context, cfg Config) (VM, error), opts ...PoolOption) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Name != "" {
		return nil, fmt.Errorf("%w: a pool's sandboxes cannot share the name %q", ErrInvalidConfig, cfg.Name)
	}
	if newVM == nil {
		newVM = func(ctx context.Context, cfg Config) (VM, error) { return New(ctx, cfg) }
	}
	var id string
	cfg.Labels, id = poolLabels(cfg.Labels)
	return newPool(id, func(ctx context.Context) (VM, error) {
		v, err := newVM(ctx, cfg)
		if err == nil && v == nil {
			err = fmt.Errorf("%w: the pool's newVM returned no VM and no error", ErrInvalidConfig)
		}
		if err != nil {
			return nil, err
		}
		if err := v.Create(ctx); err != nil {
			_ = removeDetached(v) // Create removed what it made; this frees the rest
			return nil, err
		}
		return v, nil
	}, opts), nil
}

// NewRestorePool returns a pool of copies of cp, each made by restore
// ahead of [Pool.Get] and handed out once, as [NewPool]'s sandboxes are:
// a Get finds a copy whose processes (a warm interpreter, a loaded
// server) are there already, without waiting for the engine's restore.
// restore makes each copy: [Restore] with options of your choice; if nil,
// it is Restore with no options. ro gets the label [LabelPool] as
// NewPool's cfg does.
//
// A copy's processes go on from the checkpoint's instant when it is
// restored, not when it is handed out: while it waits in the pool they
// run (one waiting for input, as a warm server does, waits there) and
// its clocks move on. Everything else [Restore] says of a copy holds.
//
// cp and ro are checked first, as Restore checks them before it reads
// cp's files, and nothing starts when they fail: a cp that
// [TakeCheckpoint], [OpenCheckpoint] or [ListCheckpoints] did not return
// fails with [ErrInvalidCheckpoint], one that holds another podvm's
// agent with [ErrNotSupported], a ro with a Name or labels a Config
// refuses with [ErrInvalidConfig]. A restore that fails (the checkpoint removed, the
// service unable to restore) fails the Gets as a failed create does.
// Call [Pool.Close] when done.
func NewRestorePool(cp *Checkpoint, ro RestoreOptions, restore func(ctx context.Context, cp *Checkpoint, ro RestoreOptions) (VM, error), opts ...PoolOption) (*Pool, error) {
	if ro.Name != "" {
		return nil, fmt.Errorf("%w: a pool's sandboxes cannot share the name %q", ErrInvalidConfig, ro.Name)
	}
	if _, err := cp.copyConfig(ro); err != nil {
		return nil, err
	}
	if restore == nil {
		restore = func(ctx context.Context, cp *Checkpoint, ro RestoreOptions) (VM, error) { return Restore(ctx, cp, ro) }
	}
	var id string
	ro.Labels, id = poolLabels(ro.Labels)
	return newPool(id, func(ctx context.Context) (VM, error) {
		v, err := restore(ctx, cp, ro)
		switch {
		case err != nil && v != nil:
			_ = removeDetached(v) // a restore of the caller's may return both
			return nil, err
		case err == nil && v == nil:
			err = fmt.Errorf("%w: the pool's restore returned no VM and no error", ErrInvalidConfig)
		}
		return v, err
	}, opts), nil
}

// poolLabels returns a copy of labels with [LabelPool] set, to its value
// in labels or else a random ID, and that value.
func poolLabels(labels map[string]string) (map[string]string, string) {
	labels = maps.Clone(labels)
	if labels == nil {
		labels = map[string]string{}
	}
	id := labels[LabelPool]
	if id == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		id = hex.EncodeToString(b[:])
		labels[LabelPool] = id
	}
	return labels, id
}

// newPool starts a pool whose sandboxes newSandbox makes, created; when
// it fails, it has removed what it made.
func newPool(id string, newSandbox func(ctx context.Context) (VM, error), opts []PoolOption) *Pool {
	o := poolOptions{size: DefaultPoolSize, creates: DefaultPoolCreates, backoffMin: DefaultPoolBackoffMin, backoffMax: DefaultPoolBackoffMax}
	for _, opt := range opts {
		opt(&o)
	}
	p := &Pool{
		newSandbox: newSandbox, o: o, id: id,
		done: make(chan struct{}),
		out:  map[*pooledVM]bool{},
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.mu.Lock()
	p.fill()
	p.mu.Unlock()
	return p
}

// ID is the value of the [LabelPool] label on the pool's sandboxes.
func (p *Pool) ID() string { return p.id }

// Get hands out a fresh, created sandbox. With one ready it returns at
// once and a refill starts in the background. With none ready it waits
// for the first create to finish: one already in flight when there is
// one for every waiting Get (it started earlier, so it ends sooner), else
// one it starts itself when the create bound allows.
//
// When a create fails, the Gets that no create in flight will serve fail
// with its error (wrapped: errors.Is sees the [New]/[VM.Create] sentinel
// such as [ErrUnavailable] or [ErrImageNotFound]), and the pool backs off
// before creating again (see [WithPoolBackoff]); a Get during the backoff
// waits for the next try. When ctx ends first Get returns ctx.Err(), and
// the sandbox it would have had goes back to the pool unused. After
// Close, Get fails with [ErrPoolClosed].
//
// Remove the sandbox when done with it; it is the caller's to remove,
// from any goroutine, as any [VM] (Create on it fails with
// [ErrAlreadyCreated]). It wraps the VM newVM or restore made, so a
// type assertion to *APIVM or *CLIVM fails.
func (p *Pool) Get(ctx context.Context) (VM, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrPoolClosed
	}
	if len(p.ready) > 0 {
		v := p.ready[0]
		p.ready = p.ready[1:]
		pv := p.handOut(v)
		p.fill()
		p.mu.Unlock()
		return pv, nil
	}
	ch := make(chan getResult, 1)
	p.waiters = append(p.waiters, ch)
	p.fill()
	p.mu.Unlock()

	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
	}
	p.mu.Lock()
	queued := p.dropWaiter(ch)
	p.mu.Unlock()
	if queued { // nothing was sent
		return nil, ctx.Err()
	}
	if r := <-ch; r.v != nil { // sent meanwhile: back to the pool, unused
		p.takeBack(r.v.(*pooledVM))
	}
	return nil, ctx.Err()
}

// Close stops refilling, fails waiting Gets with [ErrPoolClosed], and
// removes every sandbox the pool made: the ready ones, those being
// created (their creates are cancelled), and those handed out and not
// removed yet (their callers' Runs then fail with [ErrRemoved]). It waits
// for all of it, or for ctx: then it returns ctx's error and the removals
// go on in the background. It returns the removals' errors joined; a
// sandbox it could not remove is left for [Reap]. Calling it again waits
// for the first call and returns its result.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		select {
		case <-p.done:
			return p.closeErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	p.closed = true
	p.cancel()
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	for _, ch := range p.waiters {
		ch <- getResult{err: ErrPoolClosed}
	}
	p.waiters = nil
	vms := p.ready
	p.ready = nil
	for pv := range p.out {
		vms = append(vms, pv) // its Remove untracks it
	}
	p.mu.Unlock()

	go func() {
		err := p.removeAll(vms)
		p.wg.Wait() // the creates remove what they made after Close
		p.closeErr = err
		close(p.done)
	}()
	select {
	case <-p.done:
		return p.closeErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// removeAll removes vms, as many at once as creates are allowed.
func (p *Pool) removeAll(vms []VM) error {
	sem := make(chan struct{}, p.o.creates)
	errs := make([]error, len(vms))
	var wg sync.WaitGroup
	for i, v := range vms {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = removeDetached(v)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// removeTimeout bounds the removals the pool makes on its own.
const removeTimeout = time.Minute

// removeDetached removes v with a context of its own: the pool's may be
// what ended its use.
func removeDetached(v VM) error {
	ctx, cancel := context.WithTimeout(context.Background(), removeTimeout)
	defer cancel()
	if err := v.Remove(ctx); err != nil {
		return fmt.Errorf("vm: pool: removing %.12s: %w", v.ID(), err)
	}
	return nil
}

// Stats returns a snapshot of the pool's state and counters.
func (p *Pool) Stats() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.stats
	s.Ready, s.Creating, s.InUse, s.Waiting = len(p.ready), p.creating, len(p.out), len(p.waiters)
	return s
}

// fill starts creates while there is demand (the ready sandboxes missing,
// plus one per waiting Get) not covered by creates in flight, within the
// create bound and outside a backoff. p.mu must be held.
func (p *Pool) fill() {
	for !p.closed && p.creating < p.o.creates && p.creating < p.o.size-len(p.ready)+len(p.waiters) {
		if wait := time.Until(p.retryAt); wait > 0 {
			if p.timer == nil {
				p.timer = time.AfterFunc(wait, func() {
					p.mu.Lock()
					defer p.mu.Unlock()
					p.timer = nil
					p.fill()
				})
			}
			return
		}
		p.creating++
		p.wg.Add(1)
		go p.create()
	}
}

// create makes one sandbox and gives it to the oldest waiting Get, or
// keeps it ready.
func (p *Pool) create() {
	defer p.wg.Done()
	v, err := p.newSandbox(p.ctx)

	p.mu.Lock()
	p.creating--
	closed := p.closed
	if !closed {
		p.settle(v, err)
		p.fill()
	} else if err == nil {
		p.stats.Created++
	}
	p.mu.Unlock()
	if closed && err == nil {
		_ = removeDetached(v) // Close waits for it; a failure is left for Reap
	}
}

// settle records the outcome of a create: the sandbox goes to the oldest
// waiting Get or to the ready ones; a failure starts or extends the
// backoff and fails the Gets no create in flight will serve. p.mu must
// be held.
func (p *Pool) settle(v VM, err error) {
	if err != nil {
		p.stats.Failed++
		p.stats.LastErr = err
		p.backoff = min(max(2*p.backoff, p.o.backoffMin), p.o.backoffMax)
		p.retryAt = time.Now().Add(p.backoff)
		for len(p.waiters) > p.creating {
			p.send(getResult{err: fmt.Errorf("vm: pool: creating a sandbox: %w", err)})
		}
		return
	}
	p.stats.Created++
	p.backoff, p.retryAt = 0, time.Time{}
	if len(p.waiters) > 0 {
		p.send(getResult{v: p.handOut(v)})
		return
	}
	p.ready = append(p.ready, v)
}

// send gives r to the oldest waiting Get. p.mu must be held.
func (p *Pool) send(r getResult) {
	ch := p.waiters[0]
	p.dropWaiter(ch)
	ch <- r
}

// dropWaiter takes ch out of the queue and reports whether it was there.
// p.mu must be held.
func (p *Pool) dropWaiter(ch chan getResult) bool {
	i := slices.Index(p.waiters, ch)
	if i < 0 {
		return false
	}
	p.waiters = slices.Delete(p.waiters, i, i+1)
	return true
}

// handOut tracks v as handed out. p.mu must be held.
func (p *Pool) handOut(v VM) *pooledVM {
	pv := &pooledVM{VM: v, p: p}
	p.out[pv] = true
	p.stats.Handed++
	return pv
}

// takeBack returns a sandbox that reached a Get too late, unused, to the
// front of the pool, or removes it when the pool is closed (Close removed
// it already if it saw it handed out; Remove is idempotent).
func (p *Pool) takeBack(pv *pooledVM) {
	p.mu.Lock()
	delete(p.out, pv)
	p.stats.Handed--
	if !p.closed {
		p.ready = append([]VM{pv.VM}, p.ready...)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	_ = removeDetached(pv.VM)
}

// pooledVM is a sandbox handed out by a Pool: the VM itself, whose Remove
// also tells the pool it is gone, and whose other capabilities (files,
// snapshots, processes, services) are the VM's: see capability.
type pooledVM struct {
	VM
	p *Pool
}

// unwrap returns the sandbox itself.
func (v *pooledVM) unwrap() VM { return v.VM }

// capability returns v as a T: v itself, or the VM it wraps (a sandbox
// of a Pool), as errors.As looks through wrapped errors (unexported, so
// that nobody reaches a pooled sandbox behind its pool's back). The wrapper's
// own methods (a pooled sandbox's Remove) are VM methods, never
// capabilities, so none is bypassed.
func capability[T any](v VM) (T, bool) {
	for {
		if t, ok := v.(T); ok {
			return t, true
		}
		u, ok := v.(interface{ unwrap() VM })
		if !ok {
			var zero T
			return zero, false
		}
		v = u.unwrap()
	}
}

// Remove removes the sandbox, as the VM's own Remove does; once it
// succeeded the pool no longer tracks it.
func (v *pooledVM) Remove(ctx context.Context) error {
	if err := v.VM.Remove(ctx); err != nil {
		return err
	}
	v.p.mu.Lock()
	delete(v.p.out, v)
	v.p.mu.Unlock()
	return nil
}
