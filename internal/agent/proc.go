package agent

import (
	"context"
	"fmt"
	"io"
	"syscall"

	"github.com/podvm/podvm/internal/agent/wire"
)

// Proc is a run held by handle: started with [Client.Start], it lives
// until its command exits, it is killed, or the channel ends. Its methods
// are safe for concurrent use.
type Proc struct {
	r *clientRun
}

// Start is [Client.Run] that returns once the command has started, with
// a handle on the run: the same request, streams and start failures. ctx
// bounds the start alone: a run whose start ctx cut short is killed, and
// Start returns ctx's error. The run's output goes to stdout and stderr
// as it comes (a slow Writer holds its own stream back, as in Run).
func (c *Client) Start(ctx context.Context, req Request, stdin io.Reader, stdout, stderr io.Writer) (*Proc, error) {
	if err := validate(req); err != nil {
		return nil, err
	}
	r, err := c.begin(ctx, startFrame(req), stdin, stdout, stderr)
	if err != nil {
		return nil, err
	}
	if err := r.waitStarted(ctx); err != nil {
		return nil, err
	}
	return &Proc{r: r}, nil
}

// waitStarted waits for the run's Started and returns nil, or how it
// ended before: a start failure (the agent's Exit says which), the
// channel's end, or ctx's, after which the run is killed.
func (r *clientRun) waitStarted(ctx context.Context) error {
	select {
	case <-r.started:
		return nil
	case <-r.ended:
		select {
		case <-r.started: // it started, and ended already
			return nil
		default:
		}
		_, err := r.wait(nil)
		if err == nil {
			err = fmt.Errorf("%w: the run ended before it started", wire.ErrProtocol)
		}
		return err
	case <-ctx.Done():
		_ = r.c.send(wire.Frame{Type: wire.Kill, ID: r.id})
		_, err := r.stopped(ctx.Err())
		return err
	}
}

// PID is the command's pid in the sandbox, which is also its process
// group's.
func (p *Proc) PID() int {
	p.r.mu.Lock()
	defer p.r.mu.Unlock()
	return p.r.pid
}

// Done is closed once the run has ended, or the channel did.
func (p *Proc) Done() <-chan struct{} { return p.r.ended }

// Signal sends sig to the command's process group: the command and what
// it started, but for processes that left the group. It fails at once
// once the channel has ended; a signal to a run that has ended is
// dropped.
func (p *Proc) Signal(sig syscall.Signal) error {
	if sig <= 0 || sig > 64 {
		return fmt.Errorf("agent: signal %d: want 1 to 64", int(sig))
	}
	m := wire.SignalMsg{Signo: uint8(sig)}
	return p.r.c.send(wire.Frame{Type: wire.Signal, ID: p.r.id, Payload: m.Encode()})
}

// Resize sets the size of the run's terminal (Request.TTY); the command
// gets SIGWINCH. It is dropped for a run without one.
func (p *Proc) Resize(rows, cols uint16) error {
	m := wire.ResizeMsg{Rows: rows, Cols: cols}
	return p.r.c.send(wire.Frame{Type: wire.Resize, ID: p.r.id, Payload: m.Encode()})
}

// Kill kills every process of the run, as Run does when its context
// ends; [Proc.Wait] then reports the run killed.
func (p *Proc) Kill() error {
	select {
	case <-p.r.exited:
		return nil
	default:
	}
	return p.r.c.send(wire.Frame{Type: wire.Kill, ID: p.r.id})
}

// Wait waits for the run's end and returns it as [Client.Run] does, once
// its output has been handed to its Writers. When ctx ends first, Wait
// returns ctx's error and the run goes on: Wait may be called again. A
// channel that ended fails it with [ErrChannelClosed] at once.
func (p *Proc) Wait(ctx context.Context) (Exit, error) {
	select {
	case <-p.r.ended:
	case <-ctx.Done():
		return Exit{Code: -1, Started: true}, ctx.Err()
	}
	done := make(chan struct{})
	go func() {
		<-p.r.out[0].done
		<-p.r.out[1].done
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return Exit{Code: -1, Started: true}, ctx.Err()
	}
	return p.r.wait(nil)
}
