package vmtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// processCases check the processes a sandbox holds by handle ([vm.Start]).
// A path without podvm's agent refuses them (live/refused checks that), so
// the suite skips them there.
func processCases(h Harness) []testCase {
	return []testCase{
		{Name: "process/held", Promise: "a started process runs on: its pid is known, its stdin is fed a piece at a time, its output read as it comes and again from the start, and Wait returns what Run would",
			Test: processHeld},
		{Name: "process/signal", Promise: "a signal reaches the process; once it has ended, Signal and Kill say so",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				p := start(ctx, t, v, sh(`trap 'echo term; exit 3' TERM; echo ready; while :; do sleep 0.05; done`))
				waitFor(t, p.Stdout(), "ready\n")
				if err := p.Signal(syscall.SIGTERM); err != nil {
					t.Fatalf("Signal: %v", err)
				}
				res, err := p.Wait(ctx)
				// The group's sleep got it too: the shell may say so on
				// stderr ("Terminated").
				if err != nil || res.Stdout != "ready\nterm\n" || res.ExitCode != 3 {
					t.Fatalf("Wait: %+v, %v; want the trap's output and exit 3", res, err)
				}
				res.Stderr, res.StderrBytes = "", 0
				if err := p.Signal(syscall.SIGTERM); !errors.Is(err, vm.ErrProcessDone) {
					t.Errorf("Signal after the end: %v; want ErrProcessDone", err)
				}
				if err := p.Kill(); !errors.Is(err, vm.ErrProcessDone) {
					t.Errorf("Kill after the end: %v; want ErrProcessDone", err)
				}
				return []observation{observe("signal", res, err)}
			}},
		{Name: "process/kill", Promise: "Kill ends the process and everything it started, however it detached",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				marker := strconv.FormatInt(time.Now().UnixNano()%1e9+1e9, 10)
				p := start(ctx, t, v, sh(`setsid sh -c 'sleep $1; :' escapee "$1" & echo ready; exec sleep $1`, marker))
				waitFor(t, p.Stdout(), "ready\n")
				// The escapee must be there for Kill to prove anything.
				waitPS(ctx, t, v, "the escapee to start", func(ps string) bool { return strings.Count(ps, marker) >= 2 })
				if err := p.Kill(); err != nil {
					t.Fatalf("Kill: %v", err)
				}
				res, err := p.Wait(ctx)
				if err != nil || res.ExitCode != 137 {
					t.Fatalf("Wait after Kill: %+v, %v; want exit 137", res, err)
				}
				if ps := sandboxPS(ctx, t, v); strings.Contains(ps, marker) {
					t.Errorf("a process of the killed one survives:\n%s", ps)
				}
				return []observation{observe("kill", res, err)}
			}},
		{Name: "process/timeout", Promise: "a process's Timeout kills it: Wait reports TimedOut and DeadlineExceeded",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				cmd := sh(`echo started; exec sleep 3041`)
				cmd.Timeout = 2 * time.Second
				began := time.Now()
				p := start(ctx, t, v, cmd)
				res, err := p.Wait(ctx)
				if !errors.Is(err, context.DeadlineExceeded) || res == nil || !res.TimedOut || res.Stdout != "started\n" {
					t.Fatalf("Wait: %+v, %v; want a timed-out result holding the output", res, err)
				}
				if d := time.Since(began); d > cmd.Timeout+Grace {
					t.Errorf("Wait returned after %v; want within %v + %v", d, cmd.Timeout, Grace)
				}
				return []observation{observe("timeout", res, err)}
			}},
		{Name: "process/start-failures", Promise: "Start fails as Run does when the command cannot start",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				var obs []observation
				for _, c := range []struct {
					label string
					cmd   exec.Command
					want  error
				}{
					{"not found", exec.Command{Name: "no-such-command-podvm"}, exec.ErrNotFound},
					{"no dir", exec.Command{Name: "true", Dir: "/no/such/dir"}, exec.ErrDirNotFound},
					{"invalid", exec.Command{Name: ""}, exec.ErrInvalidCommand},
					{"not executable", exec.Command{Name: "/etc/passwd"}, exec.ErrPermission},
				} {
					p, err := vm.Start(ctx, v, c.cmd)
					skipIfNotSupported(t, err)
					if p != nil || !errors.Is(err, c.want) {
						t.Errorf("%s: Start: %v, %v; want no process and %v", c.label, p, err, c.want)
					}
					obs = append(obs, observe(c.label, nil, err))
				}
				return obs
			}},
		{Name: "process/replay", Promise: "output past the buffer is dropped from its head and counted, never silently",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				cmd := sh(`i=0; while [ $i -lt 1000 ]; do printf '%04d\n' $i; i=$((i+1)); done`)
				cmd.MaxOutputBytes = 1000 // 200 lines of the 1,000
				p := start(ctx, t, v, cmd)
				res, err := p.Wait(ctx)
				if err != nil || res.StdoutBytes != 5000 {
					t.Fatalf("Wait: %+v, %v; want 5000 bytes of output", res, err)
				}
				r := p.Stdout().Reader(0)
				got, err := io.ReadAll(r)
				if err != nil {
					t.Fatalf("reading the output: %v", err)
				}
				if r.Skipped() != 4000 || !strings.HasPrefix(string(got), "0800\n") || len(got) != 1000 {
					t.Errorf("a late reader got %d bytes from %q, skipped %d; want the last 1000 bytes from 0800, 4000 skipped", len(got), clip(string(got)), r.Skipped())
				}
				return []observation{observe("replay", res, err)}
			}},
		{Name: "process/outlives-start", Promise: "a process outlives the context of its Start and of a Wait that gave up; Processes lists it while it runs",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				sctx, cancel := context.WithCancel(ctx)
				p := start(sctx, t, v, exec.Command{Name: "cat"})
				cancel()
				wctx, wcancel := context.WithTimeout(ctx, 200*time.Millisecond)
				_, err := p.Wait(wctx)
				wcancel()
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Wait with a short deadline: %v; want DeadlineExceeded, the process running on", err)
				}
				if list := vm.Processes(v); len(list) != 1 || list[0] != p {
					t.Errorf("Processes: %v; want the one started", list)
				}
				if _, err := io.WriteString(p.Stdin(), "still here\n"); err != nil {
					t.Fatalf("writing its stdin: %v", err)
				}
				p.Stdin().Close()
				res, err := p.Wait(ctx)
				want(t, res, err, "still here\n", "", 0)
				if list := vm.Processes(v); len(list) != 0 {
					t.Errorf("Processes after its end: %v; want none", list)
				}
				if _, err := p.Stdin().Write([]byte("late")); !errors.Is(err, vm.ErrProcessDone) {
					t.Errorf("a write after the end: %v; want ErrProcessDone", err)
				}
				return []observation{observe("outlives", res, err)}
			}},
		{Name: "terminal/shell", Promise: "on a terminal, a shell's prompt shows, stty sees its size and a resize, ^C interrupts the foreground job",
			Test: terminalShell},
		{Name: "process/container-gone", Promise: "a held process whose container goes away behind the VM's back ends promptly with an error, never hangs",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				p := start(ctx, t, v, exec.Command{Name: "sleep", Args: []string{"3061"}})
				if err := h.RemoveContainer(ctx, v.ID()); err != nil {
					t.Fatalf("removing the container: %v", err)
				}
				wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				res, err := p.Wait(wctx)
				switch {
				case errors.Is(err, context.DeadlineExceeded) && wctx.Err() != nil:
					t.Fatal("Wait still hangs 30 s after the container went away")
				case err == nil && res.ExitCode != 137:
					t.Errorf("Wait: %+v; want an error, or death by SIGKILL", res)
				}
				start := time.Now()
				if err := p.Signal(syscall.SIGTERM); err == nil {
					t.Error("Signal to a process of a gone container: no error")
				}
				if _, err := vm.Start(ctx, v, exec.Command{Name: "true"}); err == nil {
					t.Error("Start in a gone container: no error")
				}
				if d := time.Since(start); d > 10*time.Second {
					t.Errorf("the calls on a dead sandbox took %v", d)
				}
				return nil
			}},
		{Name: "process/flood", Promise: "a process flooding its output with nobody reading is never held back, and memory stays bounded on both sides: the ring drops its head, the result keeps head and tail, the agent's peak memory hardly moves",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				before := agentPeakKiB(ctx, t, v)
				cmd := exec.Command{Name: "cat", Args: []string{"/dev/zero"}, MaxOutputBytes: 64 << 10}
				p := start(ctx, t, v, cmd)
				deadline := time.Now().Add(60 * time.Second)
				for p.Stdout().Len() < 64<<20 {
					if time.Now().After(deadline) {
						t.Fatalf("after 60 s only %d bytes came: the flood was held back", p.Stdout().Len())
					}
					time.Sleep(10 * time.Millisecond)
				}
				if from, b := p.Stdout().Bytes(); from == 0 || len(b) > 64<<10 {
					t.Errorf("the ring holds %d bytes from %d; want at most 64 KiB, its head dropped", len(b), from)
				}
				// Its window bounds what the agent holds of a stream.
				after := agentPeakKiB(ctx, t, v)
				t.Logf("the agent's peak memory: %d KiB before, %d after 64 MiB went through it", before, after)
				if after > before+16<<10 {
					t.Errorf("the agent's peak memory went from %d to %d KiB while 64 MiB went through it", before, after)
				}
				if err := p.Kill(); err != nil {
					t.Fatal(err)
				}
				res, err := p.Wait(ctx)
				// Head and tail within the cap, and the marker between.
				if err != nil || res.StdoutBytes < 32<<20 || !res.Truncated || len(res.Stdout) > 64<<10+100 {
					t.Fatalf("Wait: %d bytes counted, %d kept, truncated %v, %v", res.StdoutBytes, len(res.Stdout), res.Truncated, err)
				}
				return []observation{outcome("flood", "bounded")}
			}},
		{Name: "process/stdin-unread", Promise: "a write to the stdin of a process that never reads blocks, and returns ErrProcessDone once the process is killed",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				p := start(ctx, t, v, exec.Command{Name: "sleep", Args: []string{"3081"}})
				wrote := make(chan error, 1)
				go func() {
					_, err := p.Stdin().Write(make([]byte, 16<<20))
					wrote <- err
				}()
				select {
				case err := <-wrote:
					t.Fatalf("16 MiB written to a stdin nobody reads: %v", err)
				case <-time.After(500 * time.Millisecond):
				}
				if err := p.Kill(); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-wrote:
					if !errors.Is(err, vm.ErrProcessDone) {
						t.Errorf("the blocked write: %v; want ErrProcessDone", err)
					}
				case <-time.After(30 * time.Second):
					t.Fatal("the blocked write still blocks 30 s after the kill")
				}
				return []observation{outcome("stdin-unread", "released")}
			}},
		{Name: "process/limit", Promise: "of 100 Starts at once, a sandbox holds vm.MaxProcesses processes and refuses the rest with ErrLimit, saying so, until one ends",
			Deadline: 2 * time.Minute,
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				var held []*vm.Process
				var mu sync.Mutex
				var wg sync.WaitGroup
				refused := 0
				for range 100 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						p, err := vm.Start(ctx, v, exec.Command{Name: "sleep", Args: []string{"3071"}})
						mu.Lock()
						defer mu.Unlock()
						switch {
						case err == nil:
							held = append(held, p)
						case errors.Is(err, vm.ErrLimit) && strings.Contains(err.Error(), "vm.MaxProcesses"):
							refused++
						default:
							t.Errorf("a Start: %v; want a process, or ErrLimit naming vm.MaxProcesses", err)
						}
					}()
				}
				wg.Wait()
				t.Cleanup(func() {
					for _, p := range held {
						_ = p.Kill()
					}
				})
				if len(held) != vm.MaxProcesses || refused != 100-vm.MaxProcesses {
					t.Fatalf("of 100 Starts at once, %d started (want vm.MaxProcesses, %d) and %d refused", len(held), vm.MaxProcesses, refused)
				}
				_, err := vm.Start(ctx, v, exec.Command{Name: "true"})
				if !errors.Is(err, vm.ErrLimit) || !strings.Contains(err.Error(), "vm.MaxProcesses") {
					t.Fatalf("Start past the limit: %v; want ErrLimit naming vm.MaxProcesses", err)
				}
				if err := held[0].Kill(); err != nil {
					t.Fatal(err)
				}
				if _, err := held[0].Wait(ctx); err != nil {
					t.Fatal(err)
				}
				p := start(ctx, t, v, exec.Command{Name: "true"})
				res, werr := p.Wait(ctx)
				want(t, res, werr, "", "", 0)
				return []observation{observe("past the limit", nil, err)}
			}},
		{Name: "process/removed", Promise: "Remove ends every process; its handle then answers at once",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				p := start(ctx, t, v, exec.Command{Name: "sleep", Args: []string{"3051"}})
				if err := v.Remove(ctx); err != nil {
					t.Fatalf("Remove: %v", err)
				}
				select {
				case <-p.Done():
				default:
					t.Fatal("Remove returned with the process still held")
				}
				res, err := p.Wait(ctx)
				if !errors.Is(err, vm.ErrRemoved) {
					t.Errorf("Wait after Remove: %+v, %v; want ErrRemoved", res, err)
				}
				if err := p.Signal(syscall.SIGTERM); !errors.Is(err, vm.ErrProcessDone) {
					t.Errorf("Signal after Remove: %v; want ErrProcessDone", err)
				}
				_, err = vm.Start(ctx, v, exec.Command{Name: "true"})
				if !errors.Is(err, vm.ErrRemoved) {
					t.Errorf("Start after Remove: %v; want ErrRemoved", err)
				}
				return []observation{observe("removed", nil, err)}
			}},
	}
}

