package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	osexec "os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/agent/server"
	"github.com/podvm/podvm/internal/testkit"
)

func TestRun(t *testing.T) {
	a := startAgent(t)
	dir := t.TempDir()
	noexec := filepath.Join(dir, "noexec")
	require.NoError(t, os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o644))
	wd, _ := os.Getwd()
	tests := []struct {
		name       string
		req        Request
		wantOut    string
		wantCode   int
		wantErr    error
		wantErrMsg string
	}{
		{name: "echo", req: Request{Argv: []string{"/bin/busybox", "echo", "hi"}}, wantOut: "hi\n"},
		{name: "path lookup", req: Request{Argv: []string{"busybox", "echo", "hi"}, Env: []string{"PATH=/nowhere:/bin"}}, wantOut: "hi\n"},
		{name: "exit code", req: Request{Argv: []string{"/bin/busybox", "sh", "-c", "exit 42"}}, wantCode: 42},
		{name: "signal", req: Request{Argv: []string{"/bin/busybox", "sh", "-c", "kill -TERM $$"}}, wantCode: 128 + 15},
		{name: "raw bytes in args", req: Request{Argv: []string{"/bin/busybox", "printf", "%s|%s", "\xff\xfe", "a\x01b"}}, wantOut: "\xff\xfe|a\x01b"},
		{name: "raw bytes in env", req: Request{Argv: []string{"/bin/busybox", "sh", "-c", `printf %s "$X"`}, Env: []string{"X=\xff\xfe\n"}}, wantOut: "\xff\xfe\n"},
		{name: "agent env inherited", req: Request{Argv: []string{"/bin/busybox", "sh", "-c", `printf %s "$PODVM_BASE"`}}, wantOut: "base"},
		{name: "command env wins", req: Request{Argv: []string{"/bin/busybox", "sh", "-c", `printf %s "$PODVM_BASE"`}, Env: []string{"PODVM_BASE=mine"}}, wantOut: "mine"},
		{name: "default dir", req: Request{Argv: []string{"/bin/busybox", "pwd"}}, wantOut: wd + "\n"},
		{name: "dir", req: Request{Argv: []string{"/bin/busybox", "pwd"}, Dir: dir}, wantOut: dir + "\n"},
		{name: "user by uid", req: Request{Argv: []string{"/bin/busybox", "id", "-u"}, User: "65534"}, wantOut: "65534\n"},
		{name: "user and group", req: Request{Argv: []string{"/bin/busybox", "id", "-g"}, User: "65534:4242"}, wantOut: "4242\n"},
		{name: "user by name", req: Request{Argv: []string{"/bin/busybox", "id", "-u"}, User: "root"}, wantOut: "0\n"},
		{name: "not found", req: Request{Argv: []string{"no-such-command-podvm"}}, wantCode: -1, wantErr: exec.ErrNotFound},
		{name: "not found by path", req: Request{Argv: []string{"/no/such/cmd"}}, wantCode: -1, wantErr: exec.ErrNotFound},
		{name: "not executable", req: Request{Argv: []string{noexec}}, wantCode: -1, wantErr: exec.ErrPermission},
		{name: "dir missing", req: Request{Argv: []string{"/bin/busybox", "true"}, Dir: "/no/such/dir"}, wantCode: -1, wantErr: exec.ErrDirNotFound},
		{name: "dir not a dir", req: Request{Argv: []string{"/bin/busybox", "true"}, Dir: noexec}, wantCode: -1, wantErr: exec.ErrDirNotFound},
		{name: "unknown user", req: Request{Argv: []string{"/bin/busybox", "true"}, User: "no-such-user-podvm"}, wantCode: -1, wantErr: ErrUnknownUser},
		{name: "NUL byte", req: Request{Argv: []string{"/bin/busybox", "echo", "a\x00b"}}, wantCode: -1, wantErr: exec.ErrInvalidCommand},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := a.run(context.Background(), tt.req, nil)
			if tt.wantErr != nil {
				require.ErrorIs(t, r.err, tt.wantErr)
				require.True(t, strings.HasPrefix(r.err.Error(), "agent: ") || errors.Is(r.err, exec.ErrInvalidCommand), r.err.Error())
			} else {
				require.NoError(t, r.err)
			}
			require.Equal(t, tt.wantCode, r.Code)
			require.Equal(t, tt.wantOut, r.stdout)
		})
	}
}

