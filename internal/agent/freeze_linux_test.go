package agent

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/agent/wire"
	"github.com/podvm/podvm/internal/testkit"
)

// While frozen the agent sends nothing: a run that ends in the sandbox
// meanwhile reports its exit only after Thaw, with its output whole.
func TestFreezeHoldsFramesUntilThaw(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := context.Background()
	g := newFileGate(t)
	ended := make(chan result, 1)
	go func() { ended <- a.sh(ctx, g.cmd("run", "echo done")) }()
	g.started(t, "run")
	require.NoError(t, a.freeze(ctx))
	g.open(t) // the command ends, frozen, however slow the machine
	select {
	case r := <-ended:
		t.Fatalf("the run's end came through a frozen channel: %+v", r)
	case <-time.After(1500 * time.Millisecond): // its command has ended
	}
	require.NoError(t, a.Thaw())
	select {
	case r := <-ended:
		require.NoError(t, r.err)
		assert.Equal(t, 0, r.Code)
		assert.Equal(t, "done\n", r.stdout)
	case <-time.After(10 * time.Second):
		t.Fatal("the run did not end after Thaw")
	}
	assert.Equal(t, "hi\n", a.sh(ctx, "echo hi").stdout, "a run after Thaw")
}

// Freezes in the middle of a stream many windows long, both ways (the
// run's stdin echoed back), lose and repeat nothing.
func TestFreezeMidStreamLosesNothing(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := context.Background()
	in := make([]byte, 16<<20)
	_, _ = rand.Read(in)
	ended := make(chan result, 1)
	go func() { ended <- a.run(ctx, Request{Argv: []string{"cat"}}, bytes.NewReader(in)) }()
	deadline := time.After(time.Minute)
	for freezes := 0; ; freezes++ {
		select {
		case r := <-ended:
			require.NoError(t, r.err)
			assert.Equal(t, 0, r.Code)
			assert.True(t, r.stdout == string(in), "stdout is stdin: %d bytes of %d", len(r.stdout), len(in))
			assert.Positive(t, freezes, "frozen while it streamed")
			return
		case <-deadline:
			t.Fatalf("the stream did not end, after %d freezes", freezes)
		default:
		}
		require.NoError(t, a.freeze(ctx), "freeze %d", freezes)
		time.Sleep(5 * time.Millisecond)
		require.NoError(t, a.Thaw(), "thaw %d", freezes)
		time.Sleep(5 * time.Millisecond)
	}
}

// Freeze and Thaw in the wrong order are errors, and change nothing.
func TestFreezeMisuse(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := context.Background()
	assert.Error(t, a.Thaw(), "Thaw without Freeze")
	require.NoError(t, a.freeze(ctx))
	assert.Error(t, a.freeze(ctx), "Freeze twice")
	require.NoError(t, a.Thaw())
	assert.Equal(t, "hi\n", a.sh(ctx, "echo hi").stdout)
}

// A frozen agent takes nothing but Thaw: another frame ends the channel,
// and a channel that ends while frozen ends its runs (the harness checks
// that the agent exits).
func TestFrozenAgentRefusesFrames(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := context.Background()
	ended := make(chan result, 1)
	go func() { ended <- a.sh(ctx, "sleep 100") }()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, a.freeze(ctx))
	require.NoError(t, a.write(wire.Frame{Type: wire.Kill, ID: 1}), "a frame the client would have held back")
	select {
	case <-a.Dead():
	case <-time.After(10 * time.Second):
		t.Fatal("the agent went on")
	}
	r := <-ended
	assert.True(t, errors.Is(r.err, ErrChannelClosed), "%v", r.err)
}

// A Freeze whose ctx ends before the agent answers leaves it thawed.
func TestFreezeCancelled(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, a.freeze(ctx), context.Canceled)
	assert.Equal(t, "hi\n", a.sh(context.Background(), "echo hi").stdout, "thawed once the agent answered")
	require.NoError(t, a.freeze(context.Background()))
	require.NoError(t, a.Thaw())
}