// processHeld is the process/held case.
func processHeld(ctx context.Context, t *testing.T, v vm.VM) []observation {
	p := start(ctx, t, v, sh(`echo "pid $$"; while read -r l; do echo "got $l"; echo "err $l" >&2; done; exit 7`))
	if p.PID() <= 1 {
		t.Errorf("PID %d; want the command's pid in the sandbox", p.PID())
	}
	waitFor(t, p.Stdout(), "pid "+strconv.Itoa(p.PID())+"\n")
	live := p.Stdout().Reader(0)
	defer live.Close()
	buf := make([]byte, 64)
	n, _ := live.Read(buf) // the pid line
	if !strings.HasPrefix(string(buf[:n]), "pid ") {
		t.Fatalf("first read %q; want the pid line", buf[:n])
	}
	for _, l := range []string{"one", "two"} {
		if _, err := io.WriteString(p.Stdin(), l+"\n"); err != nil {
			t.Fatalf("writing %q: %v", l, err)
		}
		n, err := io.ReadAtLeast(live, buf, len("got "+l+"\n"))
		if err != nil || string(buf[:n]) != "got "+l+"\n" {
			t.Fatalf("read %q, %v; want the echo of %q", buf[:n], err, l)
		}
	}
	select {
	case <-p.Done():
		t.Fatal("the process ended with its stdin open")
	default:
	}
	if err := p.Stdin().Close(); err != nil {
		t.Fatalf("closing stdin: %v", err)
	}
	res, err := p.Wait(ctx)
	want(t, res, err, "pid "+strconv.Itoa(p.PID())+"\ngot one\ngot two\n", "err one\nerr two\n", 7)
	if res != nil && res.Usage == nil {
		t.Error("Wait's result has no usage: a held process is tracked as a Run is")
	}
	if n, err := live.Read(buf); n != 0 || err != io.EOF {
		t.Errorf("the live reader at the end: %d, %v; want EOF", n, err)
	}
	again, err := io.ReadAll(p.Stderr().Reader(0))
	if err != nil || string(again) != "err one\nerr two\n" {
		t.Errorf("stderr read again from 0: %q, %v", again, err)
	}
	res.Stdout = strings.Replace(res.Stdout, strconv.Itoa(p.PID()), "PID", 1) // differs between backends
	return []observation{observe("held", res, err)}
}