func TestInfo(t *testing.T) {
	a := startAgent(t)
	info := a.Info()
	require.Equal(t, 1, info.PID, "the agent is PID 1 of its namespace")
	require.Equal(t, runtime.GOARCH, info.Arch)
	require.Equal(t, 7, info.Version, "wire.Version")
}

func TestStdin(t *testing.T) {
	a := startAgent(t)
	t.Run("streamed", func(t *testing.T) {
		t.Parallel()
		in := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB, four windows
		r := a.run(context.Background(), Request{Argv: []string{"/bin/busybox", "cat"}}, strings.NewReader(in))
		require.NoError(t, r.err)
		require.Equal(t, len(in), len(r.stdout))
		require.Equal(t, in, r.stdout)
	})
	t.Run("never ends", func(t *testing.T) {
		t.Parallel()
		pr, pw := io.Pipe()
		defer pw.Close()
		r := a.run(context.Background(), Request{Argv: []string{"/bin/busybox", "echo", "done"}}, pr)
		require.NoError(t, r.err)
		require.Equal(t, "done\n", r.stdout)
	})
	t.Run("read error", func(t *testing.T) {
		t.Parallel()
		boom := errors.New("boom")
		r := a.run(context.Background(), Request{Argv: []string{"/bin/busybox", "cat"}}, io.MultiReader(strings.NewReader("x"), errReader{boom}))
		require.ErrorIs(t, r.err, boom)
		require.Equal(t, "x", r.stdout)
	})
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func TestConcurrent(t *testing.T) {
	a := startAgent(t)
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in := strings.NewReader(fmt.Sprintf("in%d\n", i))
			var out, errb testkit.LockedBuffer
			ex, err := a.Run(context.Background(), Request{Argv: []string{"/bin/busybox", "sh", "-c", `read x; echo "$x $1"; echo "e$1" >&2; exit $1`, "sh", strconv.Itoa(i)}}, in, &out, &errb)
			assert.NoError(t, err)
			assert.Equal(t, i, ex.Code)
			assert.Equal(t, fmt.Sprintf("in%d %d\n", i, i), out.String())
			assert.Equal(t, fmt.Sprintf("e%d\n", i), errb.String())
		}()
	}
	wg.Wait()
}

// blockingWriter blocks every Write until release is closed.
type blockingWriter struct{ release chan struct{} }

func (w blockingWriter) Write(p []byte) (int, error) {
	<-w.release
	return len(p), nil
}

func TestSlowReaderStallsOnlyItsRun(t *testing.T) {
	a := startAgent(t)
	slow := blockingWriter{release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		ex, err := a.Run(context.Background(), Request{Argv: []string{"/bin/busybox", "sh", "-c", "/bin/busybox yes | /bin/busybox head -c 10000000"}}, nil, slow, nil)
		if err == nil && ex.Code != 0 {
			err = fmt.Errorf("exit %d", ex.Code)
		}
		done <- err
	}()
	for i := range 20 {
		r := a.sh(context.Background(), `/bin/busybox head -c 1000000 /dev/zero; echo $1 >&2`, strconv.Itoa(i))
		require.NoError(t, r.err)
		require.Len(t, r.stdout, 1000000)
		require.Equal(t, strconv.Itoa(i)+"\n", r.stderr)
	}
	select {
	case err := <-done:
		t.Fatalf("the slow run ended while its writer was blocked: %v", err)
	default:
	}
	close(slow.release)
	require.NoError(t, <-done)
}

