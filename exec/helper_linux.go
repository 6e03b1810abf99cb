package exec

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	osexec "os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podvm/podvm/internal/cgroup"
)

// Init makes the subreaper containment available to this program. Call it
// first thing in main (and in TestMain), before anything with side
// effects:
//
//	func main() {
//		exec.Init()
//		...
//	}
//
// In the program's own process Init only records that it was called and
// returns at once. A run under [ContainSubreaper], or one with a
// MaxCPUTime, re-executes the program (/proc/self/exe) as a small helper:
// there Init never returns. The helper makes itself the child subreaper
// (PR_SET_CHILD_SUBREAPER) of the command and starts it; every process
// the command's tree orphans becomes the helper's child whatever it did
// (setsid, double fork, a new name), and when the command exits, or the
// run is stopped, or this program dies, the helper kills the tree, top
// down, and reaps it until nothing is left, then reports the command's
// exit status and the whole tree's usage (RUSAGE_CHILDREN).
//
// Why a helper, and why this hook: making the calling process itself a
// subreaper would reparent every orphan of the whole program to it, where
// nobody reaps them, and race the program's own wait calls. A library
// cannot assume its program can be re-executed as something else, nor
// ship a binary, so the program says so by calling Init. The helper's
// cost is one start of the program (package initialisation included) per
// run: a few milliseconds for a small Go program. Where a cgroup v2 is
// writable, [ContainCgroup] is chosen instead and costs far less.
//
// A program that does not call Init still runs commands: it gets
// [ContainCgroup] where the host allows, else [ContainProcessGroup].
func Init() {
	if os.Getenv(helperEnv) == "1" && isSocket(helperFD) {
		os.Exit(subreaperMain())
	}
	initCalled.Store(true)
}

const (
	helperEnv  = "PODVM_EXEC_SUBREAPER"
	helperArg0 = "podvm-exec-subreaper"
	helperFD   = 3 // the control socket, in the helper
	helperWhy  = "the program does not call exec.Init at the start of main"
)

var initCalled atomic.Bool

func helperReady() bool { return initCalled.Load() }

