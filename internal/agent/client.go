package agent

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/agent/wire"
)

// Errors of the client. Start failures also wrap [exec.ErrNotFound],
// [exec.ErrPermission] and [exec.ErrDirNotFound].
var (
	// ErrChannelClosed reports that the channel to the agent ended or
	// failed: every run in flight fails with it, and so does every
	// later call.
	ErrChannelClosed = errors.New("agent: channel closed")
	// ErrUnknownUser reports a Request.User the sandbox does not know.
	ErrUnknownUser = errors.New("agent: unknown user")
	// ErrLost reports a run whose supervising shim died (something
	// inside the sandbox killed it); its processes were killed.
	ErrLost = errors.New("agent: run lost")
	// ErrNotKilled reports that the agent could not confirm that every
	// process of a run is dead.
	ErrNotKilled = errors.New("agent: processes of the run may survive")
	// ErrVersion reports an agent speaking another protocol version.
	ErrVersion = errors.New("agent: unsupported protocol version")
)

// KillWait bounds how long Run waits, after its context ended, for the
// agent's report that every process of the run is dead.
const KillWait = 5 * time.Second

// StopDrain bounds how long Run, once the agent reported a stopped run
// dead, takes to hand the caller's Writers what arrived before the
// report (a slow Writer holds it); what is left then is dropped.
const StopDrain = time.Second

// Request is one command for the agent to run.
type Request struct {
	// Argv is the command and its arguments; Argv[0] is looked up in the
	// PATH of the merged environment unless it contains a slash. Every
	// string may hold any bytes except NUL.
	Argv []string
	// Env holds KEY=VALUE entries merged over the agent's environment
	// (the container's); an entry here wins. Nil adds nothing.
	Env []string
	// Dir is the working directory; empty means the agent's (the
	// container's workdir).
	Dir string
	// User is "name", "uid", "uid:gid" or "name:group", resolved with the
	// sandbox's /etc/passwd and /etc/group; empty means the agent's user.
	User string
	// TTY runs the command on a new pseudo-terminal of Rows×Cols (24×80
	// when zero), its controlling terminal in a session of its own: its
	// stdin, stdout and stderr are the terminal, whose output is the
	// run's stdout (no stderr comes). Its stdin's end is the terminal's
	// EOF character (^D), written as any other byte.
	TTY        bool
	Rows, Cols uint16
}

// Exit is how a run ended.
type Exit struct {
	// Code is the exit status, 128+signal when a signal ended the
	// command, and -1 when it is not known (start failure, lost run).
	Code int
	// Killed is set when the run was killed because its context ended.
	Killed bool
	// Leftovers counts the processes still alive when the command
	// exited; the agent killed them.
	Leftovers int
	// Usage is what the kernel accounted for every process of the run.
	Usage exec.Usage
	// Started is set once the run was sent to the agent: the command
	// may have run.
	Started bool
	// Reported is set when the agent reported the run's end: Code and
	// Usage are what it said, not unknown.
	Reported bool
}

// Info is the agent's view of itself, from its handshake.
type Info struct {
	Version       int
	PID, UID, GID int
	Arch          string // GOARCH of the agent
	GoVersion     string // the Go release that built it
	Dir           string // its working directory, a run's default
}

// Client runs commands through one agent over one channel. Its methods
// are safe for concurrent use.
type Client struct {
	rwMu sync.Mutex // guards rw against Rebind's replacing it, for fail
	rw   io.ReadWriteCloser
	info Info

	gate     sendGate   // holds sends back while the agent is frozen
	freezeMu sync.Mutex // one Freeze or Thaw at a time; guards isFrozen
	isFrozen bool
	wmu      sync.Mutex // serializes frames on rw
	wbuf     []byte     // the frames of one send, reused under wmu

	mu   sync.Mutex
	runs map[uint32]*clientRun
	next uint32
	bye  chan wire.ByeMsg
	// Answers are taken only when asked for: an agent that sends them
	// unasked cannot have a later Shutdown or Listen take a stale one.
	byeAsked    atomic.Bool         // Shutdown sent: a Bye may come
	listenAsked atomic.Int32        // Listens sent whose Listening has not come
	frozenAsked atomic.Bool         // Freeze sent: its Frozen may come
	frozenAns   chan wire.FrozenMsg // Frozen came

	listenMu  sync.Mutex // one Listen at a time
	listening chan wire.ListeningMsg

	dead     chan struct{} // closed once the channel is unusable
	err      error         // why, set before dead is closed
	failOnce sync.Once
	// detaching: Detach ended the stream, whose end is no failure; the
	// runs wait for Rebind.
	detaching atomic.Bool
	demuxMu   sync.Mutex
	demuxDone chan struct{} // closed once the current stream's reading stopped
}

