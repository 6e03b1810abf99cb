package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/podvm/podvm/vm"
)

// The pool comparison: a fresh sandbox from a vm.Pool (Get, the round
// trip, the sandbox's own Remove) against the same work without a pool
// (vmLifecycle), per backend; first one at a time with the pool warm,
// then sustained with several callers.

// poolSize is the warm pool's size in the one-at-a-time comparison.
const poolSize = 4

// poolCallers are the caller counts of the sustained comparison.
var poolCallers = []int{1, 8}

// poolResult is one backend's pool measurements.
type poolResult struct {
	name        string
	skip        string
	get, cycle  *series // warm: Get alone; Get + round trip + Remove
	plain       *series // create + start + round trip + remove, no pool
	pooled, raw []rate  // sustained, per poolCallers: through a pool, without
	gets        []*series
	created     []float64 // sandboxes the pool created per second, per poolCallers
}

func (b *bench) pools(ctx context.Context) error {
	rounds := max(b.sz.lifecycle, minRounds)
	window := b.poolWindow()
	for _, be := range backends {
		if why, bad := b.vmErr[be.name]; bad {
			b.pool = append(b.pool, poolResult{name: be.name, skip: why})
			continue
		}
		r := poolResult{name: be.name, get: &series{name: be.name}, cycle: &series{name: be.name}, plain: &series{name: be.name}}
		if err := b.warmPool(ctx, be, b.cfg, rounds, &r); err != nil {
			return err
		}
		for _, callers := range poolCallers {
			progress("pool: %s: %d callers", be.name, callers)
			pooled, gets, created, err := b.sustainedPool(ctx, be, callers, window)
			if err != nil {
				return err
			}
			r.pooled, r.gets, r.created = append(r.pooled, pooled), append(r.gets, gets), append(r.created, created)
			r.raw = append(r.raw, hammerEach(ctx, func() op { return vmLifecycle(be, b.p.url, b.cfg) }, callers, window))
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		b.pool = append(b.pool, r)
	}
	progress("")
	return nil
}

// newPool makes a pool of sandboxes of cfg on backend be.
func (b *bench) newPool(be backend, cfg vm.Config, opts ...vm.PoolOption) (*vm.Pool, error) {
	return vm.NewPool(cfg, func(ctx context.Context, cfg vm.Config) (vm.VM, error) { return be.new(ctx, b.p.url, cfg) }, opts...)
}

// poolWindow is how long each sustained measure lasts: long enough for
// the pool's stock to be a small part of what the callers take.
func (b *bench) poolWindow() time.Duration {
	if b.quick {
		return time.Second
	}
	return 5 * time.Second
}

// fillTimeout bounds the untimed wait for a pool to be full.
const fillTimeout = 2 * time.Minute

// waitFull waits, untimed, until p has n sandboxes ready.
func waitFull(ctx context.Context, p *vm.Pool, n int) error {
	ctx, cancel := context.WithTimeout(ctx, fillTimeout)
	defer cancel()
	for p.Stats().Ready < n {
		if s := p.Stats(); s.Failed > 0 && s.Ready == 0 && s.Creating == 0 {
			return fmt.Errorf("the pool does not fill: %w", s.LastErr)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the pool did not fill within %v: %+v", fillTimeout, p.Stats())
		case <-time.After(time.Millisecond):
		}
	}
	return nil
}

// warmPool times, one at a time, a Get from a full pool and what follows
// it, alternating with a plain lifecycle; the pool refills, untimed,
// before each Get. Its sandboxes are cfg's on be.
func (b *bench) warmPool(ctx context.Context, be backend, cfg vm.Config, rounds int, r *poolResult) error {
	p, err := b.newPool(be, cfg, vm.WithPoolSize(poolSize))
	if err != nil {
		return err
	}
	defer closePool(p)
	plain := vmLifecycle(be, b.p.url, cfg)
	for i := range rounds + 1 { // the first round warms up
		progress("pool: %s: warm round %d/%d", be.name, i+1, rounds+1)
		if err := waitFull(ctx, p, poolSize); err != nil {
			r.skip = "failed: " + oneLine(err)
			return ctx.Err()
		}
		t0 := time.Now()
		v, err := p.Get(ctx)
		dGet := time.Since(t0)
		if err == nil {
			rctx, cancel := removeContext(ctx)
			err = errors.Join(vmRoundTrip(v)(ctx), v.Remove(rctx))
			cancel()
		}
		dCycle := time.Since(t0)
		t1 := time.Now()
		plainErr := plain(ctx)
		dPlain := time.Since(t1)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if i > 0 {
			r.get.add(dGet, err)
			r.cycle.add(dCycle, err)
			r.plain.add(dPlain, plainErr)
		}
	}
	return nil
}

// sustainedPool runs callers that each take a sandbox from a full pool,
// run the round trip and remove it, again and again for window. It
// returns their rate, the Gets' durations, and how many sandboxes the
// pool created per second meanwhile: what the service sustains.
func (b *bench) sustainedPool(ctx context.Context, be backend, callers int, window time.Duration) (rate, *series, float64, error) {
	size := max(poolSize, callers)
	p, err := b.newPool(be, b.cfg, vm.WithPoolSize(size), vm.WithPoolCreates(min(max(callers, 2), 4)))
	if err != nil {
		return rate{}, nil, 0, err
	}
	defer closePool(p)
	gets := &series{name: be.name}
	if err := waitFull(ctx, p, size); err != nil {
		return rate{err: err, fails: 1}, gets, 0, ctx.Err()
	}
	var mu sync.Mutex
	cycle := func(ctx context.Context) error {
		t0 := time.Now()
		v, err := p.Get(ctx)
		d := time.Since(t0)
		mu.Lock()
		gets.add(d, err)
		mu.Unlock()
		if err != nil {
			return err
		}
		rctx, cancel := removeContext(ctx)
		defer cancel()
		return errors.Join(vmRoundTrip(v)(ctx), v.Remove(rctx))
	}
	before := p.Stats().Created
	rt := hammerEach(ctx, func() op { return cycle }, callers, window)
	created := float64(p.Stats().Created-before) / rt.elapsed.Seconds()
	return rt, gets, created, nil
}

// closePool closes p with a context of its own: the run's may be over.
func closePool(p *vm.Pool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = p.Close(ctx) // what it could not remove, the bench's cleanup does
}

// getTarget is issue 19's target for a Get from a warm pool.
const getTarget = 5 * time.Millisecond

func (b *bench) reportPool(w io.Writer) {
	if len(b.pool) == 0 {
		return
	}
	reportWarmPool(w, "**Pool, warm**", b.pool)

	window := b.poolWindow()
	fmt.Fprintf(w, "\n**Pool, sustained**: fresh sandboxes per second, each caller taking one, running the round trip and removing it, again and again for %v; the pool starts full (%d sandboxes, or one per caller) and creates as many at once as there are callers, from 2 up to 4\n\n", window, poolSize)
	fmt.Fprint(w, "| how |")
	for _, c := range poolCallers {
		fmt.Fprintf(w, " %d caller%s |", c, plural(c))
	}
	last := poolCallers[len(poolCallers)-1]
	fmt.Fprintf(w, " Get p50 / p90 with %d | created per second with %d | failures |\n|---|", last, last)
	for range poolCallers {
		fmt.Fprint(w, "--:|")
	}
	fmt.Fprintln(w, "--:|--:|---|")
	for _, r := range b.pool {
		if r.skip != "" {
			continue
		}
		for _, mode := range []struct {
			label string
			rates []rate
		}{{"pool", r.pooled}, {"plain", r.raw}} {
			fmt.Fprintf(w, "| %s, %s |", r.name, mode.label)
			var fails []string
			for i, rt := range mode.rates {
				fmt.Fprintf(w, " %.1f |", rt.perSecond())
				if rt.fails > 0 {
					fails = append(fails, fmt.Sprintf("%d of %d with %d: %s", rt.fails, rt.fails+rt.ops, poolCallers[i], oneLine(rt.err)))
				}
			}
			if mode.label == "pool" && len(r.gets) == len(poolCallers) {
				g := r.gets[len(r.gets)-1]
				fmt.Fprintf(w, " %s / %s | %.1f |", ms(g.p50()), ms(g.p90()), r.created[len(r.created)-1])
			} else {
				fmt.Fprint(w, " | |")
			}
			fmt.Fprintf(w, " %s |\n", orNone(strings.Join(fails, "; ")))
		}
	}

	fmt.Fprintln(w, "\n**Pool targets**\n\n| target | measured | result |\n|---|---|---|")
	for _, r := range b.pool {
		what := fmt.Sprintf("%s: Get p50 ≤ %s with a warm pool", strings.TrimPrefix(r.name, "podvm "), ms(getTarget))
		switch {
		case r.skip != "" || !r.get.ok():
			fmt.Fprintf(w, "| %s | not measured | – |\n", what)
		case r.get.p50() <= getTarget:
			fmt.Fprintf(w, "| %s | %s | pass |\n", what, ms(r.get.p50()))
		default:
			fmt.Fprintf(w, "| %s | %s | **miss** |\n", what, ms(r.get.p50()))
		}
	}
	for _, r := range b.pool {
		if r.skip != "" || len(r.pooled) != len(poolCallers) {
			continue
		}
		i := len(poolCallers) - 1
		fmt.Fprintf(w, "| %s: sustained fresh sandboxes per second, %d callers | %.1f/s through the pool, %.1f/s plain | bounded by the service: the pool created %.1f/s meanwhile, while the plain callers' creates, starts and removes ran at %.1f/s; a pool hides the create's latency, not its cost |\n",
			strings.TrimPrefix(r.name, "podvm "), poolCallers[i], r.pooled[i].perSecond(), r.raw[i].perSecond(), r.created[i], r.raw[i].perSecond())
	}
}

// reportWarmPool is the table of warmPool's measurements of rs.
func reportWarmPool(w io.Writer, caption string, rs []poolResult) {
	n := 0
	for _, r := range rs {
		if r.get != nil {
			n = max(n, len(r.get.d)+r.get.fails)
		}
	}
	fmt.Fprintf(w, "\n%s: `vm.Pool.Get` from a full pool of %d, then the round trip and the sandbox's `Remove` (giving it back), against a plain create, start, round trip, remove; the pool refills, untimed, before each Get; %d run%s each\n\n", caption, poolSize, n, plural(n))
	fmt.Fprintln(w, "| how | Get p50 | Get p90 | Get + round trip + Remove p50 | plain lifecycle p50 | vs plain | failures |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|--:|")
	for _, r := range rs {
		if r.skip != "" {
			fmt.Fprintf(w, "| %s | %s | | | | | |\n", r.name, r.skip)
			continue
		}
		var fails []string
		for _, s := range []*series{r.cycle, r.plain} {
			if s.fails > 0 {
				fails = append(fails, failures(s))
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", r.name, ms(r.get.p50()), ms(r.get.p90()), ms(r.cycle.p50()), ms(r.plain.p50()),
			ratio(float64(r.cycle.p50()), float64(r.plain.p50())), orNone(strings.Join(fails, "; ")))
	}
}
