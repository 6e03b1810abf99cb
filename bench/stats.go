package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// An op is one timed operation of one alternative: one exec round trip,
// one sandbox lifecycle, one stream. It fails when the operation failed
// or its result is wrong (a wrong exit code, missing output), so that a
// fast but broken alternative shows as errors, not as a good time.
type op func(ctx context.Context) error

// An alt is one alternative in one comparison.
type alt struct {
	name string
	op   op
	// skip, when not empty, says why the alternative is not measured.
	skip string
	// held, if set, counts what each timed call leaves open.
	held *leak
	// per, if set, is how many operations one call does: its time is
	// divided by it.
	per int
	// timed, if set, is the operation instead of op, and times itself:
	// it returns how long the part that counts took (up to a first
	// byte), leaving out what follows (reading the rest, closing,
	// waiting for a process to end).
	timed func(ctx context.Context) (time.Duration, error)
}

// call runs a's operation once and returns how long it took, or what its
// timed part took.
func (a alt) call(ctx context.Context) (time.Duration, error) {
	if a.timed != nil {
		return a.timed(ctx)
	}
	t0 := time.Now()
	err := a.op(ctx)
	return time.Since(t0), err
}

// series is what measure recorded for one alternative.
type series struct {
	name  string
	skip  string
	d     []time.Duration // successful runs only
	fails int
	err   error // the first failure
}

func (s *series) add(d time.Duration, err error) {
	if err != nil {
		s.fails++
		if s.err == nil {
			s.err = err
		}
		return
	}
	s.d = append(s.d, d)
}

// pct is the p-th percentile (0 < p <= 100) of the successful runs, by
// nearest rank; zero when there are none.
func (s *series) pct(p float64) time.Duration {
	if len(s.d) == 0 {
		return 0
	}
	d := slices.Sorted(slices.Values(s.d))
	i := int(float64(len(d))*p/100+0.999999) - 1
	return d[max(0, min(i, len(d)-1))]
}

func (s *series) p50() time.Duration { return s.pct(50) }
func (s *series) p90() time.Duration { return s.pct(90) }

// ok reports whether s has measurements to show.
func (s *series) ok() bool { return s.skip == "" && len(s.d) > 0 }

// minRounds is how many timed rounds measure runs whatever its budget.
const minRounds = 3

// measure runs warm untimed rounds, then n timed rounds. A round runs
// every alternative once, starting with a different one each round, so
// that machine noise and whatever one alternative leaves behind (Podman's
// lingering exec sessions, a GC) fall on all of them alike. An
// alternative that fails every warm-up round is dropped with its error.
// It stops early when ctx ends, and after minRounds once the timed rounds
// have taken budget: a loaded machine gets fewer samples, not a longer
// run.
func measure(ctx context.Context, what string, alts []alt, warm, n int, budget time.Duration) ([]*series, error) {
	out := make([]*series, len(alts))
	for i, a := range alts {
		out[i] = &series{name: a.name, skip: a.skip}
	}
	live := func(i int) bool { return out[i].skip == "" }
	for w := range warm {
		for i, a := range alts {
			if !live(i) {
				continue
			}
			_, err := a.call(ctx)
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			if err != nil {
				out[i].add(0, err)
				if w == warm-1 && out[i].fails == warm {
					out[i].skip = "failed: " + oneLine(err)
				}
			}
		}
	}
	for i := range out {
		if live(i) {
			out[i].fails, out[i].err = 0, nil
		}
	}
	start := time.Now()
	for r := range n {
		if r >= minRounds && time.Since(start) > budget {
			break
		}
		progress("%s: round %d/%d", what, r+1, n)
		for k := range alts {
			i := (r + k) % len(alts)
			if !live(i) {
				continue
			}
			if h := alts[i].held; h != nil {
				h.before()
			}
			d, err := alts[i].call(ctx)
			if h := alts[i].held; h != nil {
				h.after()
			}
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
			out[i].add(d/time.Duration(max(1, alts[i].per)), err)
		}
	}
	progress("")
	return out, nil
}

// progress overwrites one status line on stderr when it is a terminal.
func progress(format string, a ...any) {
	if !stderrIsTTY {
		return
	}
	fmt.Fprintf(os.Stderr, "\r\033[K"+format, a...)
}

var stderrIsTTY = func() bool {
	fi, err := os.Stderr.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}()

// ms formats d in milliseconds, or microseconds below 0.1 ms.
func ms(d time.Duration) string {
	switch {
	case d == 0:
		return "–"
	case d < 100*time.Microsecond: // a warm pool's Get: "0.00 ms" would say nothing
		return fmt.Sprintf("%.1f µs", float64(d)/1e3)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/1e6)
	case d < time.Second:
		return fmt.Sprintf("%.1f ms", float64(d)/1e6)
	}
	return fmt.Sprintf("%.0f ms", float64(d)/1e6)
}

// ratio formats a/b as "0.62×".
func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// oneLine shortens an error for a table cell.
func oneLine(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	for i, c := range s {
		if c == '\n' {
			s = s[:i]
			break
		}
	}
	if len(s) > 160 {
		s = s[:157] + "..."
	}
	return strings.ReplaceAll(s, "|", `\|`) // a markdown table cell
}
