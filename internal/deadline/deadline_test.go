package deadline

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// Err says why a run stopped, whichever context ended: the caller's
// (its cause kept), or the run's own timeout.
func TestErr(t *testing.T) {
	t.Parallel()
	bg := context.Background()
	cause := errors.New("the build was abandoned")
	for _, c := range []struct {
		name    string
		stop    func() (parent, run context.Context)
		want    error // nil: the run was not stopped
		message string
	}{
		{"running", func() (context.Context, context.Context) {
			run, _ := Start(bg, time.Hour)
			return bg, run
		}, nil, ""},
		{"timeout", func() (context.Context, context.Context) {
			run, _ := Start(bg, time.Nanosecond)
			<-run.Done()
			return bg, run
		}, context.DeadlineExceeded, "vm: x: timed out after 1ns"},
		{"cancelled", func() (context.Context, context.Context) {
			parent, cancel := context.WithCancel(bg)
			run, _ := Start(parent, 0)
			cancel()
			return parent, run
		}, context.Canceled, "vm: x: context canceled"},
		{"cancelled with a cause", func() (context.Context, context.Context) {
			parent, cancel := context.WithCancelCause(bg)
			run, _ := Start(parent, time.Hour)
			cancel(cause)
			return parent, run
		}, cause, "the build was abandoned"},
		{"the caller's deadline", func() (context.Context, context.Context) {
			parent, cancel := context.WithTimeout(bg, time.Nanosecond)
			t.Cleanup(cancel)
			run, _ := Start(parent, time.Hour)
			<-run.Done()
			return parent, run
		}, context.DeadlineExceeded, "context deadline exceeded"},
	} {
		t.Run(c.name, func(t *testing.T) {
			parent, run := c.stop()
			err := Err("vm", parent, run, "x", map[bool]time.Duration{true: time.Nanosecond}[c.name == "timeout"])
			if c.want == nil {
				if err != nil {
					t.Fatalf("a run still going: %v", err)
				}
				return
			}
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.message) {
				t.Errorf("got %v; want one matching %v and saying %q", err, c.want, c.message)
			}
		})
	}
}

// Start without a timeout bounds nothing but the parent; its cancel ends
// it.
func TestStartWithoutTimeout(t *testing.T) {
	t.Parallel()
	run, cancel := Start(context.Background(), 0)
	if _, ok := run.Deadline(); ok {
		t.Error("a zero timeout set a deadline")
	}
	cancel()
	if run.Err() == nil {
		t.Error("cancel did not end the run's context")
	}
}
