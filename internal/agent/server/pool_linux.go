package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podvm/podvm/internal/agent/wire"
)

// maxIdle bounds the shims kept for reuse: a run that finds none idle
// pays for a process start of the agent binary (~3 ms here, more CPU
// than the run itself), so the pool keeps as many as runs were in flight
// at once, up to this many. One idle shim holds ~1 MiB of private
// memory; one unused for idleLife exits, down to spares, which is how
// many the pool starts ahead of need.
const (
	maxIdle  = 32
	spares   = 1
	idleLife = 30 * time.Second
	// readyWait bounds the wait for a new shim's Hello.
	readyWait = 10 * time.Second
)

// shim is the agent's handle on one shim process.
type shim struct {
	pid    int
	conn   *net.UnixConn
	wmu    sync.Mutex
	events chan shimEvent // the current run's Started, then its Exit; closed when the shim is gone
	idle   time.Time      // when it last went back to the pool
}

// shimEvent is what a shim says of its run: started (pid set) or ended
// (exit set).
type shimEvent struct {
	pid  uint32
	exit *wire.ExitMsg
}

func (s *shim) send(f wire.Frame, fds ...int) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	return sendFrame(s.conn, f, fds...)
}

// pool starts shims, keeps idle ones for reuse, and is the only caller
// of wait in the agent: it reaps every child, shims and orphans alike.
type pool struct {
	mu       sync.Mutex
	idle     []*shim
	live     map[int]*shim // pid → shim, until reaped
	starting bool
	env      []string
	orphans  func()        // called when a shim died unexpectedly
	reaped   chan struct{} // signalled after each reaping round
}

func newPool(orphans func()) *pool {
	p := &pool{live: map[int]*shim{}, env: os.Environ(), orphans: orphans, reaped: make(chan struct{}, 1)}
	sig := make(chan os.Signal, 64)
	signal.Notify(sig, unix.SIGCHLD)
	go p.reap(sig)
	go func() {
		for range time.Tick(idleLife / 2) {
			p.trim(time.Now().Add(-idleLife))
		}
	}()
	p.refill()
	return p
}

// trim ends the idle shims beyond spares that went idle before since.
// The idle list is a stack: its bottom has waited longest.
func (p *pool) trim(since time.Time) {
	p.mu.Lock()
	var old []*shim
	for len(p.idle) > spares && p.idle[0].idle.Before(since) {
		old = append(old, p.idle[0])
		p.idle = p.idle[1:]
	}
	p.mu.Unlock()
	for _, s := range old {
		s.conn.Close() // the shim exits
	}
}

// reap is the one place that calls wait. It waits for any child on every
// SIGCHLD and dispatches by pid: a shim's death is noted (its socket's
// EOF tells its run); anything else is an orphan that reached the agent,
// already dead once reaped.
func (p *pool) reap(sig <-chan os.Signal) {
	tick := time.NewTicker(time.Second) // a lost SIGCHLD costs at most this
	defer tick.Stop()
	for {
		select {
		case <-sig:
		case <-tick.C:
		}
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
			p.mu.Lock()
			_, isShim := p.live[pid]
			delete(p.live, pid)
			p.mu.Unlock()
			if isShim {
				// A shim exits only when told to (its socket closed); any
				// other exit may have left its run's processes to us.
				go p.orphans()
			}
		}
		select {
		case p.reaped <- struct{}{}:
		default:
		}
	}
}

// get returns an idle shim, or starts one.
func (p *pool) get() (*shim, error) {
	p.mu.Lock()
	var s *shim
	for s == nil && len(p.idle) > 0 {
		n := len(p.idle)
		s, p.idle = p.idle[n-1], p.idle[:n-1]
		if p.live[s.pid] != s { // died while idle
			s.conn.Close()
			s = nil
		}
	}
	p.mu.Unlock()
	if s != nil {
		p.refill()
		return s, nil
	}
	defer p.refill()
	return p.start()
}

