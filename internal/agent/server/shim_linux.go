package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/podvm/podvm/internal/agent/wire"
	"github.com/podvm/podvm/internal/envlist"
)

// shimFD is the fd on which a shim finds its socket to the agent.
const shimFD = 3

// defaultPath is the PATH used when the merged environment has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// shimMain is a shim: the agent binary re-run by the agent, one per run
// in flight. It is a child subreaper, so every process its run starts,
// however it detaches, stays its descendant; it reaps them all itself.
// It serves runs one after another: a Start frame (with the run's stdin,
// stdout and stderr fds attached) starts the command, and the shim says
// Started with its pid; a Signal frame signals the command's process
// group while the command lives; a Kill frame kills the run's whole
// tree; when the command has exited it kills what is left, reaps
// everything and answers with an Exit frame, then waits for the next
// Start. It exits when the agent closes the socket. Its first
// frame, a Hello with no payload, says it is ready: it has made every
// thread it will need (see makeThreads), so that at the sandbox's pids
// limit it is a shim that could not start, not a run lost later.
func shimMain() int {
	if err := harden(); err != nil {
		return 1
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return 1
	}
	unix.CloseOnExec(shimFD)
	fc, err := net.FileConn(os.NewFile(shimFD, "agent"))
	if err != nil {
		return 1
	}
	conn := fc.(*net.UnixConn)
	makeThreads(shimProcs, ShimThreads)
	if sendFrame(conn, wire.Frame{Type: wire.Hello}) != nil {
		return 1
	}
	var wmu sync.Mutex
	sendf := func(f wire.Frame) error {
		wmu.Lock()
		defer wmu.Unlock()
		return sendFrame(conn, f)
	}
	send := func(ex wire.ExitMsg) error { return sendf(wire.Frame{Type: wire.Exit, Payload: ex.Encode()}) }
	// The reader starts each command and handles Kill frames; the reaper
	// waits for the run and answers. Neither hands a result to the
	// other on the way back, which keeps the round trip short.
	var killed atomic.Bool
	var cmd running
	pids := make(chan int)
	reaperDone := make(chan struct{})
	go func() {
		defer close(reaperDone)
		for pid := range pids {
			ex := reapRun(pid, &cmd)
			ex.Killed = killed.Load()
			if send(ex) != nil {
				return
			}
		}
	}()
	defer func() { <-reaperDone }()
	defer close(pids)
	for {
		f, fds, err := recvFrame(conn)
		if err != nil {
			// The agent is gone: kill the run in flight, if any.
			killed.Store(true)
			killTree(nil)
			return 0
		}
		switch f.Type {
		case wire.Start:
			killed.Store(false)
			pid, ex := startRun(f, fds)
			if pid == 0 {
				if send(ex) != nil {
					return 0
				}
				continue
			}
			cmd.set(pid)
			// Before the reaper has the pid, so before the run's Exit.
			if sendf(wire.Frame{Type: wire.Started, Payload: wire.StartedMsg{PID: uint32(pid)}.Encode()}) != nil {
				killed.Store(true)
				killTree(nil)
			}
			pids <- pid
		case wire.Signal:
			closeAll(fds)
			m, err := wire.DecodeSignal(f.Payload)
			if err == nil && m.Signo > 0 {
				_ = cmd.signal(unix.Signal(m.Signo))
			}
		case wire.Kill:
			closeAll(fds)
			killed.Store(true)
			killTree(nil) // harmless when the run has just ended
		default:
			closeAll(fds)
		}
	}
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// startRun starts a run's command and returns its pid, or the Exit
// message of a start failure.
func startRun(f wire.Frame, fds []int) (int, wire.ExitMsg) {
	defer closeAll(fds)
	msg, err := wire.DecodeStart(f.Payload)
	if err != nil || len(fds) != 3 {
		return 0, wire.ExitMsg{Status: wire.StartFailed, Msg: fmt.Sprintf("bad start request (%d fds): %v", len(fds), err)}
	}
	path, attr, ex := prepare(msg)
	if ex != nil {
		return 0, *ex
	}
	attr.Files = []uintptr{uintptr(fds[0]), uintptr(fds[1]), uintptr(fds[2])}
	if msg.TTY {
		// A session of its own, the terminal (its stdin) its controlling
		// one: ^C at the terminal reaches its foreground job. The
		// session's id is the command's pid, and so is its group's.
		attr.Sys.Setpgid = false
		attr.Sys.Setsid, attr.Sys.Setctty, attr.Sys.Ctty = true, true, 0
	}
	pid, err := syscall.ForkExec(path, msg.Argv, attr)
	if err != nil {
		return 0, startError(err, msg.Argv[0])
	}
	return pid, wire.ExitMsg{}
}

// errNotRunning is [running.signal]'s error when there is no command.
var errNotRunning = errors.New("no command running")

// running is the command of the run in flight as Signal frames see it:
// its pid, which is its group's, from its start until it is reaped; 0
// when there is none. The pid is cleared under the lock that reaps it
// and signalled under that lock, so a signal reaches the live command or
// nothing: never a group that has since taken the freed pid. No wait
// that blocks holds the lock, so a signal never waits for a command.
type running struct {
	mu  sync.Mutex
	pid int
}

// set makes pid the command that signal reaches.
func (r *running) set(pid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pid = pid
}

// signal sends sig to the command's process group: kill's error, or
// errNotRunning when the command has been reaped or there is none.
func (r *running) signal(sig unix.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pid == 0 {
		return errNotRunning
	}
	return unix.Kill(-r.pid, sig)
}

// reap reaps a child that has exited, if any, as wait4(-1, WNOHANG)
// does, and forgets the command if that child is it.
func (r *running) reap(ws *unix.WaitStatus, ru *unix.Rusage) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := unix.Wait4(-1, ws, unix.WNOHANG, ru)
	if err == nil && pid > 0 && pid == r.pid {
		r.pid = 0
	}
	return pid, err
}

