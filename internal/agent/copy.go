package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/podvm/podvm/internal/agent/wire"
)

// A copy restored from a checkpoint holds the agent as it was at the
// checkpoint: frozen, with the original's runs. Its client is a new one,
// which takes over the runs it is told to keep (the processes the
// original held by handle) and leaves the others (the original's Runs in
// flight, its connections) to die unheard.

// Adoption is a run of the original's client that a copy's client takes
// over: its run id and pid there, and where its streams go from now on.
type Adoption struct {
	ID             uint32
	PID            int
	Stdin          io.Reader // nil: none is sent, and the run's stdin stays as it was
	Stdout, Stderr io.Writer // nil: discarded
}

// ID is the run's id on the channel, for [Adoption].
func (p *Proc) ID() uint32 { return p.r.id }

// NextRun is the id after every run this client has begun: a copy's
// client begins its own runs from there, clear of the runs its agent
// still holds.
func (c *Client) NextRun() uint32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.next + 1
}

// ResumeCopy is [NewClient] for a copy restored from a checkpoint taken
// while its agent was frozen ([Client.Freeze]): on rw, the copy's own
// stream, it resumes the agent, adopts the runs in adopt and returns
// their handles, in adopt's order. Every other run of the agent's is
// killed there, unheard; an adopted run that had ended by the checkpoint
// ends at once, its Wait reporting [ErrLost]. next is the original
// client's [Client.NextRun]. The client owns rw; when the handshake
// fails or ctx ends first, rw is closed.
func ResumeCopy(ctx context.Context, rw io.ReadWriteCloser, next uint32, adopt []Adoption) (*Client, []*Proc, error) {
	keep := make([]uint32, len(adopt))
	seen := make(map[uint32]bool, len(adopt))
	for i, a := range adopt {
		if a.ID == 0 || a.ID >= next || seen[a.ID] {
			rw.Close()
			return nil, nil, fmt.Errorf("agent: resuming a copy: run %d cannot be adopted (runs before %d, each once)", a.ID, next)
		}
		seen[a.ID] = true
		keep[i] = a.ID
	}
	br := bufio.NewReaderSize(rw, 64<<10)
	stop := context.AfterFunc(ctx, func() { rw.Close() })
	err := wire.Write(rw, wire.Frame{Type: wire.Resume, Payload: wire.ResumeMsg{Fresh: true, Keep: keep}.Encode()})
	var h wire.HelloMsg
	if err == nil {
		h, err = handshake(br)
	}
	if !stop() {
		err = errors.Join(ctx.Err(), err)
	}
	if err != nil {
		rw.Close()
		return nil, nil, fmt.Errorf("agent: resuming a copy: %w", err)
	}
	c := newClient(rw, h)
	c.next = next - 1
	procs := make([]*Proc, len(adopt))
	for i, a := range adopt {
		r := c.newRun(a.Stdout, a.Stderr)
		r.id, r.pid = a.ID, a.PID
		close(r.started)
		c.runs[r.id] = r
		procs[i] = &Proc{r: r}
	}
	go c.demux(br, c.demuxDone)
	for i, a := range adopt {
		r := procs[i].r
		go r.out[0].deliver()
		go r.out[1].deliver()
		if a.Stdin != nil {
			go r.copyStdin(a.Stdin)
		}
	}
	return c, procs, nil
}
