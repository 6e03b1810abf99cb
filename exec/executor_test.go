package exec_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/testkit"
)

var host = exec.NewCommandExecutor()

func TestRunArgumentsVerbatim(t *testing.T) {
	t.Parallel()
	args := []string{"$(touch /tmp/pwned)", "`id`", "*", "a;b", `"q"`, "'s'", "two words", "", "ünï€ødé", "\\n", "|&>"}
	res, err := host.Run(context.Background(), helper("args", args...))
	require.NoError(t, err)
	got := strings.Split(strings.TrimSuffix(res.Stdout, "\x00"), "\x00")
	assert.Equal(t, args, got)
}

func TestRunExitCodesAndStreams(t *testing.T) {
	t.Parallel()
	for _, code := range []int{0, 1, 7, 255} {
		t.Run(strconv.Itoa(code), func(t *testing.T) {
			t.Parallel()
			res, err := host.Run(context.Background(), helper("out", "to stdout", "to stderr", strconv.Itoa(code)))
			require.NoError(t, err, "a non-zero exit is data, not an error")
			assert.Equal(t, code, res.ExitCode)
			assert.Equal(t, "to stdout", res.Stdout)
			assert.Equal(t, "to stderr", res.Stderr)
			assert.Equal(t, int64(9), res.StdoutBytes)
			assert.False(t, res.TimedOut)
			assert.False(t, res.Truncated)
			assert.Positive(t, res.Duration)
		})
	}
}

func TestRunSignalExitCode(t *testing.T) {
	t.Parallel()
	for sig, want := range map[syscall.Signal]int{syscall.SIGKILL: 137, syscall.SIGTERM: 143} {
		res, err := host.Run(context.Background(), helper("signal", strconv.Itoa(int(sig))))
		require.NoError(t, err)
		assert.Equal(t, want, res.ExitCode, "death by %v is 128+signal", sig)
		assert.False(t, res.TimedOut, "a signal from elsewhere is not a timeout")
	}
}

func TestRunEnv(t *testing.T) {
	t.Setenv("PODVM_FROM_HOST", "leaked")
	t.Run("nil inherits the calling process's environment", func(t *testing.T) {
		cmd := helper("env")
		res, err := host.Run(context.Background(), cmd)
		require.NoError(t, err)
		assert.Contains(t, strings.Split(res.Stdout, "\n"), "PODVM_FROM_HOST=leaked")
	})
	t.Run("command entries win over the base", func(t *testing.T) {
		x := exec.NewCommandExecutor(exec.WithBaseEnv([]string{"A=base", "B=base"}))
		cmd := helper("env")
		cmd.Env = append(cmd.Env, "B=cmd", "C=cmd")
		res, err := x.Run(context.Background(), cmd)
		require.NoError(t, err)
		assert.ElementsMatch(t, []string{"A=base", "B=cmd", "C=cmd", "PODVM_TEST_HELPER=1"}, strings.Split(res.Stdout, "\n"))
	})
	t.Run("empty base environment", func(t *testing.T) {
		x := exec.NewCommandExecutor(exec.WithBaseEnv(nil))
		res, err := x.Run(context.Background(), helper("env"))
		require.NoError(t, err)
		assert.Equal(t, "PODVM_TEST_HELPER=1", res.Stdout)
	})
}

func TestRunDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd := helper("pwd")
	cmd.Dir = dir
	res, err := host.Run(context.Background(), cmd)
	require.NoError(t, err)
	want, _ := filepath.EvalSymlinks(dir)
	assert.Equal(t, want, res.Stdout)

	cmd.Dir = filepath.Join(dir, "missing")
	res, err = host.Run(context.Background(), cmd)
	require.ErrorIs(t, err, exec.ErrDirNotFound)
	assert.Contains(t, err.Error(), cmd.Dir, "the error names the directory")
	assert.Nil(t, res)
}