// escapes are ways a command leaves processes behind. Each script
// starts them in the background with the marker ($1) in a command line;
// tail, when set, is what the run then does until it is killed.
var escapes = []struct {
	name, script, tail, user string
	prefix                   []string
	many                     int // processes with the marker to wait for before a kill
}{
	{name: "setsid", script: `/bin/busybox setsid /bin/busybox sleep $1 &`},
	{name: "double fork", script: `(/bin/busybox sleep $1 &) &`},
	{name: "setsid env -i", script: `/bin/busybox setsid /bin/busybox env -i /bin/busybox sleep $1 &`},
	{name: "renamed", script: `/bin/bash -c 'exec -a podvm-renamed-$0 /bin/sleep 1000' $1 &`},
	{name: "switched uid", script: `/usr/bin/setpriv --reuid=65534 --regid=65534 --clear-groups /bin/busybox sleep $1 &`},
	{
		// Every process calls setsid, forks two more and becomes a sleep:
		// the tree fills the limit and stays there. (A bomb that loops on
		// fork collapses under busybox sh, which exits when fork fails.)
		name:   "setsid fork bomb",
		script: `B='/bin/busybox setsid /bin/busybox sh -c "$0" "$0" "$1" & /bin/busybox setsid /bin/busybox sh -c "$0" "$0" "$1" & exec /bin/busybox sleep 1000 "$1"'; /bin/busybox setsid /bin/busybox sh -c "$B" "$B" "$1" &`,
		tail:   "read x", // forks fail at the limit; read does not fork
		user:   "65534",
		prefix: []string{"/usr/bin/prlimit", "--nproc=200"},
		many:   50,
	},
}

func TestEscapesAreKilled(t *testing.T) {
	a := startAgent(t)
	for _, e := range escapes {
		for _, kill := range []bool{true, false} {
			name := e.name + "/normal end"
			if kill {
				name = e.name + "/kill"
			}
			t.Run(name, func(t *testing.T) {
				marker := strconv.Itoa(1_000_000 + rand.IntN(8_000_000))
				tail := "/bin/busybox sleep 0.3"
				if kill {
					tail = "/bin/busybox sleep 1000"
					if e.tail != "" {
						tail = e.tail
					}
				}
				argv := append(append([]string{}, e.prefix...), "/bin/busybox", "sh", "-c", e.script+"\n"+tail, "sh", marker)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				res := make(chan result, 1)
				stdin, hold := io.Pipe() // never ends
				defer hold.Close()
				go func() { res <- a.run(ctx, Request{Argv: argv, User: e.user}, stdin) }()
				var r result
				if kill {
					seen := 0
					for deadline := time.Now().Add(10 * time.Second); seen < max(e.many, 1) && time.Now().Before(deadline); {
						seen = len(alive(marker))
						time.Sleep(10 * time.Millisecond)
					}
					require.GreaterOrEqual(t, seen, max(e.many, 1), "the escape never started")
					cancel()
					r = <-res
					require.ErrorIs(t, r.err, context.Canceled)
					require.NotErrorIs(t, r.err, ErrNotKilled)
					require.True(t, r.Killed)
				} else {
					r = <-res
					require.NoError(t, r.err)
					require.Positive(t, r.Leftovers, "the escape was still running at the end")
				}
				require.Empty(t, alive(marker), "processes of the run survive")
			})
		}
	}
}

