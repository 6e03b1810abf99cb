package agent

import (
	"context"
	"fmt"
	"io"
	"net"
	osexec "os/exec"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/podvm/podvm/internal/agent/psk"
)

// shRoundTrip is the command of make bench's round trip rows.
var shRoundTrip = []string{"/bin/busybox", "sh", "-c", "echo hi; echo oops >&2; exit 3"}

// BenchmarkRoundTrip compares a round trip through the agent (PID 1 of
// its own PID namespace, over pipes) with host os/exec, for /bin/true and
// for make bench's round trip command. Besides the mean (ns/op) it
// reports the median as p50-ns/op.
func BenchmarkRoundTrip(b *testing.B) {
	for _, argv := range [][]string{{"/bin/true"}, shRoundTrip} {
		name := "true"
		if len(argv) > 1 {
			name = "sh"
		}
		b.Run("agent-"+name, func(b *testing.B) {
			a := startAgent(b)
			ctx := context.Background()
			req := Request{Argv: argv}
			p50(b, func() error {
				_, err := a.Run(ctx, req, nil, io.Discard, io.Discard)
				return err
			})
		})
		b.Run("host-os-exec-"+name, func(b *testing.B) {
			p50(b, func() error {
				err := osexec.Command(argv[0], argv[1:]...).Run()
				if _, ok := err.(*osexec.ExitError); ok {
					return nil
				}
				return err
			})
		})
	}
}

// BenchmarkRoundTripParallel is make bench's round trip run by 4 and 16
// callers at once on one agent.
func BenchmarkRoundTripParallel(b *testing.B) {
	for _, callers := range []int{4, 16} {
		b.Run(fmt.Sprintf("callers-%d", callers), func(b *testing.B) {
			a := startAgent(b)
			ctx := context.Background()
			req := Request{Argv: shRoundTrip}
			b.SetParallelism((callers + 1) / 2) // GOMAXPROCS 2 here
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := a.Run(ctx, req, nil, io.Discard, io.Discard); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkStdout streams 64 MiB of the command's stdout through the
// agent to io.Discard; allocs are the client's.
func BenchmarkStdout(b *testing.B) {
	const blocks = 1024
	a := startAgent(b)
	ctx := context.Background()
	req := Request{Argv: []string{"/bin/busybox", "dd", "if=/dev/zero", "bs=65536", "count=" + strconv.Itoa(blocks)}}
	b.SetBytes(blocks * 65536)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.Run(ctx, req, nil, io.Discard, io.Discard); err != nil {
			b.Fatal(err)
		}
	}
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

func BenchmarkStdin(b *testing.B) {
	const size = 64 << 20
	a := startAgent(b)
	ctx := context.Background()
	req := Request{Argv: []string{"/bin/busybox", "dd", "of=/dev/null", "bs=65536"}}
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.Run(ctx, req, io.LimitReader(zeroReader{}, size), io.Discard, io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}

// zeroReader reads zero bytes forever.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// BenchmarkDialFirstByte times Dial to the first byte of a server that
// writes on accept (make bench's vm.Dial row, without the container),
// against a plain connect on the host, for what the channel adds.
func BenchmarkDialFirstByte(b *testing.B) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("hello\n"))
			c.Close()
		}
	}()
	first := func(c net.Conn) error {
		defer c.Close()
		var one [1]byte
		_, err := io.ReadFull(c, one[:])
		return err
	}
	b.Run("agent", func(b *testing.B) {
		a := startAgent(b)
		ctx := context.Background()
		p50(b, func() error {
			c, err := a.Dial(ctx, "tcp", l.Addr().String(), false)
			if err != nil {
				return err
			}
			return first(c)
		})
	})
	b.Run("agent-echo", func(b *testing.B) { // a round trip on an open connection
		el, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer el.Close()
		go func() {
			c, err := el.Accept()
			if err == nil {
				_, _ = io.Copy(c, c)
				c.Close()
			}
		}()
		a := startAgent(b)
		c, err := a.Dial(context.Background(), "tcp", el.Addr().String(), false)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		var line [5]byte
		p50(b, func() error {
			if _, err := c.Write([]byte("ping\n")); err != nil {
				return err
			}
			_, err := io.ReadFull(c, line[:])
			return err
		})
	})
	b.Run("agent-refused", func(b *testing.B) { // one round trip, no connection
		a := startAgent(b)
		ctx := context.Background()
		p50(b, func() error {
			if _, err := a.Dial(ctx, "tcp", "127.0.0.1:1", false); err == nil {
				return fmt.Errorf("connected to port 1")
			}
			return nil
		})
	})
	b.Run("host", func(b *testing.B) {
		p50(b, func() error {
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				return err
			}
			return first(c)
		})
	})
}

// BenchmarkChannel streams 64 MiB of a command's stdin (into dd, which
// discards it) and of its stdout (from dd, to io.Discard) over each kind
// of channel: "unix" is local Podman's, the agent connected to a unix
// socket of the host's; "psk" is a peer's over loopback TCP, secured
// with package psk, as a pod's is (Listen, then DialPeer).
func BenchmarkChannel(b *testing.B) {
	const size = 64 << 20
	channels := []struct {
		name    string
		connect func(b *testing.B) *Client
	}{
		{"unix", func(b *testing.B) *Client {
			c, _ := startConnectAgent(b)
			b.Cleanup(func() { c.Close() })
			return c
		}},
		{"psk", func(b *testing.B) *Client {
			a := startAgent(b)
			key := psk.NewKey()
			l, err := a.Listen(context.Background(), key, 0)
			if err != nil {
				b.Fatal(err)
			}
			c, err := DialPeer(context.Background(), net.JoinHostPort("127.0.0.1", strconv.Itoa(l.Port)), key)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			return c
		}},
	}
	dd := func(args ...string) Request {
		return Request{Argv: append([]string{"/bin/busybox", "dd", "bs=65536"}, args...)}
	}
	for _, ch := range channels {
		b.Run(ch.name+"/stdin", func(b *testing.B) {
			c := ch.connect(b)
			b.SetBytes(size)
			b.ReportAllocs()
			for b.Loop() {
				ex, err := c.Run(context.Background(), dd("of=/dev/null"), io.LimitReader(zeroReader{}, size), io.Discard, io.Discard)
				if err != nil || ex.Code != 0 {
					b.Fatal(ex, err)
				}
			}
		})
		b.Run(ch.name+"/stdout", func(b *testing.B) {
			c := ch.connect(b)
			var out countWriter
			b.SetBytes(size)
			b.ReportAllocs()
			for b.Loop() {
				out = 0
				ex, err := c.Run(context.Background(), dd("if=/dev/zero", "count="+strconv.Itoa(size/65536)), nil, &out, io.Discard)
				if err != nil || ex.Code != 0 || out != size {
					b.Fatal(ex, err, out)
				}
			}
		})
	}
}

// countWriter counts what is written to it.
type countWriter int64

func (w *countWriter) Write(p []byte) (int, error) {
	*w += countWriter(len(p))
	return len(p), nil
}