// wait blocks until a child has exited, then reaps one as reap does. It
// blocks in waitid with WNOWAIT, which leaves the child unreaped, without
// the lock.
func (r *running) wait(ws *unix.WaitStatus, ru *unix.Rusage) (int, error) {
	for {
		var info unix.Siginfo
		if err := unix.Waitid(unix.P_ALL, 0, &info, unix.WEXITED|unix.WNOWAIT, nil); err != nil {
			return 0, err
		}
		if pid, err := r.reap(ws, ru); err != nil || pid > 0 {
			return pid, err
		}
	}
}

// reapRun reaps every process of the run until none is left: first the
// command, then, having killed whatever it left behind, the rest. It
// adds up the kernel's usage of every process it reaps (each one's
// includes the descendants that process reaped itself). It reaps through
// live, which forgets the command as it reaps it.
func reapRun(cmd int, live *running) wire.ExitMsg {
	var ex wire.ExitMsg
	var killErr error
	cmdDone := false
	account := func(pid int, ws unix.WaitStatus, ru *unix.Rusage) {
		ex.UserCPU += ru.Utime.Nano()
		ex.SystemCPU += ru.Stime.Nano()
		ex.PeakRSS = max(ex.PeakRSS, ru.Maxrss*1024)
		if pid == cmd {
			cmdDone = true
			switch {
			case ws.Exited():
				ex.Code = int32(ws.ExitStatus())
			case ws.Signaled():
				ex.Code = 128 + int32(ws.Signal())
			}
		}
	}
	for {
		var ws unix.WaitStatus
		var ru unix.Rusage
		wait := live.wait
		if cmdDone && ex.Leftovers == 0 && killErr == nil {
			// Usually nothing is left: ECHILD at once, no walk of /proc.
			pid, err := live.reap(&ws, &ru)
			if errors.Is(err, unix.ECHILD) {
				return ex
			}
			if err == nil && pid > 0 {
				account(pid, ws, &ru)
				continue
			}
		}
		if cmdDone {
			// Kill everything left, reap what is ready, then block for
			// the next death and look again.
			n, err := killTree(nil)
			if ex.Leftovers == 0 {
				ex.Leftovers = uint32(n)
			}
			if err != nil && killErr == nil {
				killErr = err
			}
			wait = live.reap
		}
		pid, err := wait(&ws, &ru)
		switch {
		case errors.Is(err, unix.EINTR):
		case errors.Is(err, unix.ECHILD):
			if killErr != nil {
				ex.Msg = "killing the run's processes: " + killErr.Error()
			}
			return ex
		case err != nil:
			ex.Msg = "waiting for the run's processes: " + err.Error()
			return ex
		case pid > 0:
			account(pid, ws, &ru)
			for { // reap whatever else is ready before walking the tree again
				pid, err = live.reap(&ws, &ru)
				if err != nil || pid <= 0 {
					break
				}
				account(pid, ws, &ru)
			}
		default: // reap, and nothing ready yet
			pid, err = live.wait(&ws, &ru)
			if err == nil && pid > 0 {
				account(pid, ws, &ru)
			}
		}
	}
}