// relay stands between a client and the agent's stdio as conmon stands
// between podvm and a sandbox's agent: cut ends the client's stream and
// leaves the agent's as it is, and stream gives the same agent a new
// one, as a restored sandbox's new conmon does.
type relay struct {
	in io.Writer // the agent's stdin

	mu   sync.Mutex
	cond *sync.Cond
	out  *io.PipeWriter // to the current stream; nil between streams
	from *io.PipeReader // from it
}

// relayed starts an agent behind a relay, and returns both.
func relayed(t *testing.T) (*testAgent, *relay) {
	t.Helper()
	needAgent(t)
	r := &relay{}
	r.cond = sync.NewCond(&r.mu)
	a := startAgentVia(t, agentBin, func(out io.Reader, in io.Writer) io.ReadWriteCloser {
		r.in = in
		go r.pump(out)
		return r.stream()
	})
	return a, r
}

// pump carries the agent's output to whichever stream is current; it
// waits while there is none.
func (r *relay) pump(out io.Reader) {
	b := make([]byte, 64<<10)
	for {
		n, err := out.Read(b)
		if err != nil {
			r.mu.Lock()
			if r.out != nil {
				r.out.CloseWithError(err)
			}
			r.mu.Unlock()
			return
		}
		r.mu.Lock()
		for r.out == nil {
			r.cond.Wait()
		}
		w := r.out
		r.mu.Unlock()
		_, _ = w.Write(b[:n])
	}
}

// stream makes a new stream to the agent, current from now on.
func (r *relay) stream() io.ReadWriteCloser {
	outR, outW := io.Pipe()
	inR, inW := io.Pipe()
	go func() { _, _ = io.Copy(r.in, inR) }()
	r.mu.Lock()
	r.out, r.from = outW, inR
	r.cond.Broadcast()
	r.mu.Unlock()
	return &relayEnd{Reader: outR, Writer: inW, close: func() { outR.Close(); inW.Close() }}
}

// cut ends the current stream, as conmon's exit ends an attach.
func (r *relay) cut() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.out.Close()
	r.from.Close()
	r.out, r.from = nil, nil
}

type relayEnd struct {
	io.Reader
	io.Writer
	close func()
}

func (e *relayEnd) Close() error { e.close(); return nil }

// A client frozen, detached from a stream that ended and rebound to a
// new one goes on where it was: a process held by handle answers on the
// same handle, output made in between arrives once, on its own run, and
// new runs work.
func TestRebindGoesOnWhereItWas(t *testing.T) {
	t.Parallel()
	a, r := relayed(t)
	ctx := context.Background()
	var out testkit.LockedBuffer
	stdinR, stdinW := io.Pipe()
	p, err := a.Start(ctx, Request{Argv: []string{"sh", "-c", "while read l; do echo got $l; done"}}, stdinR, &out, io.Discard)
	require.NoError(t, err)
	g := newFileGate(t)
	late := make(chan result, 1)
	go func() { late <- a.sh(ctx, g.cmd("late", "echo late")) }()
	g.started(t, "late")
	_, _ = stdinW.Write([]byte("one\n"))
	require.Eventually(t, func() bool { return out.String() == "got one\n" }, 10*time.Second, 10*time.Millisecond)

	require.NoError(t, a.freeze(ctx))
	require.NoError(t, a.Detach())
	r.cut()
	<-a.reading() // the end of the stream, which is no failure
	assert.Error(t, a.Thaw(), "once its stream ended, a detached client thaws by Rebind alone")
	g.open(t)
	g.done(t, "late")
	time.Sleep(100 * time.Millisecond) // the late run ends in the sandbox, unheard
	select {
	case res := <-late:
		t.Fatalf("a run ended while detached: %+v", res)
	default:
	}
	require.NoError(t, a.Rebind(ctx, r.stream()))

	res := <-late
	require.NoError(t, res.err)
	assert.Equal(t, "late\n", res.stdout, "output held back, delivered once")
	_, _ = stdinW.Write([]byte("two\n"))
	require.Eventually(t, func() bool { return out.String() == "got one\ngot two\n" }, 10*time.Second, 10*time.Millisecond, "the same handle")
	assert.Equal(t, "hi\n", a.sh(ctx, "echo hi").stdout, "a new run")
	stdinW.Close()
	ex, err := p.Wait(ctx)
	require.NoError(t, err)
	assert.Equal(t, 0, ex.Code)
}

