package libpod

import (
	"context"
	"errors"
	"io"
	"net/http"
	"regexp"
	"sync/atomic"
	"time"
)

// The exec session's polling: while its stream is open, a session is
// inspected now and then, to notice a process that has exited while
// something else (a background child) holds its output open.
const (
	pollFirst = 100 * time.Millisecond
	pollMax   = time.Second
	// notSeenGrace is how long a stream stays open once the inspect says
	// a process never seen running does not run: a slow start (the pids
	// limit) looks the same until it starts.
	notSeenGrace = 10 * time.Second
)

// StopDrain bounds how long [Client.Exec] drains a stream once its
// process was stopped.
const StopDrain = time.Second

// Exec runs one exec session in container id to its end: it creates and
// starts the session on a connection of its own, demultiplexes its
// stream into stdout and stderr as it arrives, copies stdin (when not
// nil) to it, then half-closes it, and returns the exit status once the
// stream has been drained and the session no longer runs (reading it
// earlier races the process's end: podman#6893). It returns the session's
// ID as soon as one was created, also with an error.
//
// A stream still open grace after its process exited is closed (Podman
// ends a session's stream when its process exits, whatever children it
// left; one that outlives it is held by them). Only a process known to
// have started (seen running, or its output seen) counts as exited: the
// service upgrades the connection before runc has started the process,
// and until then the inspect says it does not run. When stdin could not
// be delivered to a process that has exited (Podman's reset line on
// stderr, or the stream reset while stdin was written), Podman may have
// dropped output still on its way: Exec drains what came and returns an
// [*Error] saying so (see lostOutput), never the status alone. Exec does not wait for a
// stdin whose Read blocks once the session has ended. It returns ctx's
// error when ctx ends first, closing the stream, and an [*Error] when
// the stream fails otherwise (the connection was dropped). When stop is
// not nil, a ctx that ends first calls it (it kills the process), and the
// stream is drained, [StopDrain] at most, before it is closed: what the
// process wrote before it was stopped, still on its way, arrives.
func (c *Client) Exec(ctx context.Context, id string, cfg ExecConfig, stdin io.Reader, stdout, stderr io.Writer, grace time.Duration, stop func()) (int, string, error) {
	execID, err := c.ExecCreate(ctx, id, cfg)
	if err != nil {
		return -1, "", err
	}
	s, err := c.ExecStart(ctx, execID)
	if err != nil {
		var e *Error
		if errors.As(err, &e) && e.Status != 0 {
			return -1, "", err // the service refused: it never started
		}
		return -1, execID, err // it may have started
	}
	ss := &session{id: execID, s: s, done: make(chan struct{})}
	if stdin != nil {
		stderr = dropAttachReset{stderr, &ss.cut}
	}
	go func() {
		ss.err = Demux(s, seenWriter{stdout, &ss.output}, seenWriter{stderr, &ss.output})
		close(ss.done)
	}()
	if stdin != nil {
		ss.stdin = true
		go func() {
			io.Copy(s, stdin) // a write error: the process stopped reading
			s.CloseWrite()
		}()
	}
	code, err := c.finish(ctx, ss, grace, stop)
	s.Close()
	<-ss.done
	if err == nil && ss.cut.Load() {
		return -1, execID, &Error{Op: "exec", Status: http.StatusOK, Message: lostOutput}
	}
	return code, execID, err
}

// lostOutput says why a session whose stdin was cut is a failure. When
// the service cannot write stdin to a process that has exited, Podman 4.3
// ends the stream at once, without waiting for the output still on its
// way (libpod/oci_conmon_exec_common.go, attachExecHTTP: a stdin error
// returns before the stdout copy ends): what arrived may be short of
// what the command wrote, and nothing tells how much is missing.
const lostOutput = "the command exited before reading all of its stdin, and Podman ended the stream without waiting for its output: some of it may be lost"

// session is a started exec session whose stream is being demultiplexed.
type session struct {
	id    string
	s     *ExecStream
	done  chan struct{} // closed when Demux has returned
	err   error         // Demux's error, once done is closed
	stdin bool          // stdin is being copied to the stream
	// cut is set when the stream ended because stdin could not be
	// delivered: Podman may have dropped output (see lostOutput).
	cut atomic.Bool
	// output is set once the stream has carried output: the process has
	// started. Until then, an inspect saying it does not run may mean it
	// has not begun yet (a slow start under the pids limit).
	output atomic.Bool
}

// seenWriter sets seen on the first write.
type seenWriter struct {
	w    io.Writer
	seen *atomic.Bool
}

func (s seenWriter) Write(p []byte) (int, error) {
	if len(p) > 0 {
		s.seen.Store(true)
	}
	return s.w.Write(p)
}

// attachReset is the line Podman 4.3 writes on an exec's stderr when the
// process exited while stdin was still being sent to it: the service's
// own noise, not the command's.
var attachReset = regexp.MustCompile(`^Error: (read|write) unixpacket [^\n]*/attach: (read|write): (connection reset by peer|broken pipe)\n$`)

// dropAttachReset drops a stderr frame that is Podman's attachReset line
// (Demux hands it over in one Write), and sets cut when it does.
type dropAttachReset struct {
	w   io.Writer
	cut *atomic.Bool
}

func (d dropAttachReset) Write(p []byte) (int, error) {
	if attachReset.Match(p) {
		d.cut.Store(true)
		return len(p), nil
	}
	return d.w.Write(p)
}

// finish waits for the session's end and returns its exit status: first
// the stream's end, then the session's inspect, until it no longer runs.
func (c *Client) finish(ctx context.Context, ss *session, grace time.Duration, stop func()) (int, error) {
	every := pollFirst
	poll := time.NewTimer(every)
	defer poll.Stop()
	var hang <-chan time.Time
	for drained := false; !drained; {
		select {
		case <-ss.done:
			if ss.err != nil && !(ss.stdin && c.exited(ctx, ss.id)) {
				return -1, ss.err
			}
			if ss.err != nil {
				ss.cut.Store(true) // reset while stdin was sent: output may be lost
			}
			drained = true
		case <-hang:
			if st, err := c.ExecInspect(ctx, ss.id); err == nil && st.Running {
				// It had not started yet: it runs now.
				ss.output.Store(true)
				hang = nil
				poll.Reset(every)
				continue
			}
			drained = true // the process is gone; what holds its stream is not waited for
		case <-ctx.Done():
			if stop != nil {
				stop()
				select {
				case <-ss.done:
				case <-time.After(StopDrain):
				}
			}
			return -1, ctx.Err()
		case <-poll.C:
			st, err := c.ExecInspect(ctx, ss.id)
			if err == nil && st.Running {
				ss.output.Store(true) // seen running: it has started
			}
			if err == nil && !st.Running {
				// A process never seen running may not have started yet;
				// it gets longer before its stream is given up.
				wait := grace
				if !ss.output.Load() {
					wait = notSeenGrace
				}
				hang = time.After(wait)
				continue
			}
			every = min(2*every, pollMax)
			poll.Reset(every)
		}
	}
	for delay := 2 * time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		st, err := c.ExecInspect(ctx, ss.id)
		if err != nil {
			return -1, err
		}
		if !st.Running {
			return st.ExitCode, nil
		}
		select {
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-time.After(delay):
		}
	}
}

// exited reports that session execID is known to have stopped running.
func (c *Client) exited(ctx context.Context, execID string) bool {
	st, err := c.ExecInspect(ctx, execID)
	return err == nil && !st.Running
}