func TestUsage(t *testing.T) {
	a := startAgent(t)
	t.Run("cpu", func(t *testing.T) {
		t.Parallel()
		r := a.run(context.Background(), helperRequest("burn"), nil)
		require.NoError(t, r.err)
		require.Equal(t, 0, r.Code, r.stderr)
		require.GreaterOrEqual(t, r.Usage.UserCPU, 900*time.Millisecond)
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		r := a.run(context.Background(), helperRequest("touch"), nil)
		require.NoError(t, r.err)
		require.Equal(t, 0, r.Code, r.stderr)
		require.GreaterOrEqual(t, r.Usage.PeakRSS, int64(64<<20))
	})
	t.Run("whole tree", func(t *testing.T) {
		t.Parallel()
		exe, _ := os.Executable()
		// The burner is orphaned (its parent exits at once) and reaped by
		// the shim: its CPU time still counts.
		pidFile := filepath.Join(t.TempDir(), "pid")
		script := `("$0" & echo $! > "$1"); while ! [ -s "$1" ] || /bin/busybox kill -0 $(/bin/busybox cat "$1") 2>/dev/null; do /bin/busybox sleep 0.05; done`
		r := a.run(context.Background(), Request{Argv: []string{"/bin/busybox", "sh", "-c", script, exe, pidFile},
			Env: []string{helperEnv + "=burn"}}, nil)
		require.NoError(t, r.err)
		require.GreaterOrEqual(t, r.Usage.UserCPU, 900*time.Millisecond)
	})
}

func TestChannelCut(t *testing.T) {
	a := startAgent(t)
	res := make(chan result, 4)
	for range 4 {
		go func() { res <- a.sh(context.Background(), "echo started; /bin/busybox sleep 1000") }()
	}
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL)) // unshare --kill-child takes the agent with it
	for range 4 {
		select {
		case r := <-res:
			require.ErrorIs(t, r.err, ErrChannelClosed)
		case <-time.After(10 * time.Second):
			t.Fatal("a run in flight did not fail within 10s of the channel's end")
		}
	}
	start := time.Now()
	r := a.sh(context.Background(), "true")
	require.ErrorIs(t, r.err, ErrChannelClosed)
	require.Less(t, time.Since(start), 10*time.Second, "a run on a dead channel fails at once, never waits")
}

// podmanCaps is Podman's default capability set: a sandboxed root has
// no CAP_SYS_PTRACE.
const podmanCaps = "-all,+chown,+dac_override,+fowner,+fsetid,+kill,+net_bind_service,+setfcap,+setgid,+setpcap,+setuid,+sys_chroot"

func TestAttacksOnPID1Fail(t *testing.T) {
	a := startAgent(t)
	req := helperRequest("attack")
	req.Argv = append([]string{"/usr/bin/setpriv", "--bounding-set=" + podmanCaps, "--inh-caps=-all"}, req.Argv...)
	r := a.run(context.Background(), req, nil)
	require.NoError(t, r.err, r.stderr)
	require.Equal(t, 0, r.Code, r.stderr)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	require.Len(t, lines, 12, r.stdout)
	t.Log(r.stdout)
	for _, l := range lines {
		assert.True(t, strings.HasPrefix(l, "denied "), l)
	}
	// PID 1 survived every signal and still serves.
	r = a.sh(context.Background(), "echo alive")
	require.NoError(t, r.err)
	require.Equal(t, "alive\n", r.stdout)
}

func TestShutdownKillsEverything(t *testing.T) {
	a := startAgent(t)
	marker := strconv.Itoa(1_000_000 + rand.IntN(8_000_000))
	res := make(chan result, 1)
	go func() {
		res <- a.sh(context.Background(), `/bin/busybox setsid /bin/busybox sleep $1 & /bin/busybox sleep $1`, marker)
	}()
	// The two sleeps, not the shell, whose argv holds the marker too
	// until it execs: counting it, a first look saw two while the
	// setsid'd sleep was not there yet.
	sleeps := func() []string {
		return slices.DeleteFunc(alive(marker), func(p string) bool { return !strings.HasSuffix(p, ":/bin/busybox sleep "+marker+" ") })
	}
	for deadline := time.Now().Add(10 * time.Second); len(sleeps()) < 2 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	require.Len(t, sleeps(), 2, "all: %q", alive(marker))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, a.Shutdown(ctx))
	r := <-res
	require.True(t, r.err != nil || r.Killed, "the run was not ended by the shutdown")
	require.Empty(t, alive(marker))
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent did not exit after Shutdown")
	}
}