// Rebind refuses a client that is not detached, and a stream whose
// agent does not answer (ctx ends) leaves it detached for another try;
// Close ends a detached client's runs.
func TestRebindRefusals(t *testing.T) {
	t.Parallel()
	a, r := relayed(t)
	ctx := context.Background()
	idle, _ := io.Pipe()
	require.Error(t, a.Rebind(ctx, &relayEnd{Reader: idle, Writer: io.Discard, close: func() { idle.Close() }}), "not detached")
	require.Error(t, a.Detach(), "not frozen")
	require.NoError(t, a.freeze(ctx))
	require.NoError(t, a.Detach())
	require.NoError(t, a.Thaw(), "the stream did not end after all: the client stays on it")
	assert.Equal(t, "hi\n", a.sh(ctx, "echo hi").stdout)
	require.NoError(t, a.freeze(ctx))
	require.NoError(t, a.Detach())
	r.cut()

	silent, _ := io.Pipe() // a stream that never answers
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err := a.Rebind(sctx, &relayEnd{Reader: silent, Writer: io.Discard, close: func() { silent.Close() }})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, a.Rebind(ctx, r.stream()), "still detached: another try")
	assert.Equal(t, "hi\n", a.sh(ctx, "echo hi").stdout)

	require.NoError(t, a.freeze(ctx))
	require.NoError(t, a.Detach())
	r.cut()
	ended := make(chan error, 1)
	go func() { ended <- a.sh(ctx, "echo never").err }() // waits at the gate
	time.Sleep(100 * time.Millisecond)
	a.Close()
	select {
	case err := <-ended:
		assert.ErrorIs(t, err, ErrChannelClosed)
	case <-time.After(10 * time.Second):
		t.Fatal("a call waiting on a detached client outlived its Close")
	}
}

