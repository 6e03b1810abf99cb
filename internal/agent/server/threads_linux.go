package server

import (
	"bytes"
	"os"
	"runtime"
	"strconv"
	"sync"
)

// A Go program makes an OS thread whenever its runtime wants one more
// than it has idle, and if clone fails (the sandbox's pids limit counts
// threads) the runtime dies: "runtime: failed to create new OS thread",
// fatal, not a panic. A fork bomb fills the limit, and the agent (PID 1:
// the whole sandbox with it) or the shim of a run would die at the first
// goroutine that blocks in a syscall while the others want to run.
// debug.SetMaxThreads does not help: past its bound the program dies
// all the same. So the agent and each shim make every thread they will
// need before they serve, while pids are free, and never need a new one
// after: the runtime keeps an idle thread for reuse, and never ends one.
//
// The runtime needs a thread at once for: each P running Go code
// (GOMAXPROCS of them: goroutines, GC workers, a spinning scheduler);
// one sleeping in the network poller with no P; each goroutine blocked
// in a system call (its P goes to another thread); and three that never
// run goroutines once made: sysmon, the template thread and os/signal's
// locked thread (both made by harden's signal.Notify). GOMAXPROCS is set
// low, and explicitly (so that the runtime no longer adjusts it to the
// CPU limit): every P is a thread to make before serving. The counts of
// goroutines that can sit in a system call are below; what they leave
// out are short calls (pipe2, fcntl, close, wait4 with WNOHANG, read and
// write on a non-blocking fd) that sysmon may catch in progress on a
// loaded machine and hand the P off from: the agent, which makes many
// of them from many goroutines at once, has headroom for those.
const (
	// alwaysThreads are sysmon, the template thread and os/signal's.
	alwaysThreads = 3

	// agentProcs is the agent's GOMAXPROCS: it only moves bytes between
	// pipes and its channel, one frame at a time.
	agentProcs = 2
	// agentBlocking are the agent's goroutines that can sit in a system
	// call at once: os/signal's receiver (a futex wait, as a system
	// call), the reader and the writer of the channel (blocking fds on
	// the stdio channel), a shim start (fork and exec, then the read of
	// the child's status; syscall.ForkLock serializes them) and a sweep
	// (its /proc walk; serialized by sweepMu and the pool's lock); then
	// headroom for the short calls of the runs' goroutines.
	agentBlocking = 5 + 3
	// AgentThreads is how many threads the agent makes before serving,
	// each a pid of the sandbox's limit: 14.
	AgentThreads = alwaysThreads + agentProcs + 1 + agentBlocking

	// shimProcs is a shim's GOMAXPROCS: it starts, waits for and kills
	// one run's processes at a time.
	shimProcs = 1
	// shimBlocking are a shim's goroutines that can sit in a system call
	// at once: os/signal's receiver, the main one (the command's fork and
	// exec and the stat calls before it, a kill's /proc walk) and the
	// reaper (wait4, its /proc walk). No other goroutine of a shim makes
	// a system call.
	shimBlocking = 3
	// ShimThreads is how many threads a shim makes before it serves,
	// each a pid of the sandbox's limit: 8.
	ShimThreads = alwaysThreads + shimProcs + 1 + shimBlocking
)

// makeThreads sets GOMAXPROCS to procs and has the runtime make OS
// threads until the process has at least n (the runtime may make one or
// two more meanwhile, for its own reasons). Each thread is made by
// parking a goroutine locked to it, so that the next one cannot run on
// it; once there are n the goroutines unlock and end, and their threads
// go idle in the runtime, for reuse. It dies, as the runtime does, when
// a thread cannot be made.
func makeThreads(procs, n int) {
	runtime.GOMAXPROCS(procs)
	release := make(chan struct{})
	var wg sync.WaitGroup
	for threads() < n {
		locked := make(chan struct{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			close(locked)
			<-release
			runtime.UnlockOSThread()
		}()
		<-locked
	}
	close(release)
	wg.Wait()
}

// threads returns the number of threads of this process, from
// /proc/self/status; a large number when it cannot tell, which ends
// makeThreads.
func threads() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 1 << 30
	}
	_, rest, ok := bytes.Cut(b, []byte("\nThreads:"))
	if !ok {
		return 1 << 30
	}
	line, _, _ := bytes.Cut(rest, []byte("\n"))
	n, err := strconv.Atoi(string(bytes.TrimSpace(line)))
	if err != nil {
		return 1 << 30
	}
	return n
}
