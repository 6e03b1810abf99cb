package libpod

import (
	"context"
	"io"
	"time"
)

// The exec session's polling: while its stream is open, a session is
// inspected now and then, to notice a process that has exited while
// something else (a background child) holds its output open.
const (
	pollFirst = 100 * time.Millisecond
	pollMax   = time.Second
)

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
// left; one that outlives it is held by them). A stream that fails while
// stdin is being written to a process that has exited (the service
// resets a connection whose input nobody read) ends like a drained one:
// what was sent before the reset is read first. Exec does not wait for a
// stdin whose Read blocks once the session has ended. It returns ctx's
// error when ctx ends first, closing the stream, and an [*Error] when
// the stream fails otherwise (the connection was dropped).
func (c *Client) Exec(ctx context.Context, id string, cfg ExecConfig, stdin io.Reader, stdout, stderr io.Writer, grace time.Duration) (int, string, error) {
	execID, err := c.ExecCreate(ctx, id, cfg)
	if err != nil {
		return -1, "", err
	}
	s, err := c.ExecStart(ctx, execID)
	if err != nil {
		return -1, "", err // it never started
	}
	ss := &session{id: execID, s: s, done: make(chan struct{})}
	go func() {
		ss.err = Demux(s, stdout, stderr)
		close(ss.done)
	}()
	if stdin != nil {
		ss.stdin = true
		go func() {
			io.Copy(s, stdin) // a write error: the process stopped reading
			s.CloseWrite()
		}()
	}
	code, err := c.finish(ctx, ss, grace)
	s.Close()
	<-ss.done
	return code, execID, err
}

// session is a started exec session whose stream is being demultiplexed.
type session struct {
	id    string
	s     *ExecStream
	done  chan struct{} // closed when Demux has returned
	err   error         // Demux's error, once done is closed
	stdin bool          // stdin is being copied to the stream
}

// finish waits for the session's end and returns its exit status: first
// the stream's end, then the session's inspect, until it no longer runs.
func (c *Client) finish(ctx context.Context, ss *session, grace time.Duration) (int, error) {
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
			drained = true
		case <-hang:
			drained = true // the process is gone; what holds its stream is not waited for
		case <-ctx.Done():
			return -1, ctx.Err()
		case <-poll.C:
			if c.exited(ctx, ss.id) {
				hang = time.After(grace)
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