func TestRunStdin(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("0123456789abcdef"), 5<<20/16)
	for name, in := range map[string][]byte{"small": []byte("hello\n"), "5MB": big, "empty": nil} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := helper("cat")
			cmd.Stdin = bytes.NewReader(in)
			cmd.MaxOutputBytes = 8 << 20
			res, err := host.Run(context.Background(), cmd)
			require.NoError(t, err)
			assert.Equal(t, string(in), res.Stdout)
		})
	}
	t.Run("nil stdin reads empty input", func(t *testing.T) {
		t.Parallel()
		// The system's cat: a Go program would not see a closed stdin,
		// as its runtime opens /dev/null in its place.
		res, err := host.Run(context.Background(), exec.Command{Name: "cat"})
		require.NoError(t, err)
		assert.Empty(t, res.Stdout)
		assert.Empty(t, res.Stderr, "stdin is open and empty, not closed")
		assert.Equal(t, 0, res.ExitCode)
	})
}

// A Stdin that never ends, with a command that never reads it, must not
// hold Run: os/exec's own copy would keep Wait waiting for it forever.
func TestRunStdinThatNeverEnds(t *testing.T) {
	t.Parallel()
	for name, cmd := range map[string]exec.Command{
		"ignored":       helper("out", "", "", "0"),
		"read a little": {Name: "head", Args: []string{"-c", "1"}},
		"timed out":     {Name: "sleep", Args: []string{"60"}, Timeout: 200 * time.Millisecond},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r, w := io.Pipe()
			defer w.Close()
			go w.Write([]byte("x")) // at most one byte, then silence
			cmd.Stdin = r
			done := make(chan struct{})
			go func() {
				defer close(done)
				host.Run(context.Background(), cmd)
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("Run is still waiting for a stdin that never ends")
			}
		})
	}
}

// A Stdin that fails is reported, not mistaken for the end of the input.
func TestRunStdinReadError(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	cmd := helper("cat")
	cmd.Stdin = io.MultiReader(strings.NewReader("part"), iotest.ErrReader(boom))
	res, err := host.Run(context.Background(), cmd)
	require.ErrorIs(t, err, boom)
	require.NotNil(t, res)
	assert.Equal(t, "part", res.Stdout)
}

// A command that stops reading its input is not an error, even when Stdin
// copies itself (io.WriterTo) and wraps the pipe's error on the way.
func TestRunStdinNotReadIsNoError(t *testing.T) {
	t.Parallel()
	res, err := host.Run(context.Background(), exec.Command{Name: "true", Stdin: endlessWriterTo{}})
	require.NoError(t, err)
	assert.Equal(t, 0, res.ExitCode)
}

// endlessWriterTo writes zeros until its writer fails, and wraps that error
// as *net.TCPConn's WriteTo does.
type endlessWriterTo struct{}

func (endlessWriterTo) Read(p []byte) (int, error) { return len(p), nil }

func (endlessWriterTo) WriteTo(w io.Writer) (int64, error) {
	buf := make([]byte, 32<<10)
	var n int64
	for {
		m, err := w.Write(buf)
		n += int64(m)
		if err != nil {
			return n, fmt.Errorf("writeto: %w", err)
		}
	}
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(fds)
}

// A command that cannot start leaves no descriptor open, stdin's pipe
// included.
func TestRunStartFailureLeaksNoFD(t *testing.T) {
	before := openFDs(t)
	for range 50 {
		_, err := host.Run(context.Background(), exec.Command{Name: "/nonexistent/prog", Stdin: strings.NewReader("x")})
		require.ErrorIs(t, err, exec.ErrNotFound)
	}
	assert.LessOrEqual(t, openFDs(t), before+2, "descriptors open after 50 failed starts")
}

func TestRunCapKeepsHeadAndTrueTail(t *testing.T) {
	t.Parallel()
	cmd := helper("lines", "100000")
	cmd.MaxOutputBytes = 1000
	var live bytes.Buffer
	cmd.Stdout = &live
	res, err := host.Run(context.Background(), cmd)
	require.NoError(t, err)

	assert.True(t, res.Truncated)
	assert.Equal(t, int64(live.Len()), res.StdoutBytes, "StdoutBytes counts every byte")
	assert.True(t, strings.HasPrefix(live.String(), "line 1\nline 2\n"))
	assert.True(t, strings.HasSuffix(live.String(), "line 99999\nline 100000\n"), "the live writer gets the whole stream")
	assert.True(t, strings.HasPrefix(res.Stdout, "line 1\nline 2\n"), "the head is kept")
	assert.True(t, strings.HasSuffix(res.Stdout, "line 100000\n"), "the tail is kept")
	assert.Contains(t, res.Stdout, "bytes omitted")
	assert.Less(t, len(res.Stdout), 1100)
	assert.Equal(t, "line 99998\nline 99999\nline 100000\n", res.StdoutTail(3))
	assert.NotContains(t, res.StdoutTail(1000), "line 1\n", "tails never reach into the head")
}