// settle waits for the goroutine count to drop to at most want, and
// returns the last count.
func settle(want int) int {
	n := runtime.NumGoroutine()
	for deadline := time.Now().Add(10 * time.Second); n > want && time.Now().Before(deadline); n = runtime.NumGoroutine() {
		time.Sleep(20 * time.Millisecond)
	}
	return n
}

func countFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// descendants counts the host processes under pid.
func descendants(pid int) int {
	n := 0
	for _, c := range childrenOf(pid) {
		n += 1 + descendants(c)
	}
	return n
}

func childrenOf(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

func TestNoLeaks(t *testing.T) {
	if testing.Short() {
		t.Skip("2,000 runs")
	}
	a := startAgent(t)
	// Warm up: the first runs start shims, goroutines of the runtime.
	for range 10 {
		require.NoError(t, a.sh(context.Background(), "true").err)
	}
	goroutines, fds := settle(0), countFDs(t)
	for i := range 2000 {
		ex, err := a.Run(context.Background(), Request{Argv: []string{"/bin/true"}}, nil, io.Discard, io.Discard)
		require.NoError(t, err, "run %d", i)
		require.Equal(t, 0, ex.Code)
	}
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 4 {
				ex, err := a.Run(context.Background(), Request{Argv: []string{"/bin/busybox", "echo", "x"}}, strings.NewReader("in"), io.Discard, io.Discard)
				assert.NoError(t, err)
				assert.Equal(t, 0, ex.Code)
			}
		}()
	}
	wg.Wait()
	require.LessOrEqual(t, settle(goroutines), goroutines, "goroutines leak")
	require.Equal(t, fds, countFDs(t), "fds leak")
	// unshare → agent → at most the idle shims (the pool keeps up to 32,
	// server.maxIdle) and a spare being started.
	agentPID := childrenOf(a.cmd.Process.Pid)
	require.Len(t, agentPID, 1)
	var n int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if n = descendants(agentPID[0]); n <= 32+1 {
			break
		}
	}
	require.LessOrEqual(t, n, 32+1, "processes left in the sandbox beyond the idle shims")
}

// The agent and each shim make every thread they will need before they
// serve (at a full pids limit the Go runtime could make none, and would
// die of it): at least server.AgentThreads and server.ShimThreads, a
// thread or two more at times as the runtime made them meanwhile, and
// bursts of runs that start, fail to start, stream, spawn, end and are
// killed make them no more.
func TestThreadsMadeBeforeServing(t *testing.T) {
	a := startAgent(t)
	agentPID := childrenOf(a.cmd.Process.Pid)
	require.Len(t, agentPID, 1)
	agentThreads := threadsOf(agentPID[0])
	require.GreaterOrEqual(t, agentThreads, server.AgentThreads, "the agent's threads once it said Hello")
	burst := func() {
		var wg sync.WaitGroup
		for i := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				switch i % 4 {
				case 0:
					a.sh(ctx, "/bin/busybox head -c 1000000 /dev/zero")
				case 1:
					a.run(ctx, Request{Argv: []string{"no-such-command-podvm"}}, nil)
				case 2:
					a.sh(ctx, "/bin/busybox sleep 10") // killed
				case 3:
					a.sh(ctx, "for i in 1 2 3 4 5 6 7 8; do /bin/busybox sleep 0.1 & done; wait")
				}
			}()
		}
		wg.Wait()
	}
	// shims returns the threads of every live shim, once each has made
	// them (a spare may still be starting).
	shims := func() map[int]int {
		out := map[int]int{}
		for _, pid := range childrenOf(agentPID[0]) {
			n := threadsOf(pid)
			for deadline := time.Now().Add(5 * time.Second); n > 0 && n < server.ShimThreads && time.Now().Before(deadline); n = threadsOf(pid) {
				time.Sleep(10 * time.Millisecond)
			}
			if n > 0 {
				out[pid] = n
			}
		}
		return out
	}
	burst() // the pool keeps up to 32 shims after it
	before := shims()
	require.NotEmpty(t, before)
	for pid, n := range before {
		require.GreaterOrEqual(t, n, server.ShimThreads, "the threads of shim %d", pid)
	}
	burst() // most of its runs are served by those shims
	require.Equal(t, agentThreads, threadsOf(agentPID[0]), "the agent's threads after two bursts")
	for pid, n := range shims() {
		if was, ok := before[pid]; ok {
			require.Equal(t, was, n, "the threads of shim %d after it served the second burst", pid)
		} else {
			require.GreaterOrEqual(t, n, server.ShimThreads, "the threads of shim %d", pid)
		}
	}
}

