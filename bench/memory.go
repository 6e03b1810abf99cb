package main

import (
	"bytes"
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"sync"
	"time"
)

// growth is how much this process grew while one operation ran.
type growth struct {
	rss   int64  // peak resident set size over the baseline
	heap  int64  // peak HeapInuse over the baseline
	alloc uint64 // bytes allocated (garbage included)
	err   error
}

// measureGrowth runs o alone and samples this process's resident set size
// (/proc/self/statm) and heap (runtime.MemStats) every few milliseconds,
// from a baseline taken after a GC that returned free memory to the OS.
func measureGrowth(ctx context.Context, o op) growth {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	baseRSS, baseHeap, baseAlloc := rss(), int64(ms.HeapInuse), ms.TotalAlloc

	var (
		mu       sync.Mutex
		peakRSS  = baseRSS
		peakHeap = baseHeap
	)
	sample := func() {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		r := rss()
		mu.Lock()
		peakRSS, peakHeap = max(peakRSS, r), max(peakHeap, int64(ms.HeapInuse))
		mu.Unlock()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				sample()
			}
		}
	})
	err := o(ctx)
	close(stop)
	wg.Wait()
	sample()
	runtime.ReadMemStats(&ms)
	return growth{rss: peakRSS - baseRSS, heap: peakHeap - baseHeap, alloc: ms.TotalAlloc - baseAlloc, err: err}
}

// rss is this process's resident set size in bytes, 0 if unknown.
func rss() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := bytes.Fields(b)
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(string(f[1]), 10, 64)
	return pages * int64(os.Getpagesize())
}
