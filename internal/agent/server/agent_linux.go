package server

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podvm/podvm/internal/agent/fsop"
	"github.com/podvm/podvm/internal/agent/wire"
)

const (
	// drainGrace bounds how long a run's output pipe may stay open after
	// every process of the run is dead (only a process of another run
	// that was handed the fd can hold it).
	drainGrace = 2 * time.Second
	// shutdownGrace bounds the wait for every run to report at shutdown.
	shutdownGrace = 30 * time.Second
)

// Main runs the agent, a shim when args hold -shim, or a file operation
// of package fsop when args start with -fs, and returns the process's
// exit code.
func Main(args []string) int {
	if len(args) > 0 && args[0] == "-fs" {
		// A file operation, run in the sandbox as a command of its own.
		return fsop.Main(args[1:], os.Stdin, os.Stdout, os.Stderr)
	}
	fs := flag.NewFlagSet("podvm-agent", flag.ContinueOnError)
	shimMode := fs.Bool("shim", false, "serve runs for the agent (internal)")
	connect := fs.String("connect", "", "serve the protocol on a connection to the unix socket the host listens on at this path, instead of stdin and stdout")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *shimMode {
		return shimMain()
	}
	in, out, err := takeStdio()
	if err != nil {
		fmt.Fprintln(os.Stderr, "podvm-agent:", err)
		return 1
	}
	if err := harden(); err != nil {
		return 1
	}
	// Every thread the agent will need, made while pids are free: at the
	// sandbox's pids limit it could make none, and would die of it.
	makeThreads(agentProcs, AgentThreads)
	// PID 1 is the reaper of its namespace anyway; elsewhere (tests) this
	// makes the agent one.
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	a := &agent{sessions: map[*session]bool{}}
	a.pool = newPool(func() { _ = a.sweep(shutdownGrace) })
	var s *session
	if *connect != "" {
		// The host's socket is the channel: the sandbox sees it on a
		// read-only mount and can make nothing there. The connection is
		// made before anything else runs in the sandbox.
		in.Close()
		out.Close()
		c, err := (&net.Dialer{Timeout: 10 * time.Second}).Dial("unix", *connect)
		if err != nil {
			return 1
		}
		s = a.newSession(c, c, func() { c.Close() })
	} else {
		s = a.newSession(in, out, func() { in.Close(); out.Close() })
	}
	s.serve()
	// The channel is single-use: once it ends nobody can reach the agent
	// any more, so everything it runs dies with it.
	a.shutdown(nil)
	return 0
}

// agent is PID 1: its sessions (the stdio channel and socket peers) and
// the pool of shims that run their commands.
type agent struct {
	pool     *pool
	mu       sync.Mutex
	sessions map[*session]bool
	listener net.Listener // the peers' port, once a Listen asked for it
	sweepMu  sync.Mutex
	downOnce sync.Once
}

