package agent

import (
	"context"
	"io"
	osexec "os/exec"
	"slices"
	"testing"
	"time"
)

// BenchmarkRoundTrip compares a round trip of /bin/true through the agent
// (PID 1 of its own PID namespace, over pipes) with host os/exec. Besides
// the mean (ns/op) it reports the median as p50-ns/op.
func BenchmarkRoundTrip(b *testing.B) {
	b.Run("agent", func(b *testing.B) {
		a := startAgent(b)
		ctx := context.Background()
		req := Request{Argv: []string{"/bin/true"}}
		p50(b, func() error {
			_, err := a.Run(ctx, req, nil, io.Discard, io.Discard)
			return err
		})
	})
	b.Run("host-os-exec", func(b *testing.B) {
		p50(b, func() error { return osexec.Command("/bin/true").Run() })
	})
}

func p50(b *testing.B, op func() error) {
	b.Helper()
	for range 5 { // warm up
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
	times := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		times = append(times, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(times)
	b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns/op")
}