// threadsOf returns the number of threads of host process pid, 0 when
// it is gone or a zombie.
func threadsOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil || strings.Contains(string(b), "\nState:\tZ") {
		return 0
	}
	_, rest, _ := strings.Cut(string(b), "\nThreads:")
	line, _, _ := strings.Cut(rest, "\n")
	n, _ := strconv.Atoi(strings.TrimSpace(line))
	return n
}

func TestEmbeddedBinaryRuns(t *testing.T) {
	needAgent(t)
	b, err := Binary(runtime.GOARCH)
	if errors.Is(err, ErrArch) {
		t.Skipf("no embedded agent for %s", runtime.GOARCH)
	}
	require.NoError(t, err)
	bin := filepath.Join(t.TempDir(), "podvm-agent")
	require.NoError(t, os.WriteFile(bin, b, 0o755))
	a := startAgentBinary(t, bin)
	r := a.sh(context.Background(), "echo embedded")
	require.NoError(t, r.err)
	require.Equal(t, "embedded\n", r.stdout)
}

// startConnectAgent starts the agent, in a PID namespace of its own,
// connecting to a socket this test listens on, and returns the client
// of that connection and a channel closed when the agent exits.
func startConnectAgent(t testing.TB) (*Client, <-chan struct{}) {
	t.Helper()
	needAgent(t)
	sock := filepath.Join(t.TempDir(), "host.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer l.Close()
	cmd := osexec.Command("/usr/bin/unshare", "--pid", "--fork", "--mount-proc", "--kill-child", agentBin, "-connect", sock)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	require.NoError(t, l.(*net.UnixListener).SetDeadline(time.Now().Add(10*time.Second)))
	conn, err := l.Accept()
	require.NoError(t, err)
	c, err := NewClient(conn)
	require.NoError(t, err)
	return c, done
}

func TestConnectServesOneHost(t *testing.T) {
	c, exited := startConnectAgent(t)
	var out testkit.LockedBuffer
	ex, err := c.Run(context.Background(), Request{Argv: []string{"/bin/busybox", "echo", "connected"}}, nil, &out, nil)
	require.NoError(t, err)
	require.Equal(t, 0, ex.Code)
	require.Equal(t, "connected\n", out.String())

	// When the host's connection ends, every run is killed and the
	// agent exits.
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		_, _ = c.Run(context.Background(), Request{Argv: []string{"/bin/busybox", "sleep", "1000"}}, nil, nil, nil)
	}()
	time.Sleep(100 * time.Millisecond)
	c.Close()
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		t.Fatal("the agent did not exit when its connection ended")
	}
	<-ran
}

func TestConnectFailsWithoutAHost(t *testing.T) {
	needAgent(t)
	cmd := osexec.Command("/usr/bin/unshare", "--pid", "--fork", "--mount-proc", "--kill-child", agentBin, "-connect", filepath.Join(t.TempDir(), "none.sock"))
	err := cmd.Run()
	var ee *osexec.ExitError
	require.ErrorAs(t, err, &ee, "no socket to connect to: the agent exits at once")
}