// sweep kills every orphan that reached the agent until none is left.
func (a *agent) sweep(bound time.Duration) error {
	a.sweepMu.Lock()
	defer a.sweepMu.Unlock()
	deadline := time.Now().Add(bound)
	for {
		n, err := a.pool.killOrphans()
		if n == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d orphaned processes survive (%v)", n, err)
		}
		select {
		case <-a.pool.reaped:
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// shutdown ends every session but bye, kills every run, waits for their
// reports, ends the shims and orphans, says Bye on bye (when not nil)
// and exits.
func (a *agent) shutdown(bye *session) {
	a.downOnce.Do(func() {
		a.mu.Lock()
		var all []*session
		for s := range a.sessions {
			all = append(all, s)
		}
		a.mu.Unlock()
		for _, s := range all {
			if s != bye {
				// Its end, not its Exit frames: a session frozen for a
				// checkpoint would hold its runs' reports back until
				// the grace ran out.
				s.close()
			}
			s.killAll()
		}
		var problems []string
		done := make(chan struct{})
		go func() {
			for _, s := range all {
				s.wg.Wait()
			}
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(shutdownGrace):
			problems = append(problems, "runs still not dead after "+shutdownGrace.String())
		}
		for _, s := range all {
			if p := s.killProblem(); p != "" {
				problems = append(problems, p)
			}
		}
		a.pool.close()
		if err := a.sweep(shutdownGrace); err != nil {
			problems = append(problems, err.Error())
		}
		if bye != nil {
			m := wire.ByeMsg{OK: len(problems) == 0, Msg: fmt.Sprint(problems)}
			_ = bye.send(wire.Frame{Type: wire.Bye, Payload: m.Encode()})
		}
		os.Exit(0)
	})
}

// session is one client's channel: the stdio one or a socket peer's.
type session struct {
	a     *agent
	in    *bufio.Reader
	out   io.Writer
	close func()
	// gate holds the session's frames back while its client has it
	// frozen (Freeze to Thaw): every send takes it shared, Freeze alone.
	gate   sync.RWMutex
	frozen bool // Freeze held gate; the serve goroutine's alone
	wmu    sync.Mutex
	wbuf   []byte // a frame being written, reused under wmu
	werr   error
	// noSplice: splice refused the channel (splice_linux.go); under wmu.
	noSplice bool
	mu       sync.Mutex
	runs     map[uint32]*run
	wg       sync.WaitGroup
	bad      string // the first run that could not kill everything
}

func (a *agent) newSession(in io.Reader, out io.Writer, close func()) *session {
	s := &session{a: a, in: bufio.NewReaderSize(in, 64<<10), out: out, close: close, runs: map[uint32]*run{}}
	a.mu.Lock()
	a.sessions[s] = true
	a.mu.Unlock()
	return s
}

// send writes one frame in one Write call, once the session is not
// frozen; after a write error the session is closed and every later send
// fails.
func (s *session) send(f wire.Frame) error {
	s.gate.RLock()
	defer s.gate.RUnlock()
	return s.write(f)
}

// write is send, frozen or not.
func (s *session) write(f wire.Frame) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.werr == nil {
		s.wbuf = f.Append(s.wbuf[:0])
		if _, s.werr = s.out.Write(s.wbuf); s.werr != nil {
			s.close()
		}
	}
	return s.werr
}

// serve says Hello and dispatches the client's frames until the channel
// ends or breaks the protocol; then it kills the session's runs and
// waits for them.
func (s *session) serve() {
	if s.send(wire.Frame{Type: wire.Hello, Payload: s.hello().Encode()}) == nil {
		for {
			f, err := wire.ReadStream(s.in)
			if err != nil || s.dispatch(f) != nil {
				break
			}
		}
	}
	s.close()
	if s.frozen { // the runs' last sends fail on the closed channel, not wait
		s.frozen = false
		s.gate.Unlock()
	}
	s.killAll()
	s.wg.Wait()
	s.a.mu.Lock()
	delete(s.a.sessions, s)
	s.a.mu.Unlock()
}

// hello is the agent's handshake.
func (s *session) hello() wire.HelloMsg {
	wd, _ := os.Getwd()
	return wire.HelloMsg{Version: wire.Version, PID: uint32(os.Getpid()), UID: uint32(os.Getuid()),
		GID: uint32(os.Getgid()), Arch: runtime.GOARCH, GoVersion: runtime.Version(), Dir: wd}
}

func (s *session) dispatch(f wire.Frame) error {
	if thaws := f.Type == wire.Thaw || f.Type == wire.Resume; s.frozen != thaws {
		if s.frozen {
			return fmt.Errorf("%w: frame type %d while frozen", wire.ErrProtocol, f.Type)
		}
		return fmt.Errorf("%w: frame type %d without Freeze", wire.ErrProtocol, f.Type)
	}
	switch f.Type {
	case wire.Freeze:
		// Once the sends in flight are written, none goes until Thaw:
		// Frozen is the last frame, and the channel stands at a frame
		// boundary, empty both ways (the client sends nothing either),
		// for a checkpoint to take.
		s.gate.Lock()
		s.frozen = true
		m := wire.FrozenMsg{TCP: tcpSockets()}
		return s.write(wire.Frame{Type: wire.Frozen, Payload: m.Encode()})
	case wire.Thaw, wire.Resume:
		var err error
		if f.Type == wire.Resume {
			// The client came back on another stream (a restored
			// sandbox's conmon, the same descriptors here): Hello goes
			// first, before any frame the gate held back.
			err = s.resume(f.Payload)
		}
		s.frozen = false
		s.gate.Unlock()
		return err
	case wire.Shutdown:
		go s.a.shutdown(s)
		return nil
	case wire.Listen:
		m, err := wire.DecodeListen(f.Payload)
		if err != nil {
			return err
		}
		ans := s.a.listen(m.Key, m.Port)
		return s.send(wire.Frame{Type: wire.Listening, Payload: ans.Encode()})
	}
	s.mu.Lock()
	r := s.runs[f.ID]
	if f.Type == wire.Start || f.Type == wire.Dial {
		if r != nil {
			s.mu.Unlock()
			return fmt.Errorf("%w: run %d started twice", wire.ErrProtocol, f.ID)
		}
		var serve func(*run)
		if f.Type == wire.Start {
			m, err := wire.DecodeStart(f.Payload)
			if err != nil {
				s.mu.Unlock()
				return err
			}
			serve = func(r *run) { r.serve(r.exec(m)) }
		} else {
			m, err := wire.DecodeDial(f.Payload)
			if err != nil {
				s.mu.Unlock()
				return err
			}
			serve = func(r *run) { r.serve(r.connect(m)) }
		}
		r = &run{s: s, id: f.ID}
		r.cond.L = &r.mu
		r.window[wire.StreamStdout], r.window[wire.StreamStderr] = wire.Window, wire.Window
		s.runs[f.ID] = r
		s.wg.Add(1)
		s.mu.Unlock()
		go serve(r)
		return nil
	}
	s.mu.Unlock()
	if r == nil {
		wire.Recycle(f.Payload)
		return nil // a frame for a run that has ended
	}
	switch f.Type {
	case wire.Stdin:
		r.pushStdin(f.Payload)
	case wire.Credit:
		m, err := wire.DecodeCredit(f.Payload)
		if err != nil || m.Stream == wire.StreamStdin || m.Stream > wire.StreamStderr {
			return fmt.Errorf("%w: bad credit", wire.ErrProtocol)
		}
		r.addCredit(m.Stream, int64(m.N))
	case wire.Kill:
		r.kill()
	case wire.Signal:
		m, err := wire.DecodeSignal(f.Payload)
		if err != nil {
			return err
		}
		r.signal(m)
	case wire.Resize:
		m, err := wire.DecodeResize(f.Payload)
		if err != nil {
			return err
		}
		r.mu.Lock()
		tty := r.tty
		r.mu.Unlock()
		if tty != nil {
			_ = resize(tty, m.Rows, m.Cols)
		}
	default:
		return fmt.Errorf("%w: frame type %d", wire.ErrProtocol, f.Type)
	}
	return nil
}

// resume answers a Resume, frozen, with Hello. A fresh client's (a
// restored copy's) adopts the runs it keeps, which go on with full
// windows: the credit the original's client owed for what it read is
// the original's. The session's other runs are the original's callers':
// they are killed, and say nothing more on this channel. A kept run
// that is gone is reported lost.
func (s *session) resume(p []byte) error {
	m, err := wire.DecodeResume(p)
	if err != nil {
		return err
	}
	if err := s.write(wire.Frame{Type: wire.Hello, Payload: s.hello().Encode()}); err != nil || !m.Fresh {
		return err
	}
	keep := make(map[uint32]bool, len(m.Keep))
	for _, id := range m.Keep {
		keep[id] = true
	}
	s.mu.Lock()
	var drop []*run
	for id, r := range s.runs {
		if keep[id] {
			delete(keep, id)
			r.mu.Lock()
			for _, st := range []uint8{wire.StreamStdout, wire.StreamStderr} {
				// A frame charged but held at the gate goes to the new
				// client too.
				r.window[st] = wire.Window - r.unsent[st]
			}
			r.cond.Broadcast()
			r.mu.Unlock()
		} else {
			r.orphan.Store(true) // before the gate opens: nothing of it goes out
			drop = append(drop, r)
		}
	}
	s.mu.Unlock()
	for _, r := range drop {
		r.kill()
	}
	for id := range keep {
		ex := wire.ExitMsg{Status: wire.Lost, Code: -1, Msg: "the run had ended when the checkpoint was taken"}
		if err := s.write(wire.Frame{Type: wire.Exit, ID: id, Payload: ex.Encode()}); err != nil {
			return err
		}
	}
	return nil
}

func (s *session) killAll() {
	s.mu.Lock()
	runs := make([]*run, 0, len(s.runs))
	for _, r := range s.runs {
		runs = append(runs, r)
	}
	s.mu.Unlock()
	for _, r := range runs {
		r.kill()
	}
}

func (s *session) killProblem() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bad
}