func isSocket(fd int) bool {
	var st unix.Stat_t
	return unix.Fstat(fd, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK
}

// helperSpec is what the helper runs.
type helperSpec struct {
	Path string   `json:"path"`
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir,omitempty"`
	CPU  uint64   `json:"cpu_seconds,omitempty"` // RLIMIT_CPU
}

// The helper's messages: a kind and four values, as little-endian int64s.
const (
	msgStarted = iota + 1 // the command's pid
	msgFailed             // the errno of the failed start
	msgDone               // wait status, user ns, system ns, peak RSS bytes
)

type message [5]int64

func send(w io.Writer, m message) error { return binary.Write(w, binary.LittleEndian, m) }

func receive(r io.Reader) (m message, err error) {
	err = binary.Read(r, binary.LittleEndian, &m)
	return m, err
}

// helperProc is a command started by a subreaper helper.
type helperProc struct {
	c   *osexec.Cmd // the helper
	ctl *os.File    // our end of the control socket
	cg  *cgroup.Run // nil unless the helper runs in a cgroup
}

func startHelper(cmd Command, env []string, files stdio, cg *cgroup.Run) (proc, error) {
	resolved := osexec.Command(cmd.Name) // the path, found as os/exec finds it
	if resolved.Err != nil {
		return nil, startError(cmd.Name, resolved.Err)
	}
	if env == nil {
		env = os.Environ()
	}
	spec, err := json.Marshal(helperSpec{
		Path: resolved.Path,
		Argv: append([]string{cmd.Name}, cmd.Args...),
		Env:  env,
		Dir:  cmd.Dir,
		CPU:  uint64(math.Ceil(cmd.MaxCPUTime.Seconds())),
	})
	if err != nil {
		return nil, fmt.Errorf("exec: %s: %w", cmd.Name, err)
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("exec: %s: %w", cmd.Name, err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), helperArg0), os.NewFile(uintptr(fds[1]), helperArg0)
	c := &osexec.Cmd{
		Path:       "/proc/self/exe",
		Args:       []string{helperArg0},
		Env:        helperEnviron(),
		Stdout:     files.out,
		Stderr:     files.err,
		ExtraFiles: []*os.File{theirs},
	}
	if files.in != nil {
		c.Stdin = files.in
	}
	setProcessGroup(c)
	if cg != nil {
		enterCgroup(c, cg.FD())
	}
	err = c.Start()
	theirs.Close()
	if err != nil {
		ours.Close()
		return nil, fmt.Errorf("exec: %s: starting the subreaper helper: %w", cmd.Name, err)
	}
	p := &helperProc{c: c, ctl: ours, cg: cg}
	hdr := binary.LittleEndian.AppendUint32(nil, uint32(len(spec)))
	_, err = ours.Write(append(hdr, spec...))
	var m message
	if err == nil {
		m, err = receive(ours)
	}
	switch {
	case err != nil:
		p.abort()
		return nil, fmt.Errorf("exec: %s: the subreaper helper failed (%s): %w", cmd.Name, p.c.ProcessState, err)
	case m[0] == msgFailed:
		p.abort()
		return nil, startError(cmd.Name, &os.PathError{Op: "fork/exec", Path: resolved.Path, Err: syscall.Errno(m[1])})
	}
	return p, nil
}

// helperEnviron is the helper's environment: the program's own, so that
// its initialisation sees what it expects, plus the marker.
func helperEnviron() []string {
	// A build with the race detector otherwise sleeps 1 s at exit.
	race := "atexit_sleep_ms=0"
	if v, ok := os.LookupEnv("GORACE"); ok {
		race = v + " " + race
	}
	return append(os.Environ(), "GORACE="+race, helperEnv+"=1")
}

// abort ends a helper whose command did not start.
func (p *helperProc) abort() {
	p.ctl.Close() // the helper kills and exits on EOF
	p.c.Wait()
}

func (p *helperProc) kill() {
	if p.cg != nil {
		p.cg.Kill()
	}
	p.ctl.Write([]byte{'k'}) // fails harmlessly once the run has ended
}

func (p *helperProc) end() (outcome, error) {
	m, err := receive(p.ctl) // sent once the whole tree is dead and reaped
	p.ctl.Close()
	waitErr := p.c.Wait()
	if err == nil && m[0] != msgDone {
		err = fmt.Errorf("unexpected message %d", m[0])
	}
	if err != nil {
		if p.cg != nil {
			p.cg.Remove()
		}
		return outcome{code: -1}, fmt.Errorf("the subreaper helper died (%v, %v): %w", p.c.ProcessState, waitErr, err)
	}
	var out outcome
	out.code, out.killed = waitStatus(syscall.WaitStatus(m[1]))
	out.usage = &Usage{UserCPU: time.Duration(m[2]), SystemCPU: time.Duration(m[3]), PeakRSS: m[4]}
	if p.cg != nil {
		err = finishCgroup(p.cg, &out)
	}
	return out, err
}

// subreaperMain is the helper: it reads its spec from the control socket,
// starts the command as its child subreaper, and kills and reaps the
// command's whole tree when the command exits or when the control socket
// asks (a byte) or closes (the caller is gone).
func subreaperMain() int {
	syscall.CloseOnExec(helperFD) // the command must not reach the control socket
	ctl := os.NewFile(helperFD, helperArg0)
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "exec: subreaper helper: %v\n", err)
		return 125
	}
	var n uint32
	if err := binary.Read(ctl, binary.LittleEndian, &n); err != nil {
		return fail(err)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(ctl, buf); err != nil {
		return fail(err)
	}
	var spec helperSpec
	if err := json.Unmarshal(buf, &spec); err != nil {
		return fail(err)
	}
	if spec.Env == nil {
		spec.Env = []string{} // not the helper's own environment
	}
	// Signals meant for the caller's group do not orphan the run; handled,
	// not ignored, so the command starts with their default action.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fail(err)
	}
	if spec.CPU > 0 {
		if err := unix.Setrlimit(unix.RLIMIT_CPU, &unix.Rlimit{Cur: spec.CPU, Max: spec.CPU + 1}); err != nil {
			return fail(err)
		}
	}
	p, err := os.StartProcess(spec.Path, spec.Argv, &os.ProcAttr{
		Dir: spec.Dir, Env: spec.Env,
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		errno := syscall.EINVAL
		errors.As(err, &errno)
		send(ctl, message{msgFailed, int64(errno)})
		return 0
	}
	main := p.Pid
	p.Release()
	// The command holds its stdin and stdout; the helper lets go of them.
	// It keeps stderr, for its own messages.
	if null, err := os.Open(os.DevNull); err == nil {
		unix.Dup3(int(null.Fd()), 0, 0)
		unix.Dup3(int(null.Fd()), 1, 0)
		null.Close()
	}
	if err := send(ctl, message{msgStarted, int64(main)}); err != nil {
		killTree()
	}

	var stop atomic.Bool
	go func() {
		ctl.Read(make([]byte, 1)) // a byte, or EOF when the caller is gone
		stop.Store(true)
		killTree()
	}()
	var status unix.WaitStatus
	exited := false
	pause := 20 * time.Microsecond
	for {
		flags := 0
		if exited || stop.Load() {
			flags = unix.WNOHANG
		}
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, flags, nil)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil: // ECHILD: nothing left
			var ru unix.Rusage
			unix.Getrusage(unix.RUSAGE_CHILDREN, &ru)
			send(ctl, message{msgDone, int64(status), ru.Utime.Nano(), ru.Stime.Nano(), ru.Maxrss * 1024})
			return 0
		case pid == main:
			status, exited = ws, true
			killTree()
		case pid == 0: // alive, none exited yet: kill what appeared since
			killTree()
			time.Sleep(pause)
			pause = min(2*pause, 10*time.Millisecond)
		}
	}
}

// killTree kills every descendant of the helper, each parent before its
// children so that it cannot fork again once seen. A child that a killed
// parent leaves becomes the helper's, and the next call finds it.
func killTree() {
	queue := children(os.Getpid())
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		unix.Kill(pid, unix.SIGKILL)
		queue = append(queue, children(pid)...)
	}
}

// children lists the children of every thread of process pid.
func children(pid int) []int {
	dir := "/proc/" + strconv.Itoa(pid) + "/task/"
	tasks, _ := os.ReadDir(dir)
	var out []int
	for _, t := range tasks {
		data, _ := os.ReadFile(dir + t.Name() + "/children")
		for _, f := range strings.Fields(string(data)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}