// A copy's client resumes the agent on the copy's stream and adopts the
// runs it keeps: a held process answers on its new handle, output held
// back at the checkpoint goes to the copy, a kept run that had ended is
// lost, the runs it does not keep die unheard (their frames would be
// for runs it never knew, a protocol error), and its own runs' ids stay
// clear of the agent's.
func TestResumeCopyAdoptsKeptRuns(t *testing.T) {
	t.Parallel()
	a, r := relayed(t)
	ctx := context.Background()
	held := `while read l; do echo got $l; done`
	var out testkit.LockedBuffer
	stdinR, stdinW := io.Pipe()
	defer stdinW.Close()
	kept, err := a.Start(ctx, Request{Argv: []string{"sh", "-c", held}}, stdinR, &out, io.Discard)
	require.NoError(t, err)
	dropR, dropW := io.Pipe()
	defer dropW.Close()
	pidFile := t.TempDir() + "/dropped"
	_, err = a.Start(ctx, Request{Argv: []string{"sh", "-c", "echo $$ > " + pidFile + "; " + held}}, dropR, io.Discard, io.Discard)
	require.NoError(t, err)
	ended, err := a.Start(ctx, Request{Argv: []string{"true"}}, nil, io.Discard, io.Discard)
	require.NoError(t, err)
	_, err = ended.Wait(ctx)
	require.NoError(t, err)
	go func() { _ = a.sh(ctx, "sleep 0.3; echo late") }() // in flight
	_, _ = stdinW.Write([]byte("one\n"))
	require.Eventually(t, func() bool { return out.String() == "got one\n" }, 10*time.Second, 10*time.Millisecond)

	require.NoError(t, a.freeze(ctx))
	require.NoError(t, a.Detach())
	next := a.NextRun()
	r.cut()
	<-a.reading()
	_, _, err = ResumeCopy(ctx, &relayEnd{Reader: bytes.NewReader(nil), Writer: io.Discard, close: func() {}}, next, []Adoption{{ID: next}})
	require.Error(t, err, "a run the original never began")

	var out2 testkit.LockedBuffer
	stdin2R, stdin2W := io.Pipe()
	c, procs, err := ResumeCopy(ctx, r.stream(), next, []Adoption{
		{ID: kept.ID(), PID: kept.PID(), Stdin: stdin2R, Stdout: &out2},
		{ID: ended.ID(), PID: ended.PID()},
	})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.Len(t, procs, 2)
	assert.Equal(t, kept.PID(), procs[0].PID())

	_, err = procs[1].Wait(ctx)
	require.ErrorIs(t, err, ErrLost, "a kept run that had ended")
	_, _ = stdin2W.Write([]byte("two\n"))
	require.Eventually(t, func() bool { return out2.String() == "got two\n" }, 10*time.Second, 10*time.Millisecond, "the adopted handle")
	assert.Equal(t, "got one\n", out.String(), "the original's handle hears nothing of the copy")
	time.Sleep(500 * time.Millisecond) // the dropped and in-flight runs end, unheard
	ca := &testAgent{Client: c}
	for range 3 {
		assert.Equal(t, "hi\n", ca.sh(ctx, "echo hi").stdout, "new runs, ids clear of the agent's")
	}
	res := ca.sh(ctx, `kill -0 $(cat $1) 2>/dev/null && echo alive || echo dead`, pidFile)
	assert.Equal(t, "dead\n", res.stdout, "a run not kept is killed")
	require.NoError(t, procs[0].Kill())
	ex, err := procs[0].Wait(ctx)
	require.NoError(t, err)
	assert.True(t, ex.Killed)
}

// freeze is Freeze without what the agent found.
func (a *testAgent) freeze(ctx context.Context) error {
	_, err := a.Freeze(ctx)
	return err
}

// Frozen names the TCP sockets of the sandbox's processes, and who holds
// them: what a dump may fail on.
func TestFrozenNamesTCPSockets(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := context.Background()
	l, err := a.Start(ctx, Request{Argv: []string{"/bin/busybox", "nc", "-l", "-p", "38917"}}, nil, io.Discard, io.Discard)
	require.NoError(t, err)
	defer l.Kill()
	holder := fmt.Sprintf("pid %d (busybox) listening on ", l.PID())
	var last []string
	require.Eventually(t, func() bool {
		f, err := a.Freeze(ctx)
		require.NoError(t, err)
		require.NoError(t, a.Thaw())
		last = f.TCP
		return slices.ContainsFunc(f.TCP, func(s string) bool { return strings.HasPrefix(s, holder) && strings.HasSuffix(s, ":38917") })
	}, 10*time.Second, 50*time.Millisecond, "want %q…:38917 in %q", holder, last)
}