// 300 MB through a 1 MiB cap must not cost memory in proportion.
func TestRunMemoryBounded(t *testing.T) {
	cmd := helper("bytes", strconv.Itoa(300<<20))
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	res, err := host.Run(context.Background(), cmd)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Equal(t, int64(300<<20), res.StdoutBytes)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("allocated %.1f MiB for 300 MiB of output", float64(alloc)/(1<<20))
	assert.Less(t, alloc, uint64(16<<20), "allocation must stay bounded by the cap, not the output")
	assert.LessOrEqual(t, len(res.Stdout), exec.DefaultMaxOutputBytes+64)
}

// pidsOf parses the pids a shell printed, one per line.
func pidsOf(t *testing.T, out string) []int {
	t.Helper()
	var pids []int
	for _, f := range strings.Fields(out) {
		pid, err := strconv.Atoi(f)
		require.NoError(t, err, "output %q", out)
		pids = append(pids, pid)
	}
	return pids
}

func requireAllDead(t *testing.T, pids []int) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, p := range pids {
			if testkit.Alive(p) {
				return false
			}
		}
		return true
	}, 2*time.Second, 20*time.Millisecond, "processes %v survived", pids)
}

// The case from golang/go #23019: a grandchild holds the pipes.
const grandchildScript = `echo $$; sleep 60 & echo $!; sleep 60`

func TestRunTimeoutKillsProcessTree(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	start := time.Now()
	res, err := host.Run(context.Background(), exec.Command{Name: "sh", Args: []string{"-c", grandchildScript}, Timeout: timeout})
	elapsed := time.Since(start)

	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Contains(t, err.Error(), "timed out after 300ms")
	require.NotNil(t, res, "a timeout returns the partial result")
	assert.True(t, res.TimedOut)
	assert.Equal(t, -1, res.ExitCode)
	assert.Less(t, elapsed, timeout+exec.DefaultKillGrace+time.Second, "returns within the deadline plus a short grace")
	pids := pidsOf(t, res.Stdout)
	require.Len(t, pids, 2, "partial output is kept")
	requireAllDead(t, pids)
}

func TestRunCancelKillsProcessTree(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	res, err := host.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", grandchildScript}})
	require.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, context.DeadlineExceeded)
	require.NotNil(t, res)
	assert.True(t, res.TimedOut)
	assert.Equal(t, -1, res.ExitCode)
	requireAllDead(t, pidsOf(t, res.Stdout))
}

func TestRunParentDeadline(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	res, err := host.Run(ctx, exec.Command{Name: "sleep", Args: []string{"10"}})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, res.TimedOut)
}

func TestRunAlreadyCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	res, err := host.Run(ctx, exec.Command{Name: "true"})
	require.ErrorIs(t, err, context.Canceled)
	assert.Nil(t, res, "nothing started")
}

func TestRunKillsLeftoversAfterExit(t *testing.T) {
	t.Parallel()
	start := time.Now()
	res, err := host.Run(context.Background(), exec.Command{Name: "sh", Args: []string{"-c", "sleep 60 & echo $!"}})
	require.NoError(t, err)
	assert.Equal(t, 0, res.ExitCode)
	assert.Less(t, time.Since(start), 5*time.Second, "a background child holding the pipes does not hold Run")
	requireAllDead(t, pidsOf(t, res.Stdout))
}

// A live writer slower than the grace still gets every byte: the grace
// measures idle pipes, not slow readers.
func TestRunSlowLiveWriterGetsEverything(t *testing.T) {
	t.Parallel()
	grace := 100 * time.Millisecond
	x := exec.NewCommandExecutor(exec.WithKillGrace(grace))
	var got bytes.Buffer
	cmd := exec.Command{Name: "head", Args: []string{"-c", "200000", "/dev/zero"},
		Stdout: &testkit.SlowWriter{W: &got, Delay: 3 * grace}}
	res, err := x.Run(context.Background(), cmd)
	require.NoError(t, err)
	assert.Equal(t, int64(200000), res.StdoutBytes)
	assert.Equal(t, 200000, got.Len())
}