// run is one command in flight.
type run struct {
	s        *session
	id       uint32
	mu       sync.Mutex
	cond     sync.Cond
	window   [3]int64 // credit of stdout and stderr (indexed by stream)
	unsent   [3]int64 // of what window was charged, what is not sent yet
	stdin    [][]byte
	stdinEOF bool
	finished bool // no more stdin is wanted
	exited   bool // every process of the run is dead
	killed   bool
	sh       *shim
	conn     net.Conn           // a Dial's connection, once made
	tty      *os.File           // a terminal's master, for Resize
	stopDial context.CancelFunc // ends a Dial's connect
	broke    error              // a Dial's connection failed, rather than closed (not by Kill)
	// orphan: a restored copy's client does not know the run (its
	// caller is the original's): it is killed, and sends nothing.
	orphan atomic.Bool
}

// send is session.send for one of r's frames, dropped when r is an
// orphan (checked behind the gate, which Resume holds while it makes
// orphans).
func (r *run) send(f wire.Frame) error {
	r.s.gate.RLock()
	defer r.s.gate.RUnlock()
	if r.orphan.Load() {
		return nil
	}
	return r.s.write(f)
}

// serve ends a run that ended as ex: it says so to the client.
func (r *run) serve(ex wire.ExitMsg) {
	defer r.s.wg.Done()
	if ex.Status == wire.Exited && ex.Msg != "" {
		r.s.mu.Lock()
		if r.s.bad == "" {
			r.s.bad = ex.Msg
		}
		r.s.mu.Unlock()
	}
	// Its end and its Exit behind the gate, as one: a Resume between
	// them would find a run that is neither kept nor an orphan, whose
	// Exit a copy's client would not know.
	r.s.gate.RLock()
	defer r.s.gate.RUnlock()
	r.s.mu.Lock()
	delete(r.s.runs, r.id)
	r.s.mu.Unlock()
	if !r.orphan.Load() {
		_ = r.s.write(wire.Frame{Type: wire.Exit, ID: r.id, Payload: ex.Encode()})
	}
}