// start starts cmd in v, skipping the case where processes are not
// supported, failing it on any other error.
func start(ctx context.Context, t *testing.T, v vm.VM, cmd exec.Command) *vm.Process {
	t.Helper()
	p, err := vm.Start(ctx, v, cmd)
	skipIfNotSupported(t, err)
	if err != nil {
		t.Fatalf("Start %s: %v", cmd.Name, err)
	}
	t.Cleanup(func() { _ = p.Kill() })
	return p
}

// agentPeakKiB returns the peak resident memory of podvm's agent in v
// in KiB: the largest VmHWM of the processes named podvm-agent (the
// agent, and a file call of its that may be running).
func agentPeakKiB(ctx context.Context, t *testing.T, v vm.VM) int {
	t.Helper()
	res, err := v.Run(ctx, sh(`for p in $(pidof podvm-agent); do [ -r /proc/$p/status ] && grep VmHWM /proc/$p/status; done | sort -n -k2 | tail -n 1`))
	var kib int
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("reading the agent's memory: %+v, %v", res, err)
	}
	if _, err := fmt.Sscanf(res.Stdout, "VmHWM: %d kB", &kib); err != nil {
		t.Fatalf("the agent's VmHWM: %q: %v", res.Stdout, err)
	}
	return kib
}

// waitPS waits, 30 s at most, for the sandbox's process list to satisfy
// ok, failing t with what it waited for.
func waitPS(ctx context.Context, t *testing.T, v vm.VM, what string, ok func(ps string) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for ps := sandboxPS(ctx, t, v); !ok(ps); ps = sandboxPS(ctx, t, v) {
		if time.Now().After(deadline) {
			t.Fatalf("waited 30 s for %s:\n%s", what, ps)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitFor waits, 30 s at most, for o to hold want from its start.
func waitFor(t *testing.T, o *vm.Output, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, b := o.Bytes()
		if string(b) == want {
			return
		}
		if time.Now().After(deadline) || len(b) > len(want) {
			t.Fatalf("output %q; want %q", b, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// terminalShell is the terminal/shell case.
func terminalShell(ctx context.Context, t *testing.T, v vm.VM) []observation {
	cmd := exec.Command{Name: "sh", Args: []string{"-i"}, Env: []string{"PS1=podvm$ "}}
	p, err := vm.Start(ctx, v, cmd, vm.WithTerminal(30, 100))
	skipIfNotSupported(t, err)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { _ = p.Kill() })
	out := p.Stdout()
	seen := func(want string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, b := out.Bytes()
			if strings.Contains(string(b), want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the terminal shows %q; want %q in it", b, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	typed := func(s string) {
		t.Helper()
		if _, err := io.WriteString(p.Stdin(), s); err != nil {
			t.Fatalf("typing %q: %v", s, err)
		}
	}
	seen("podvm$ ")
	typed("stty size\n")
	seen("30 100\r\n")
	if err := p.Resize(40, 120); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	typed("stty size\n")
	seen("40 120\r\n")
	marker := strconv.FormatInt(time.Now().UnixNano()%1e9+1e9, 10)
	typed("sleep " + marker + "\n")
	waitPS(ctx, t, v, "the job to start", func(ps string) bool { return strings.Contains(ps, marker) })
	time.Sleep(50 * time.Millisecond) // the shell hands it the terminal
	typed("\x03")
	waitPS(ctx, t, v, "^C to end the foreground job", func(ps string) bool { return !strings.Contains(ps, marker) })
	typed("echo after-$?\n")
	seen("after-130")
	typed("exit 5\n")
	res, err := p.Wait(ctx)
	if err != nil || res.ExitCode != 5 || res.Stderr != "" {
		t.Fatalf("Wait: %+v, %v; want exit 5, nothing on stderr", res, err)
	}
	if err := p.Stdin().Close(); err != nil {
		t.Errorf("closing a terminal's stdin: %v", err)
	}
	return []observation{outcome("terminal", "exit 5")}
}

// liveRefused checks what the process and service cases skip on a path
// without podvm's agent: that it refuses each call, saying why; and on
// one with it, that each call reaches the sandbox.
func liveRefused(h Harness) func(ctx context.Context, t *testing.T, v vm.VM) []observation {
	return func(ctx context.Context, t *testing.T, v vm.VM) []observation {
		p, startErr := vm.Start(ctx, v, exec.Command{Name: "true"})
		c, dialErr := vm.Dial(ctx, v, "tcp", "127.0.0.1:1")
		if c != nil {
			_ = c.Close()
		}
		f, forwardErr := vm.Forward(ctx, v, "tcp", "127.0.0.1:1")
		if f != nil {
			_ = f.Close()
		}
		if h.Tracked() {
			if startErr == nil {
				if res, err := p.Wait(ctx); err != nil || res.ExitCode != 0 {
					t.Errorf("a started true: %+v, %v; want exit 0", res, err)
				}
			}
			if startErr != nil || !errors.Is(dialErr, syscall.ECONNREFUSED) || forwardErr != nil {
				t.Errorf("with the agent: Start %v, Dial %v, Forward %v; want a process, ECONNREFUSED and a forward", startErr, dialErr, forwardErr)
			}
			return nil
		}
		waitErr := vm.WaitListening(ctx, v, "tcp", "127.0.0.1:1")
		// podvm's own sandboxes name the setting that took the agent
		// away; another backend need only refuse.
		_, podvms := v.(vm.ProcessStarter)
		for _, c := range []struct {
			call string
			err  error
		}{{"Start", startErr}, {"Dial", dialErr}, {"WaitListening", waitErr}, {"Forward", forwardErr}} {
			if !errors.Is(c.err, vm.ErrNotSupported) || podvms && !strings.Contains(c.err.Error(), "PodmanExec") {
				t.Errorf("%s without the agent: %v; want vm.ErrNotSupported naming Config.PodmanExec", c.call, c.err)
			}
		}
		if ps := vm.Processes(v); len(ps) != 0 {
			t.Errorf("Processes without the agent: %d; want none", len(ps))
		}
		return nil
	}
}