// put makes s available again after a run it served to the end.
func (p *pool) put(s *shim) {
	p.mu.Lock()
	if len(p.idle) < maxIdle {
		s.idle = time.Now()
		p.idle = append(p.idle, s)
		s = nil
	}
	p.mu.Unlock()
	if s != nil {
		s.conn.Close() // the shim exits
	}
}

// refill starts spare shims in the background until spares are idle.
func (p *pool) refill() {
	p.mu.Lock()
	if p.starting || len(p.idle) >= spares {
		p.mu.Unlock()
		return
	}
	p.starting = true
	p.mu.Unlock()
	go func() {
		s, err := p.start()
		p.mu.Lock()
		p.starting = false
		p.mu.Unlock()
		if err == nil {
			p.put(s)
		}
	}()
}

// close ends every idle shim.
func (p *pool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, s := range idle {
		s.conn.Close()
	}
}

// killOrphans kills every descendant of the agent that is not a shim or
// under one, and returns how many it signalled. No shim can start
// meanwhile, so none is mistaken for an orphan.
func (p *pool) killOrphans() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	spare := make(map[int]bool, len(p.live))
	for pid := range p.live {
		spare[pid] = true
	}
	return killTree(spare)
}

// start runs a new shim: this binary again, with /dev/null on 0, 1 and
// 2 and its end of a socket pair on 3.
func (p *pool) start() (*shim, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socketpair: %w", err)
	}
	null, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		closeAll(fds[:])
		return nil, fmt.Errorf("open /dev/null: %w", err)
	}
	attr := &syscall.ProcAttr{Env: p.env, Files: []uintptr{uintptr(null), uintptr(null), uintptr(null), uintptr(fds[1])}}
	p.mu.Lock() // registered before the reaper can see it exit
	pid, err := syscall.ForkExec("/proc/self/exe", []string{"podvm-agent", "-shim"}, attr)
	if err == nil {
		p.live[pid] = nil
	}
	p.mu.Unlock()
	unix.Close(null)
	unix.Close(fds[1])
	if err != nil {
		unix.Close(fds[0])
		return nil, fmt.Errorf("starting a shim: %w", err)
	}
	f := os.NewFile(uintptr(fds[0]), "shim")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("shim socket: %w", err)
	}
	s := &shim{pid: pid, conn: c.(*net.UnixConn), events: make(chan shimEvent, 1)}
	if err := s.ready(); err != nil {
		s.conn.Close() // the shim exits, if it has not
		return nil, fmt.Errorf("starting a shim: %w", err)
	}
	p.mu.Lock()
	if _, ok := p.live[pid]; ok {
		p.live[pid] = s
	}
	p.mu.Unlock()
	go s.read()
	return s, nil
}

// ready waits for the new shim's Hello: it has made its threads. One
// that exits before, for want of a pid for a thread, was never ready to
// run anything.
func (s *shim) ready() error {
	_ = s.conn.SetReadDeadline(time.Now().Add(readyWait))
	f, fds, err := recvFrame(s.conn)
	closeAll(fds)
	_ = s.conn.SetReadDeadline(time.Time{})
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fmt.Errorf("not ready after %v", readyWait)
	case err != nil:
		return errors.New("it exited before it was ready (at the sandbox's pids limit it cannot make its threads)")
	case f.Type != wire.Hello:
		return fmt.Errorf("frame type %d before its Hello", f.Type)
	}
	return nil
}

// read forwards the shim's Started and Exit frames; it closes s.events
// when the shim is gone.
func (s *shim) read() {
	defer close(s.events)
	for {
		f, fds, err := recvFrame(s.conn)
		closeAll(fds)
		if err != nil {
			return
		}
		switch f.Type {
		case wire.Started:
			if m, err := wire.DecodeStarted(f.Payload); err == nil {
				s.events <- shimEvent{pid: m.PID}
			}
		case wire.Exit:
			ex, err := wire.DecodeExit(f.Payload)
			if err != nil {
				ex = wire.ExitMsg{Status: wire.Lost, Msg: "bad exit frame from shim: " + err.Error()}
			}
			s.events <- shimEvent{exit: &ex}
		}
	}
}