// pipe returns a pipe whose end for the agent (read end when ours is
// "r") is non-blocking, hence pollable and closable under a pending
// read or write; the child's end stays blocking.
func pipe(ours byte) (agentEnd *os.File, childEnd int, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return nil, -1, err
	}
	a, c := p[0], p[1]
	if ours == 'w' {
		a, c = c, a
	}
	if err := unix.SetNonblock(a, true); err != nil {
		closeAll(p[:])
		return nil, -1, err
	}
	// A frame's worth in the pipe, not the default 64 KiB: a command
	// writing fast fills whole chunks (best effort: the system may cap it).
	_, _ = unix.FcntlInt(uintptr(a), unix.F_SETPIPE_SZ, wire.ChunkSize)
	return os.NewFile(uintptr(a), "pipe"), c, nil
}

// exec runs the command through a shim and returns its Exit message,
// once all the output that reached the pipes is forwarded.
func (r *run) exec(m wire.StartMsg) wire.ExitMsg {
	failed := func(format string, a ...any) wire.ExitMsg {
		return wire.ExitMsg{Status: wire.StartFailed, Msg: fmt.Sprintf(format, a...)}
	}
	sh, err := r.s.a.pool.get()
	if err != nil {
		return failed("%v", err)
	}
	ours, theirs, err := stdio(m)
	if err != nil {
		r.s.a.pool.put(sh)
		return failed("%v", err)
	}
	if m.TTY {
		r.mu.Lock()
		r.tty = ours[0]
		r.mu.Unlock()
	}
	err = sh.send(wire.Frame{Type: wire.Start, Payload: m.Encode()}, theirs[:]...)
	closeAll(theirs[:])
	if err != nil {
		for _, f := range ours {
			if f != nil {
				f.Close()
			}
		}
		sh.conn.Close()
		return wire.ExitMsg{Status: wire.Lost, Msg: "the run's shim is gone: " + err.Error()}
	}
	r.mu.Lock()
	r.sh = sh
	killed := r.killed
	r.mu.Unlock()
	if killed {
		_ = sh.send(wire.Frame{Type: wire.Kill})
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go r.pumpOut(ours[1], wire.Stdout, wire.StreamStdout, &wg)
	var stdin io.WriteCloser = ours[0]
	if ours[2] != nil {
		wg.Add(1)
		go r.pumpOut(ours[2], wire.Stderr, wire.StreamStderr, &wg)
	} else {
		// A terminal: its stdin's end is the user's ^D, not a close of
		// the master that its output is read from.
		stdin = noClose{ours[0]}
	}
	go r.pumpStdin(stdin)

	var ex wire.ExitMsg
	ok := true
	for ok {
		var ev shimEvent
		if ev, ok = <-sh.events; !ok {
			ex = wire.ExitMsg{Status: wire.Lost, Msg: "the run's shim died; the processes it left were killed"}
		} else if ev.exit != nil {
			ex = *ev.exit
			break
		} else {
			_ = r.send(wire.Frame{Type: wire.Started, ID: r.id, Payload: wire.StartedMsg{PID: ev.pid}.Encode()})
		}
	}
	r.mu.Lock()
	r.exited = true
	r.sh = nil
	r.mu.Unlock()
	for _, f := range ours[1:] {
		if f != nil {
			_ = f.SetReadDeadline(time.Now().Add(drainGrace))
		}
	}
	wg.Wait()
	r.mu.Lock()
	r.finished = true
	r.cond.Broadcast()
	r.mu.Unlock()
	ours[0].Close()
	if ok {
		r.s.a.pool.put(sh)
	} else {
		sh.conn.Close()
		_ = r.s.a.sweep(shutdownGrace)
	}
	return ex
}

// deadlineReader is what pumpOut reads: an output pipe, or a Dial's
// connection.
type deadlineReader interface {
	io.ReadCloser
	SetReadDeadline(time.Time) error
}

// stdio makes the run's stdin, stdout and stderr: the agent's ends
// (ours) and the command's (theirs, for the shim). With m.TTY they are
// one terminal: its master is ours[0] and ours[1], ours[2] is nil, and
// its slave is all three of theirs.
func stdio(m wire.StartMsg) (ours [3]*os.File, theirs [3]int, err error) {
	if m.TTY {
		master, slave, err := openPTY(m.Rows, m.Cols)
		if err != nil {
			return ours, theirs, err
		}
		theirs[0] = slave
		for i := 1; i < 3; i++ {
			if theirs[i], err = unix.FcntlInt(uintptr(slave), unix.F_DUPFD_CLOEXEC, 0); err != nil {
				master.Close()
				closeAll(theirs[:i])
				return ours, theirs, fmt.Errorf("terminal: %w", err)
			}
		}
		ours[0], ours[1] = master, master
		return ours, theirs, nil
	}
	for i, dir := range []byte{'w', 'r', 'r'} {
		if ours[i], theirs[i], err = pipe(dir); err != nil {
			for _, f := range ours[:i] {
				f.Close()
			}
			closeAll(theirs[:i])
			return ours, theirs, fmt.Errorf("pipe: %w", err)
		}
	}
	return ours, theirs, nil
}

// noClose is a writer whose Close does nothing.
type noClose struct{ io.Writer }

func (noClose) Close() error { return nil }

// pumpOut forwards one output pipe to the client within the stream's
// credit, until EOF; after a kill it discards instead.
func (r *run) pumpOut(f deadlineReader, typ wire.Type, stream uint8, wg *sync.WaitGroup) {
	defer wg.Done()
	defer f.Close()
	buf := make([]byte, wire.ChunkSize)
	for {
		r.mu.Lock()
		for r.window[stream] <= 0 && !r.killed {
			r.cond.Wait()
		}
		n := len(buf)
		if !r.killed {
			n = int(min(int64(n), r.window[stream]))
		}
		exited := r.exited
		r.mu.Unlock()
		if exited {
			_ = f.SetReadDeadline(time.Now().Add(drainGrace))
		}
		k, err := f.Read(buf[:n])
		if k > 0 {
			if r.charge(stream, k) {
				_ = r.send(wire.Frame{Type: typ, ID: r.id, Payload: buf[:k]})
				r.sent(stream, k)
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				r.broken(err)
			}
			return
		}
	}
}

// broken notes the failure of a read of a Dial's connection, unless a
// Kill closed it (then the read's failure is the Kill's doing).
func (r *run) broken(err error) {
	r.mu.Lock()
	if !r.killed && r.broke == nil {
		r.broke = err
	}
	r.mu.Unlock()
}

// pumpStdin writes the client's stdin to the command, granting credit
// back as it goes; a command that stopped reading makes it discard.
func (r *run) pumpStdin(f io.WriteCloser) {
	defer f.Close()
	broken := false
	taken := 0
	for {
		r.mu.Lock()
		for len(r.stdin) == 0 && !r.stdinEOF && !r.finished {
			r.cond.Wait()
		}
		if len(r.stdin) == 0 || r.finished {
			r.mu.Unlock()
			return
		}
		chunk := r.stdin[0]
		r.stdin[0] = nil // recycled below: the queue keeps no hold on it
		r.stdin = r.stdin[1:]
		r.mu.Unlock()
		if !broken {
			if _, err := f.Write(chunk); err != nil {
				broken = true
			}
		}
		wire.Recycle(chunk)
		if taken += len(chunk); taken >= wire.CreditBatch {
			m := wire.CreditMsg{Stream: wire.StreamStdin, N: uint32(taken)}
			_ = r.send(wire.Frame{Type: wire.Credit, ID: r.id, Payload: m.Encode()})
			taken = 0
		}
	}
}

// charge takes k bytes of stream's window for a frame to send, unless
// the run was killed (its output is dropped); sent says it went.
func (r *run) charge(stream uint8, k int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.killed {
		return false
	}
	r.window[stream] -= int64(k)
	r.unsent[stream] += int64(k)
	return true
}

func (r *run) sent(stream uint8, k int) {
	r.mu.Lock()
	r.unsent[stream] -= int64(k)
	r.mu.Unlock()
}

func (r *run) pushStdin(p []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(p) == 0 {
		r.stdinEOF = true
	} else if !r.stdinEOF {
		r.stdin = append(r.stdin, p)
	} else {
		wire.Recycle(p)
	}
	r.cond.Broadcast()
}

func (r *run) addCredit(stream uint8, n int64) {
	r.mu.Lock()
	r.window[stream] += n
	r.cond.Broadcast()
	r.mu.Unlock()
}

func (r *run) kill() {
	r.mu.Lock()
	if r.killed {
		r.mu.Unlock()
		return
	}
	r.killed = true
	r.cond.Broadcast()
	if r.stopDial != nil {
		r.stopDial()
	}
	if r.conn != nil {
		r.conn.Close()
	}
	// Sent under the lock: once exec has taken the shim back (sh nil) it
	// may serve another run, which a late Kill must not reach.
	if r.sh != nil {
		_ = r.sh.send(wire.Frame{Type: wire.Kill})
	}
	r.mu.Unlock()
}

// signal passes m to the run's shim while the command may live; one that
// comes before the shim has it, or after the run ended, is dropped.
func (r *run) signal(m wire.SignalMsg) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sh != nil && !r.exited {
		_ = r.sh.send(wire.Frame{Type: wire.Signal, Payload: m.Encode()})
	}
}

