package main

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// rate is what concurrent callers achieved in one window.
type rate struct {
	ops, fails int
	elapsed    time.Duration
	err        error // the first failure
}

func (r rate) perSecond() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.ops) / r.elapsed.Seconds()
}

// hammerEach runs callers goroutines at once, each with its own operation
// from mk (made before the window opens: a caller's setup is not charged
// to it), which it starts again and again until window has passed, and
// counts the operations that succeeded per second, from the start until
// the last one ended. A panic counts as a failure instead of crashing the
// bench; calls that outlive the window by more than opTimeout are
// abandoned and counted as a failure.
func hammerEach(ctx context.Context, mk func() op, callers int, window time.Duration) rate {
	ops := make([]op, callers)
	for i := range ops {
		ops[i] = mk()
	}
	var (
		mu  sync.Mutex
		r   rate
		wg  sync.WaitGroup
		end = time.Now().Add(window)
	)
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		r.fails++
		if r.err == nil {
			r.err = err
		}
	}
	call := func(o op) {
		defer func() {
			if p := recover(); p != nil {
				fail(fmt.Errorf("panic: %v", p))
			}
		}()
		if err := o(ctx); err != nil {
			if ctx.Err() == nil {
				fail(err)
			}
			return
		}
		mu.Lock()
		r.ops++
		mu.Unlock()
	}
	start := time.Now()
	for _, o := range ops {
		wg.Go(func() {
			for time.Now().Before(end) && ctx.Err() == nil {
				call(o)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(window + opTimeout):
		fail(fmt.Errorf("calls still running %v after the window: abandoned", opTimeout))
	}
	mu.Lock()
	defer mu.Unlock()
	r.elapsed = time.Since(start)
	return r
}