func TestRunLiveWriterError(t *testing.T) {
	t.Parallel()
	cmd := helper("out", "data", "", "0")
	cmd.Stdout = testkit.FailingWriter{Err: errDiskFull}
	res, err := host.Run(context.Background(), cmd)
	require.ErrorContains(t, err, "stdout writer: disk full")
	require.NotNil(t, res)
	assert.Equal(t, "data", res.Stdout, "the capture goes on")
}

var errDiskFull = errors.New("disk full")

func TestRunStartErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	noExec := filepath.Join(dir, "noexec")
	require.NoError(t, os.WriteFile(noExec, []byte("#!/bin/sh\n"), 0o644))
	noShebang := filepath.Join(dir, "noshebang")
	require.NoError(t, os.WriteFile(noShebang, []byte("\x00\x01garbage"), 0o755))

	for _, tc := range []struct {
		name string
		want error
	}{
		{"podvm-no-such-command", exec.ErrNotFound},
		{filepath.Join(dir, "missing"), exec.ErrNotFound},
		{noExec, exec.ErrPermission},
		{noShebang, exec.ErrPermission},
		{dir, exec.ErrPermission},
	} {
		res, err := host.Run(context.Background(), exec.Command{Name: tc.name})
		assert.ErrorIs(t, err, tc.want, tc.name)
		assert.ErrorContains(t, err, tc.name, "the error names the command")
		assert.Nil(t, res)
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		what string
		cmd  exec.Command
	}{
		{"empty name", exec.Command{}},
		{"NUL in name", exec.Command{Name: "ls\x00"}},
		{"NUL in arg", exec.Command{Name: "ls", Args: []string{"a\x00b"}}},
		{"NUL in env", exec.Command{Name: "ls", Env: []string{"A=\x00"}}},
		{"NUL in dir", exec.Command{Name: "ls", Dir: "/tmp\x00"}},
		{"env without =", exec.Command{Name: "ls", Env: []string{"A"}}},
		{"env with empty key", exec.Command{Name: "ls", Env: []string{"=x"}}},
		{"negative timeout", exec.Command{Name: "ls", Timeout: -time.Second}},
		{"negative cap", exec.Command{Name: "ls", MaxOutputBytes: -1}},
		{"negative memory limit", exec.Command{Name: "ls", MaxMemoryBytes: -1}},
		{"negative pids limit", exec.Command{Name: "ls", MaxPids: -1}},
		{"negative CPU time", exec.Command{Name: "ls", MaxCPUTime: -time.Second}},
		{"argument over 128 KiB", exec.Command{Name: "echo", Args: []string{strings.Repeat("a", exec.MaxArgBytes+1)}}},
		{"env entry over 128 KiB", exec.Command{Name: "env", Env: []string{"A=" + strings.Repeat("a", exec.MaxArgBytes)}}},
	} {
		res, err := host.Run(context.Background(), tc.cmd)
		assert.ErrorIs(t, err, exec.ErrInvalidCommand, tc.what)
		assert.Nil(t, res, tc.what)
		assert.True(t, strings.HasPrefix(err.Error(), "exec: "), "messages start with the package name: %v", err)
	}
	assert.NoError(t, exec.Command{Name: "ls", Env: []string{"A=", "B=c=d"}}.Validate())
}

// The longest argument Validate accepts is one the kernel really takes,
// and many of them together work too.
func TestLongArguments(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", exec.MaxArgBytes)
	res, err := host.Run(context.Background(), exec.Command{Name: "sh", Args: []string{"-c", `echo ${#1} ${#2} ${#3} ${#LONG}`, "sh", long, long, long},
		Env: []string{"LONG=" + long[5:]}})
	require.NoError(t, err)
	assert.Equal(t, "131071 131071 131071 131066\n", res.Stdout)
}

func TestMergeEnv(t *testing.T) {
	t.Parallel()
	base := []string{"A=1", "B=2"}
	assert.Equal(t, []string{"A=1", "B=3", "C=4"}, exec.MergeEnv(base, []string{"B=3", "C=4"}))
	assert.Equal(t, []string{"A=1", "B=2"}, base, "inputs are not modified")
	assert.Equal(t, []string{"A=2"}, exec.MergeEnv(nil, []string{"A=1", "A=2"}), "the last duplicate wins")
}