// dialTimeout bounds one connection attempt of a Dial.
const dialTimeout = 10 * time.Second

// connect serves a Dial: it connects, in the sandbox's network, says
// Started, and carries the connection as the run's stdin and stdout until
// the sandbox's side closes it or the client kills the run.
func (r *run) connect(m wire.DialMsg) wire.ExitMsg {
	switch m.Network {
	case "tcp", "tcp4", "tcp6", "unix":
	default:
		return wire.ExitMsg{Status: wire.DialFailed, Code: -1, Msg: fmt.Sprintf("network %q: want tcp, tcp4, tcp6 or unix", m.Network)}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.mu.Lock()
	r.stopDial = cancel
	killed := r.killed
	r.mu.Unlock()
	if killed {
		cancel()
	}
	c, err := dialWait(ctx, m)
	if err != nil {
		code := int32(-1)
		if errno := syscall.Errno(0); errors.As(err, &errno) {
			code = int32(errno)
		}
		return wire.ExitMsg{Status: wire.DialFailed, Code: code, Msg: err.Error()}
	}
	r.mu.Lock()
	r.conn, killed = c, r.killed
	r.mu.Unlock()
	if killed {
		c.Close()
		return wire.ExitMsg{Status: wire.Exited, Killed: true}
	}
	_ = r.send(wire.Frame{Type: wire.Started, ID: r.id, Payload: wire.StartedMsg{}.Encode()})
	var wg sync.WaitGroup
	wg.Add(1)
	if out := r.s.spliceTarget(); out == nil || !r.pumpSplice(c.(syscall.Conn), out, &wg) {
		go r.pumpOut(c.(deadlineReader), wire.Stdout, wire.StreamStdout, &wg)
	}
	stdinDone := make(chan struct{})
	go func() { r.pumpStdin(halfCloser{c}); close(stdinDone) }()
	wg.Wait() // the sandbox's side closed, or a Kill closed the connection
	c.Close()
	r.mu.Lock()
	r.exited, r.finished = true, true
	killed = r.killed
	broke := r.broke
	r.cond.Broadcast()
	r.mu.Unlock()
	<-stdinDone
	ex := wire.ExitMsg{Status: wire.Exited, Killed: killed}
	// A connection reset (or otherwise failed) is not one closed: its
	// errno goes to the client, whose reader gets it in place of EOF.
	if errno := syscall.Errno(0); !killed && errors.As(broke, &errno) {
		ex.Code = int32(errno)
	} else if !killed && broke != nil {
		ex.Code = int32(syscall.EIO)
	}
	return ex
}

// dialWait connects as m says: while m.Wait, again every 10 ms as long as
// nothing listens (refused, or no such socket), until ctx ends.
func dialWait(ctx context.Context, m wire.DialMsg) (net.Conn, error) {
	d := net.Dialer{Timeout: dialTimeout}
	for {
		c, err := d.DialContext(ctx, m.Network, m.Address)
		if err == nil || !m.Wait || !(errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT)) {
			return c, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// halfCloser is a connection as a run's stdin: its Close closes the
// writing half alone, so that the answer can still be read.
type halfCloser struct{ net.Conn }

func (h halfCloser) Close() error {
	if cw, ok := h.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