var etcOnce = sync.OnceValues(func() ([]byte, []byte) {
	p, _ := os.ReadFile("/etc/passwd")
	g, _ := os.ReadFile("/etc/group")
	return p, g
})

// prepare resolves a Start message into what ForkExec needs, or the
// Exit message of a start failure.
func prepare(m wire.StartMsg) (string, *syscall.ProcAttr, *wire.ExitMsg) {
	fail := func(s wire.Status, format string, a ...any) (string, *syscall.ProcAttr, *wire.ExitMsg) {
		return "", nil, &wire.ExitMsg{Status: s, Msg: fmt.Sprintf(format, a...)}
	}
	if len(m.Argv) == 0 || m.Argv[0] == "" {
		return fail(wire.StartFailed, "empty command")
	}
	env := envlist.Merge(os.Environ(), m.Env)
	attr := &syscall.ProcAttr{Env: env, Sys: &syscall.SysProcAttr{Setpgid: true}}
	dir := m.Dir
	if dir == "" {
		dir, _ = os.Getwd()
	} else {
		st, err := os.Stat(dir)
		if err != nil {
			if errors.Is(err, os.ErrPermission) {
				return fail(wire.StartPermission, "working directory %q: %v", dir, err)
			}
			return fail(wire.StartDir, "working directory %q: %v", dir, err)
		}
		if !st.IsDir() {
			return fail(wire.StartDir, "working directory %q is not a directory", dir)
		}
		attr.Dir = dir
	}
	if m.User != "" {
		passwd, group := etcOnce()
		id, err := lookupUser(m.User, passwd, group)
		if err != nil {
			return fail(wire.StartUser, "%v", err)
		}
		attr.Sys.Credential = &syscall.Credential{Uid: id.uid, Gid: id.gid, Groups: id.groups}
		if _, set := envlist.Lookup(m.Env, "HOME"); id.home != "" && !set {
			attr.Env = envlist.Merge(attr.Env, []string{"HOME=" + id.home})
		}
	}
	path, err := lookPath(m.Argv[0], dir, pathOf(attr.Env))
	if err != nil {
		return "", nil, ptr(startError(err, m.Argv[0]))
	}
	return path, attr, nil
}

func ptr[T any](v T) *T { return &v }

// startError classifies a failure to start the command.
func startError(err error, name string) wire.ExitMsg {
	s := wire.StartFailed
	switch {
	case errors.Is(err, unix.ENOENT):
		s = wire.StartNotFound
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		s = wire.StartPermission
	case errors.Is(err, unix.ENOTDIR):
		s = wire.StartDir
	}
	return wire.ExitMsg{Status: s, Msg: fmt.Sprintf("%q: %v", name, err)}
}

// lookPath finds name as execve would after a chdir to dir, searching
// path when name has no slash. A file found but not executable is
// EACCES; nothing found is ENOENT.
func lookPath(name, dir, path string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil // execve itself reports what is wrong with it
	}
	if path == "" {
		path = defaultPath
	}
	var denied error
	for _, d := range filepath.SplitList(path) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, name)
		abs := p
		if !filepath.IsAbs(p) {
			abs = filepath.Join(dir, p)
			p = "./" + p
		}
		st, err := os.Stat(abs)
		if err != nil || st.IsDir() {
			continue
		}
		if st.Mode()&0o111 == 0 {
			denied = unix.EACCES
			continue
		}
		return p, nil
	}
	if denied != nil {
		return "", denied
	}
	return "", unix.ENOENT
}

// pathOf is env's PATH, empty when it has none.
func pathOf(env []string) string {
	p, _ := envlist.Lookup(env, "PATH")
	return p
}