// Runs that end while the agent is frozen, their Exit held back: one the
// copy keeps reports its real end, one it does not is never heard of
// (an Exit for a run the copy's client never knew would end its channel).
func TestResumeCopyRunsEndedWhileFrozen(t *testing.T) {
	t.Parallel()
	a, r := relayed(t)
	ctx := context.Background()
	g := newFileGate(t)
	kept, err := a.Start(ctx, Request{Argv: []string{"sh", "-c", g.cmd("kept", "")}}, nil, io.Discard, io.Discard)
	require.NoError(t, err)
	go func() { _ = a.sh(ctx, g.cmd("flight", "")) }() // silent, in flight
	g.started(t, "kept")
	g.started(t, "flight")
	require.NoError(t, a.freeze(ctx))
	require.NoError(t, a.Detach())
	next := a.NextRun()
	r.cut()
	<-a.reading()
	g.open(t) // both end now, frozen: their Exits held at the gate
	g.done(t, "kept")
	g.done(t, "flight")
	time.Sleep(100 * time.Millisecond)

	c, procs, err := ResumeCopy(ctx, r.stream(), next, []Adoption{{ID: kept.ID(), PID: kept.PID()}})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	ex, err := procs[0].Wait(ctx)
	require.NoError(t, err, "its real end, not lost")
	assert.Equal(t, 0, ex.Code)
	time.Sleep(100 * time.Millisecond)
	assert.Equal(t, "hi\n", (&testAgent{Client: c}).sh(ctx, "echo hi").stdout, "the channel lives")
}

// A frame charged to a window but held at the gate counts against the
// copy's fresh window: the agent never sends the copy's client more than
// a window it has not read (its client would fail "overran a window").
func TestResumeCopyWindowHoldsHeldFrames(t *testing.T) {
	t.Parallel()
	for i := range 5 { // the freeze must catch a frame on its way: try a few
		a, r := relayed(t)
		ctx := context.Background()
		p, err := a.Start(ctx, Request{Argv: []string{"sh", "-c", "cat /dev/zero"}}, nil, io.Discard, io.Discard)
		require.NoError(t, err)
		time.Sleep(100 * time.Millisecond) // streaming
		require.NoError(t, a.freeze(ctx))
		require.NoError(t, a.Detach())
		next := a.NextRun()
		r.cut()
		<-a.reading()

		slow := &gatedWriter{gate: make(chan struct{})} // the copy's reader takes nothing
		c, _, err := ResumeCopy(ctx, r.stream(), next, []Adoption{{ID: p.ID(), PID: p.PID(), Stdout: slow}})
		require.NoError(t, err)
		time.Sleep(300 * time.Millisecond) // a window's worth arrives, and no more
		select {
		case <-c.dead:
			t.Fatalf("try %d: the copy's channel died: %v", i, c.err)
		default:
		}
		close(slow.gate)
		c.Close()
	}
}

// gatedWriter blocks every Write until gate is closed.
type gatedWriter struct{ gate chan struct{} }

func (w *gatedWriter) Write(p []byte) (int, error) { <-w.gate; return len(p), nil }

// fileGate holds commands until the test opens it: a run that ends when
// the test says, not after a guess at how slow the machine is (the agent
// of these tests runs on this host, in its file system).
type fileGate struct{ dir string }

func newFileGate(t *testing.T) fileGate { return fileGate{t.TempDir()} }

// cmd is a shell command that says it started (as name), waits for the
// gate to open, runs then, and says it is done.
func (g fileGate) cmd(name, then string) string {
	p := filepath.Join(g.dir, name)
	return fmt.Sprintf("touch %s.started; while [ ! -e %s ]; do sleep 0.01; done; %s; touch %s.done",
		p, filepath.Join(g.dir, "open"), cmp.Or(then, ":"), p)
}

// started waits until the command name has started.
func (g fileGate) started(t *testing.T, name string) { g.wait(t, name+".started") }

// done waits until the command name is past the gate, and done.
func (g fileGate) done(t *testing.T, name string) { g.wait(t, name+".done") }

// open lets every command through.
func (g fileGate) open(t *testing.T) {
	require.NoError(t, os.WriteFile(filepath.Join(g.dir, "open"), nil, 0o600))
}

func (g fileGate) wait(t *testing.T, file string) {
	t.Helper()
	require.Eventually(t, func() bool { _, err := os.Stat(filepath.Join(g.dir, file)); return err == nil },
		30*time.Second, 5*time.Millisecond, "%s", file)
}