// NewClient reads the agent's handshake from rw and returns a client that
// owns rw: it closes it on [Client.Close] or when the channel fails.
// NewClient blocks until the handshake arrives; closing rw unblocks it.
// Closing rw must also unblock a pending Read (true of pipes and
// network connections).
func NewClient(rw io.ReadWriteCloser) (*Client, error) {
	br := bufio.NewReaderSize(rw, 64<<10)
	h, err := handshake(br)
	if err != nil {
		rw.Close()
		return nil, err
	}
	c := newClient(rw, h)
	go c.demux(br, c.demuxDone)
	return c, nil
}

// newClient is a client on rw, whose agent said h, not reading yet.
func newClient(rw io.ReadWriteCloser, h wire.HelloMsg) *Client {
	c := &Client{
		rw:   rw,
		info: Info{Version: int(h.Version), PID: int(h.PID), UID: int(h.UID), GID: int(h.GID), Arch: h.Arch, GoVersion: h.GoVersion, Dir: h.Dir},
		runs: map[uint32]*clientRun{}, bye: make(chan wire.ByeMsg, 1), listening: make(chan wire.ListeningMsg, 1), frozenAns: make(chan wire.FrozenMsg, 1),
		dead: make(chan struct{}), demuxDone: make(chan struct{}),
	}
	c.gate.idle.L = &c.gate.mu
	return c
}

// handshake reads the agent's Hello, of this client's version.
func handshake(br *bufio.Reader) (wire.HelloMsg, error) {
	f, err := wire.Read(br)
	if err != nil {
		return wire.HelloMsg{}, fmt.Errorf("%w: reading the handshake: %w", ErrChannelClosed, err)
	}
	h, err := wire.DecodeHello(f.Payload)
	if err == nil && f.Type != wire.Hello {
		err = fmt.Errorf("%w: first frame of type %d", wire.ErrProtocol, f.Type)
	}
	if err != nil {
		return h, err
	}
	if h.Version != wire.Version {
		return h, fmt.Errorf("%w: %d (this client speaks %d)", ErrVersion, h.Version, wire.Version)
	}
	return h, nil
}

// Info returns the agent's handshake.
func (c *Client) Info() Info { return c.info }

// Close closes the channel. Runs in flight fail with [ErrChannelClosed];
// the agent of a stdio channel then kills everything and exits. Close
// returns once the client's own goroutines are gone (a run's delivery to
// a Writer still blocked in Write ends when that Write returns).
func (c *Client) Close() error {
	c.fail(errors.New("closed by the client"))
	<-c.reading()
	c.endRuns() // a detached client's: no reading of frames ended them
	return nil
}

// reading returns what is closed once the current stream's reading
// stopped.
func (c *Client) reading() <-chan struct{} {
	c.demuxMu.Lock()
	defer c.demuxMu.Unlock()
	return c.demuxDone
}

// Shutdown asks the agent to kill every run and exit, and waits for its
// report that all is dead; it returns [ErrNotKilled] if the agent says
// otherwise. The channel is closed afterwards.
func (c *Client) Shutdown(ctx context.Context) error {
	defer c.Close()
	c.byeAsked.Store(true)
	if err := c.send(wire.Frame{Type: wire.Shutdown}); err != nil {
		return err
	}
	select {
	case m := <-c.bye:
		if !m.OK {
			return fmt.Errorf("%w: %s", ErrNotKilled, m.Msg)
		}
		return nil
	case <-c.dead:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Listening is what [Client.Listen] answers: the port the agent serves
// channels on, and the sandbox's own addresses (global unicast, on its
// interfaces that are up), which may name the one a caller reaches it
// at before the engine does.
type Listening struct {
	Port  int
	Addrs []netip.Addr
}

// Listen asks the agent to serve more channels on TCP port port (0: one
// the kernel picks; see [PeerPort]) of the sandbox's network, each a
// connection that proves it holds key (package psk, [DialPeer]), and
// returns the port, with the sandbox's addresses. The agent listens
// once: a second Listen fails.
func (c *Client) Listen(ctx context.Context, key []byte, port int) (Listening, error) {
	if port < 0 || port > 65535 {
		return Listening{}, fmt.Errorf("agent: listening for channels: port %d", port)
	}
	c.listenMu.Lock()
	c.listenAsked.Add(1)
	if err := c.send(wire.Frame{Type: wire.Listen, Payload: wire.ListenMsg{Key: key, Port: uint16(port)}.Encode()}); err != nil {
		c.listenMu.Unlock()
		return Listening{}, err
	}
	select {
	case m := <-c.listening:
		c.listenMu.Unlock()
		if m.Err != "" {
			return Listening{}, fmt.Errorf("agent: listening for channels: %s", m.Err)
		}
		l := Listening{Port: int(m.Port), Addrs: make([]netip.Addr, len(m.Addrs))}
		for i, a := range m.Addrs {
			var err error
			if l.Addrs[i], err = netip.ParseAddr(a); err != nil {
				return Listening{}, fmt.Errorf("%w: listening for channels: the agent's address %q", wire.ErrProtocol, a)
			}
		}
		return l, nil
	case <-c.dead:
		c.listenMu.Unlock()
		return Listening{}, c.err
	case <-ctx.Done():
		// Its answer is still to come: taken here, it is never mistaken
		// for the next Listen's.
		go func() {
			defer c.listenMu.Unlock()
			select {
			case <-c.listening:
			case <-c.dead:
			}
		}()
		return Listening{}, ctx.Err()
	}
}

// Freeze stops the channel at a frame boundary for a checkpoint: once
// it returns, the agent has sent its last frame before [Client.Thaw]
// and the client has read everything before it, and until Thaw the
// client sends nothing. Every call that would send waits, whatever its
// ctx, until Thaw, [Client.Rebind] or the channel's end (Close): a
// Run's start, its stdin and a Kill when its ctx ends, a Dial, a
// Listen, the credit that lets more output come. A freeze is meant to
// last as long as a checkpoint. Runs go on in the sandbox; their output
// waits in their pipes. When ctx ends or the channel fails first, the
// agent is thawed as soon as it answers, and Freeze returns the error.
// A second Freeze before Thaw is an error. Freeze returns what the
// agent found that a checkpoint may not carry.
func (c *Client) Freeze(ctx context.Context) (Frozen, error) {
	c.freezeMu.Lock()
	defer c.freezeMu.Unlock()
	if c.isFrozen {
		return Frozen{}, errors.New("agent: freezing: already frozen")
	}
	if err := ctx.Err(); err != nil {
		return Frozen{}, err
	}
	c.gate.shut()
	c.frozenAsked.Store(true)
	if err := c.write(wire.Frame{Type: wire.Freeze}); err != nil {
		c.gate.open()
		return Frozen{}, err
	}
	select {
	case m := <-c.frozenAns:
		if err := ctx.Err(); err != nil { // it ended too: not frozen after all
			_ = c.write(wire.Frame{Type: wire.Thaw})
			c.gate.open()
			return Frozen{}, err
		}
		c.isFrozen = true
		return Frozen(m), nil
	case <-c.dead:
		c.gate.open()
		return Frozen{}, c.err
	case <-ctx.Done():
		go func() { // its Frozen is still to come: thaw it then
			defer c.gate.open()
			select {
			case <-c.frozenAns:
				_ = c.write(wire.Frame{Type: wire.Thaw})
			case <-c.dead:
			}
		}()
		return Frozen{}, ctx.Err()
	}
}

// Frozen is what a frozen agent found in the sandbox that a checkpoint
// may not carry: TCP lists its TCP sockets, each with the processes
// that hold it ("pid 12 (nc) listening on 0.0.0.0:8080").
type Frozen struct {
	TCP []string
}

// Thaw lets a frozen channel go on: the agent sends again, and calls
// that waited send. Thaw without a Freeze is an error.
func (c *Client) Thaw() error {
	c.freezeMu.Lock()
	defer c.freezeMu.Unlock()
	if !c.isFrozen {
		return errors.New("agent: thawing: not frozen")
	}
	if c.detaching.Load() {
		select {
		case <-c.reading():
			return errors.New("agent: thawing: the stream ended (Rebind thaws)")
		default: // it goes on: stay on it
			c.detaching.Store(false)
		}
	}
	c.isFrozen = false
	defer c.gate.open()
	return c.write(wire.Frame{Type: wire.Thaw})
}

// Detach tells a frozen client that its stream is about to end, as a
// checkpoint that stops the sandbox ends it (the stream stays open until
// then: on Podman, the agent's stdin closing would end the sandbox):
// that end is no failure. The runs, held processes and their handles,
// and every call waiting to send, wait for [Client.Rebind], or for
// [Client.Thaw] while the stream has not ended after all; [Client.Close]
// ends them. Detach is an error unless frozen.
func (c *Client) Detach() error {
	c.freezeMu.Lock()
	defer c.freezeMu.Unlock()
	if !c.isFrozen {
		return errors.New("agent: detaching: not frozen")
	}
	c.detaching.Store(true)
	return nil
}

// Rebind moves a detached client to rw, a new stream to the same agent
// (a restored sandbox's), once the old one has ended, and thaws it: the
// agent answers Resume with its handshake, then sends what it held back,
// and the runs go on. When the old stream does not end, the handshake
// fails or ctx ends first, rw is closed and the client stays detached,
// for another Rebind or Close. The client owns rw.
func (c *Client) Rebind(ctx context.Context, rw io.ReadWriteCloser) error {
	c.freezeMu.Lock()
	defer c.freezeMu.Unlock()
	if !c.isFrozen || !c.detaching.Load() {
		rw.Close()
		return errors.New("agent: rebinding: not detached")
	}
	select {
	case <-c.reading():
	case <-ctx.Done():
		rw.Close()
		return fmt.Errorf("agent: rebinding: the old stream has not ended: %w", ctx.Err())
	}
	select {
	case <-c.dead:
		rw.Close()
		return c.err
	default:
	}
	br := bufio.NewReaderSize(rw, 64<<10)
	stop := context.AfterFunc(ctx, func() { rw.Close() })
	err := wire.Write(rw, wire.Frame{Type: wire.Resume})
	if err == nil {
		_, err = handshake(br)
	}
	if !stop() {
		err = ctx.Err()
	}
	if err != nil {
		rw.Close()
		return fmt.Errorf("agent: rebinding: %w", err)
	}
	c.wmu.Lock() // no send holds it: they wait at the gate
	c.rwMu.Lock()
	old := c.rw
	c.rw = rw
	select {
	case <-c.dead: // Close came meanwhile, and closed the old stream
		c.rwMu.Unlock()
		c.wmu.Unlock()
		rw.Close()
		return c.err
	default:
	}
	c.rwMu.Unlock()
	c.wmu.Unlock()
	old.Close() // ended: what is left of it
	done := make(chan struct{})
	c.demuxMu.Lock()
	c.demuxDone = done
	c.demuxMu.Unlock()
	c.detaching.Store(false)
	go c.demux(br, done)
	c.isFrozen = false
	c.gate.open()
	return nil
}

func (c *Client) fail(cause error) {
	c.failOnce.Do(func() {
		c.err = fmt.Errorf("%w: %v", ErrChannelClosed, cause)
		close(c.dead)
		c.rwMu.Lock()
		rw := c.rw
		c.rwMu.Unlock()
		rw.Close()
	})
}

// send writes frames in one Write call, once the agent is not frozen (it
// waits for [Client.Thaw], or the channel's failure). The write may
// block, holding the others back, only as long as the channel itself
// does: the agent reads every frame at once, whatever a run's consumer
// does (see Flow control in the package documentation).
func (c *Client) send(frames ...wire.Frame) error {
	if !c.gate.enter(c.dead) {
		return c.err
	}
	defer c.gate.leave()
	return c.write(frames...)
}

// write is send, frozen or not.
func (c *Client) write(frames ...wire.Frame) error {
	for _, f := range frames {
		if len(f.Payload) > wire.MaxPayload {
			return fmt.Errorf("%w: payload of %d bytes", wire.ErrProtocol, len(f.Payload))
		}
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	select {
	case <-c.dead:
		return c.err
	default:
	}
	b := c.wbuf[:0]
	for _, f := range frames {
		b = f.Append(b)
	}
	// Keep the buffer that carries data frames (append rounds its size
	// up past a chunk's frame), never a rare big one.
	if cap(b) <= 2*(wire.HeaderSize+wire.ChunkSize) {
		c.wbuf = b
	}
	if _, err := c.rw.Write(b); err != nil {
		c.fail(err)
		return c.err
	}
	return nil
}

// demux reads every frame and hands it to its run without ever blocking
// on a run's consumer: each stream holds at most its window.
func (c *Client) demux(br *bufio.Reader, done chan struct{}) {
	defer close(done)
	for {
		f, err := wire.ReadStream(br)
		if err != nil {
			if c.detaching.Load() {
				return // Detach ended the stream: the runs wait for Rebind
			}
			c.fail(err)
			break
		}
		if err := c.route(f); err != nil {
			c.fail(err)
			break
		}
	}
	c.endRuns()
}

// endRuns ends every run: the channel failed.
func (c *Client) endRuns() {
	c.mu.Lock()
	runs := c.runs
	c.runs = map[uint32]*clientRun{}
	c.mu.Unlock()
	for _, r := range runs {
		r.end()
	}
}

func (c *Client) route(f wire.Frame) error {
	if f.Type == wire.Bye {
		m, err := wire.DecodeBye(f.Payload)
		if err != nil {
			return err
		}
		if !c.byeAsked.Load() {
			return fmt.Errorf("%w: a Bye before a Shutdown", wire.ErrProtocol)
		}
		select {
		case c.bye <- m: // the agent's last frame, which Shutdown waits for
			return nil
		default: // never block the reading of frames, whatever the agent sends
			return fmt.Errorf("%w: a second Bye", wire.ErrProtocol)
		}
	}
	if f.Type == wire.Frozen {
		if !c.frozenAsked.CompareAndSwap(true, false) {
			return fmt.Errorf("%w: a Frozen frame nobody asked for", wire.ErrProtocol)
		}
		m, err := wire.DecodeFrozen(f.Payload)
		if err != nil {
			return err
		}
		select {
		case c.frozenAns <- m: // what the one Freeze in flight waits for
			return nil
		default: // never block the reading of frames
			return fmt.Errorf("%w: a second Frozen", wire.ErrProtocol)
		}
	}
	if f.Type == wire.Listening {
		m, err := wire.DecodeListening(f.Payload)
		if err != nil {
			return err
		}
		if c.listenAsked.Add(-1) < 0 {
			return fmt.Errorf("%w: a Listening frame nobody asked for", wire.ErrProtocol)
		}
		select {
		case c.listening <- m:
			return nil
		default:
			return fmt.Errorf("%w: a Listening frame nobody asked for", wire.ErrProtocol)
		}
	}
	c.mu.Lock()
	r := c.runs[f.ID]
	if f.Type == wire.Exit {
		delete(c.runs, f.ID)
	}
	c.mu.Unlock()
	if r == nil {
		if f.Type == wire.Credit {
			return nil // stdin credit may trail its run's Exit
		}
		return fmt.Errorf("%w: frame type %d for unknown run %d", wire.ErrProtocol, f.Type, f.ID)
	}
	switch f.Type {
	case wire.Stdout, wire.Stderr:
		s := &r.out[0]
		if f.Type == wire.Stderr {
			s = &r.out[1]
		}
		return s.push(f.Payload)
	case wire.Credit:
		m, err := wire.DecodeCredit(f.Payload)
		if err != nil || m.Stream != wire.StreamStdin {
			return fmt.Errorf("%w: bad credit", wire.ErrProtocol)
		}
		r.mu.Lock()
		r.stdinCredit += int64(m.N)
		r.cond.Broadcast()
		r.mu.Unlock()
	case wire.Started:
		m, err := wire.DecodeStarted(f.Payload)
		if err != nil {
			return err
		}
		select {
		case <-r.started:
			return fmt.Errorf("%w: run %d started twice", wire.ErrProtocol, f.ID)
		default:
		}
		r.mu.Lock()
		r.pid = int(m.PID)
		r.mu.Unlock()
		close(r.started)
	case wire.Exit:
		m, err := wire.DecodeExit(f.Payload)
		if err != nil {
			return err
		}
		r.exit = m
		close(r.exited)
		r.end()
	default:
		return fmt.Errorf("%w: frame type %d from the agent", wire.ErrProtocol, f.Type)
	}
	return nil
}

// clientRun is the client's side of one run.
type clientRun struct {
	c  *Client
	id uint32

	mu          sync.Mutex
	cond        sync.Cond
	stdinCredit int64
	done        bool // the run ended: stop sending stdin
	stdinErr    error

	out     [2]outStream
	ended   chan struct{} // closed by end
	endOnce sync.Once
	started chan struct{} // closed when the agent said Started (pid set)
	pid     int
	exited  chan struct{} // closed when exit is set
	exit    wire.ExitMsg
}

// end marks the run over for its stdin copier and its streams (which
// still deliver what they hold).
func (r *clientRun) end() {
	r.endOnce.Do(func() { close(r.ended) })
	r.mu.Lock()
	r.done = true
	r.cond.Broadcast()
	r.mu.Unlock()
	r.out[0].close()
	r.out[1].close()
}

// outStream buffers one output stream of a run for its delivery
// goroutine; the agent's credit bounds what it holds.
type outStream struct {
	r       *clientRun
	stream  uint8
	w       io.Writer
	mu      sync.Mutex
	cond    sync.Cond
	chunks  [][]byte
	held    int
	closed  bool // no more data will come
	discard bool // the caller left: drop what comes
	werr    error
	done    chan struct{}
}

func (s *outStream) push(p []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held+len(p) > wire.Window {
		return fmt.Errorf("%w: the agent overran a window", wire.ErrProtocol)
	}
	s.chunks = append(s.chunks, p)
	s.held += len(p)
	s.cond.Signal()
	return nil
}

func (s *outStream) close() {
	s.mu.Lock()
	s.closed = true
	s.cond.Signal()
	s.mu.Unlock()
}

// deliver writes the stream to its Writer and grants the agent credit for
// what was written, wire.CreditBatch bytes at a time.
func (s *outStream) deliver() {
	defer close(s.done)
	consumed := 0
	for {
		s.mu.Lock()
		for len(s.chunks) == 0 && !s.closed {
			s.cond.Wait()
		}
		if len(s.chunks) == 0 {
			s.mu.Unlock()
			return
		}
		p := s.chunks[0]
		s.chunks[0] = nil
		s.chunks = s.chunks[1:]
		write := s.w != nil && s.werr == nil && !s.discard
		closed := s.closed
		s.mu.Unlock()
		var err error
		if write {
			_, err = s.w.Write(p)
		}
		s.mu.Lock()
		s.held -= len(p)
		if err != nil && s.werr == nil {
			s.werr = err
		}
		s.mu.Unlock()
		consumed += len(p)
		wire.Recycle(p)
		if !closed && consumed >= wire.CreditBatch {
			m := wire.CreditMsg{Stream: s.stream, N: uint32(consumed)}
			_ = s.r.c.send(wire.Frame{Type: wire.Credit, ID: s.r.id, Payload: m.Encode()})
			consumed = 0
		}
	}
}

// Run runs req in the sandbox with its own stdin (nil: empty), stdout
// and stderr (nil: discarded), and returns how it ended. A non-zero exit
// is data, not an error. Every process the command started is dead when
// Run returns without error: the agent kills what the command left
// behind when it exits.
//
// When ctx ends first, Run asks the agent to kill the run, waits up to
// [KillWait] for its report, hands the Writers what arrived before it
// ([StopDrain] at most), and returns the partial Exit with ctx's
// error (joined with [ErrNotKilled] when the report says something
// survived or never came). Start failures wrap [exec.ErrNotFound],
// [exec.ErrPermission], [exec.ErrDirNotFound] or [ErrUnknownUser]; a
// channel that fails makes Run return [ErrChannelClosed] promptly. A
// failed stdout or stderr Write or stdin Read is returned after the run
// ends. Run does not wait for a stdin that never ends once the command has
// exited: the copying goroutine ends when its Read returns.
func (c *Client) Run(ctx context.Context, req Request, stdin io.Reader, stdout, stderr io.Writer) (Exit, error) {
	unknown := Exit{Code: -1}
	if err := validate(req); err != nil {
		return unknown, err
	}
	r, err := c.begin(ctx, startFrame(req), stdin, stdout, stderr)
	if err != nil {
		return unknown, err
	}
	select {
	case <-r.exited:
	case <-c.dead:
	case <-ctx.Done():
		_ = c.send(wire.Frame{Type: wire.Kill, ID: r.id})
		return r.stopped(ctx.Err())
	}
	return r.wait(nil)
}

// stopped waits, [KillWait] at most, for the report of a run that was
// sent a Kill because ctxErr, then up to [StopDrain] for its output to
// reach the Writers, and returns how it ended, with ctxErr.
func (r *clientRun) stopped(ctxErr error) (Exit, error) {
	t := time.NewTimer(KillWait)
	defer t.Stop()
	select {
	case <-r.exited:
	case <-r.c.dead:
	case <-t.C:
		r.leave()
		return Exit{Code: -1, Started: true}, errors.Join(ctxErr, fmt.Errorf("%w: no report %v after the kill", ErrNotKilled, KillWait))
	}
	return r.wait(ctxErr)
}

// wait returns how a run that ended, or whose channel did, ended, once
// its output reached the Writers (after a Kill, ctxErr set, StopDrain at
// most).
func (r *clientRun) wait(ctxErr error) (Exit, error) {
	select {
	case <-r.exited:
	default: // the channel failed
		r.leave()
		return Exit{Code: -1, Started: true}, errors.Join(ctxErr, r.c.err)
	}
	if ctxErr != nil && !r.delivered(StopDrain) {
		r.leave()
	}
	<-r.out[0].done
	<-r.out[1].done
	ex, err := r.result(ctxErr)
	ex.Started, ex.Reported = true, true
	return ex, err
}

// startFrame is the Start frame of req, its run id to be set.
func startFrame(req Request) wire.Frame {
	m := wire.StartMsg{Argv: req.Argv, Env: req.Env, Dir: req.Dir, User: req.User, TTY: req.TTY, Rows: req.Rows, Cols: req.Cols}
	if m.TTY {
		m.Rows, m.Cols = cmp.Or(m.Rows, 24), cmp.Or(m.Cols, 80)
	}
	return wire.Frame{Type: wire.Start, Payload: m.Encode()}
}

// begin sends first (a Start or a Dial) as a new run, its stdin (nil:
// empty) and output going to and from the given streams, and returns the
// run, started on the agent's side or about to be.
func (c *Client) begin(ctx context.Context, first wire.Frame, stdin io.Reader, stdout, stderr io.Writer) (*clientRun, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r := c.newRun(stdout, stderr)
	c.mu.Lock()
	select {
	case <-c.dead:
		c.mu.Unlock()
		return nil, c.err
	default:
	}
	c.next++
	r.id = c.next
	c.runs[r.id] = r
	c.mu.Unlock()

	first.ID = r.id
	frames := []wire.Frame{first}
	if stdin == nil { // EOF at once, in the same write
		frames = append(frames, wire.Frame{Type: wire.Stdin, ID: r.id})
	}
	if err := c.send(frames...); err != nil {
		return nil, err
	}
	go r.out[0].deliver()
	go r.out[1].deliver()
	if stdin != nil {
		go r.copyStdin(stdin)
	}
	return r, nil
}

// newRun is a run whose output goes to stdout and stderr, its id and
// goroutines to come.
func (c *Client) newRun(stdout, stderr io.Writer) *clientRun {
	r := &clientRun{c: c, started: make(chan struct{}), exited: make(chan struct{}), ended: make(chan struct{})}
	r.cond.L = &r.mu
	r.stdinCredit = wire.Window
	for i, w := range []io.Writer{stdout, stderr} {
		s := &r.out[i]
		s.r, s.stream, s.w, s.done = r, uint8(i+1), w, make(chan struct{})
		s.cond.L = &s.mu
	}
	return r
}

// delivered waits, d at most, for the delivery goroutines to hand the
// caller's Writers all that arrived for the run, and reports whether
// they did.
func (r *clientRun) delivered(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for i := range r.out {
		select {
		case <-r.out[i].done:
		case <-t.C:
			return false
		}
	}
	return true
}

// leave drops what the agent still sends for the run, the caller having
// left, and waits for the delivery goroutines to be done with the
// caller's Writers (one Write in progress at most), so that nothing
// writes to them once Run has returned.
func (r *clientRun) leave() {
	for i := range r.out {
		s := &r.out[i]
		s.mu.Lock()
		s.discard, s.closed = true, true
		s.cond.Signal()
		s.mu.Unlock()
	}
	<-r.out[0].done
	<-r.out[1].done
}

func (r *clientRun) result(ctxErr error) (Exit, error) {
	m := r.exit
	ex := Exit{Code: int(m.Code), Killed: m.Killed, Leftovers: int(m.Leftovers), Usage: exec.Usage{
		UserCPU: time.Duration(m.UserCPU), SystemCPU: time.Duration(m.SystemCPU), PeakRSS: m.PeakRSS}}
	var err error
	switch m.Status {
	case wire.Exited:
		if m.Msg != "" {
			err = fmt.Errorf("%w: %s", ErrNotKilled, m.Msg)
		}
	case wire.StartNotFound:
		err = fmt.Errorf("agent: %s: %w", m.Msg, exec.ErrNotFound)
	case wire.StartPermission:
		err = fmt.Errorf("agent: %s: %w", m.Msg, exec.ErrPermission)
	case wire.StartDir:
		err = fmt.Errorf("agent: %s: %w", m.Msg, exec.ErrDirNotFound)
	case wire.StartUser:
		err = fmt.Errorf("%w: %s", ErrUnknownUser, m.Msg)
	case wire.Lost:
		err = fmt.Errorf("%w: %s", ErrLost, m.Msg)
	case wire.DialFailed:
		err = fmt.Errorf("agent: %s", m.Msg)
		if m.Code > 0 {
			err = fmt.Errorf("agent: %s: %w", m.Msg, syscall.Errno(m.Code))
		}
	default:
		err = fmt.Errorf("agent: cannot start the command: %s", m.Msg)
	}
	if m.Status != wire.Exited {
		ex.Code = -1
	}
	if ctxErr != nil {
		return ex, errors.Join(ctxErr, err)
	}
	if err != nil {
		return ex, err
	}
	for i, name := range []string{"stdout", "stderr"} {
		s := &r.out[i]
		s.mu.Lock()
		werr := s.werr
		s.mu.Unlock()
		if werr != nil {
			return ex, fmt.Errorf("agent: writing %s: %w", name, werr)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stdinErr != nil {
		return ex, fmt.Errorf("agent: reading stdin: %w", r.stdinErr)
	}
	return ex, nil
}

// copyStdin sends stdin within the run's credit, then EOF. It stops
// sending once the run has ended.
func (r *clientRun) copyStdin(stdin io.Reader) {
	buf := make([]byte, wire.ChunkSize)
	for {
		n, err := stdin.Read(buf)
		for p := buf[:n]; len(p) > 0; {
			r.mu.Lock()
			for r.stdinCredit <= 0 && !r.done {
				r.cond.Wait()
			}
			k := int(min(int64(len(p)), r.stdinCredit))
			r.stdinCredit -= int64(k)
			done := r.done
			r.mu.Unlock()
			if done {
				return
			}
			if r.c.send(wire.Frame{Type: wire.Stdin, ID: r.id, Payload: p[:k]}) != nil {
				return
			}
			p = p[k:]
		}
		if err != nil {
			if err != io.EOF {
				r.mu.Lock()
				r.stdinErr = err
				r.mu.Unlock()
			}
			_ = r.c.send(wire.Frame{Type: wire.Stdin, ID: r.id})
			return
		}
	}
}

// validate checks what the agent cannot carry.
func validate(req Request) error {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return fmt.Errorf("%w: empty command", exec.ErrInvalidCommand)
	}
	for _, list := range [][]string{req.Argv, req.Env, {req.Dir, req.User}} {
		for _, s := range list {
			if strings.IndexByte(s, 0) >= 0 {
				return fmt.Errorf("%w: NUL byte in %q", exec.ErrInvalidCommand, s)
			}
		}
	}
	for _, kv := range req.Env {
		if !strings.Contains(kv, "=") {
			return fmt.Errorf("%w: env entry %q without '='", exec.ErrInvalidCommand, kv)
		}
	}
	return nil
}

// sendGate lets sends through, but for a Freeze: shut waits for the
// sends in flight and holds every later one back until open. A send
// held back gives up once the client is dead.
type sendGate struct {
	mu       sync.Mutex
	idle     sync.Cond // on mu: signalled when the last send in flight left
	inflight int
	held     chan struct{} // while shut: closed by open
}

// enter waits until the gate is open, or dead is closed (false).
func (g *sendGate) enter(dead <-chan struct{}) bool {
	g.mu.Lock()
	for g.held != nil {
		held := g.held
		g.mu.Unlock()
		select {
		case <-held:
		case <-dead:
			return false
		}
		g.mu.Lock()
	}
	g.inflight++
	g.mu.Unlock()
	return true
}

// leave ends a send that entered.
func (g *sendGate) leave() {
	g.mu.Lock()
	if g.inflight--; g.inflight == 0 {
		g.idle.Broadcast()
	}
	g.mu.Unlock()
}

// shut holds later sends back and waits for those in flight.
func (g *sendGate) shut() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.held = make(chan struct{})
	for g.inflight > 0 {
		g.idle.Wait()
	}
}

// open lets the sends held back go.
func (g *sendGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.held)
	g.held = nil
}
