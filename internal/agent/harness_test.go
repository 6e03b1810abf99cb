package agent

import (
	"context"
	"fmt"
	"io"
	"os"
	osexec "os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/testkit"
)

// agentBin is the agent built from this tree by TestMain, or empty with
// buildErr saying why not.
var (
	agentBin string
	buildErr error
)

func TestMain(m *testing.M) {
	if h := os.Getenv(helperEnv); h != "" {
		os.Exit(helper(h, os.Args[1:]))
	}
	os.Exit(run(m))
}

// helperEnv makes the test binary a helper command (see helper).
const helperEnv = "PODVM_AGENT_TEST_HELPER"

// helperRequest runs the test binary as helper name inside the sandbox.
func helperRequest(name string, args ...string) Request {
	exe, _ := os.Executable()
	return Request{Argv: append([]string{exe}, args...), Env: []string{helperEnv + "=" + name}}
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "podvm-agent-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	if runtime.GOOS == "linux" {
		agentBin = filepath.Join(dir, "podvm-agent")
		out, err := osexec.Command(goTool(), "build", "-o", agentBin, "./cmd/podvm-agent").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("building the agent: %v\n%s", err, out)
		}
	}
	return m.Run()
}

func goTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); fileExists(p) {
		return p
	}
	return "go"
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// needAgent skips (or fails under CI=true) when the agent cannot run as
// PID 1 of a fresh PID namespace here.
func needAgent(t testing.TB) {
	t.Helper()
	why := ""
	switch {
	case runtime.GOOS != "linux":
		why = "the agent runs on Linux only"
	case buildErr != nil:
		t.Fatal(buildErr)
	case os.Getuid() != 0:
		why = "unshare --pid needs root"
	case !fileExists("/usr/bin/unshare") || !fileExists("/bin/busybox"):
		why = "needs /usr/bin/unshare and /bin/busybox"
	}
	if why != "" {
		testkit.SkipOrFail(t, "", why)
	}
}

// pipes is the test's end of the agent's stdio channel.
type pipes struct {
	io.Reader
	io.Writer
	closers []io.Closer
}

func (p *pipes) Close() error {
	for _, c := range p.closers {
		c.Close()
	}
	return nil
}

// testAgent is an agent running as PID 1 of its own PID namespace, with a
// client connected over pipes.
type testAgent struct {
	*Client
	cmd  *osexec.Cmd
	done chan struct{}
}

// startAgent starts the agent under unshare and connects a client; the
// test's cleanup closes the channel and waits for the agent to go.
func startAgent(t testing.TB) *testAgent {
	t.Helper()
	needAgent(t)
	return startAgentBinary(t, agentBin)
}

// startAgentArgs is startAgent with arguments for the agent.
func startAgentArgs(t testing.TB, args ...string) *testAgent {
	t.Helper()
	needAgent(t)
	return startAgentBinary(t, agentBin, args...)
}

// startAgentBinary is startAgent with the agent executable at bin.
func startAgentBinary(t testing.TB, bin string, args ...string) *testAgent {
	t.Helper()
	return startAgentVia(t, bin, func(out io.Reader, in io.Writer) io.ReadWriteCloser {
		return &pipes{Reader: out, Writer: in, closers: []io.Closer{in.(io.Closer), out.(io.Closer)}}
	}, args...)
}

// startAgentVia is startAgentBinary with the client's channel made by
// via from the agent's stdout and stdin; the test's cleanup closes them
// after the client.
func startAgentVia(t testing.TB, bin string, via func(out io.Reader, in io.Writer) io.ReadWriteCloser, args ...string) *testAgent {
	t.Helper()
	return startAgentCommand(t, append([]string{"--pid", "--fork", "--mount-proc", "--kill-child", bin}, args...), via)
}

// startAgentCommand is startAgentVia with unshare's arguments in argv:
// its options, then the agent's command.
func startAgentCommand(t testing.TB, argv []string, via func(out io.Reader, in io.Writer) io.ReadWriteCloser) *testAgent {
	t.Helper()
	inR, inW, err := os.Pipe()
	require.NoError(t, err)
	outR, outW, err := os.Pipe()
	require.NoError(t, err)
	cmd := osexec.Command("/usr/bin/unshare", argv...)
	cmd.Env = append(os.Environ(), "PODVM_BASE=base")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, os.Stderr
	require.NoError(t, cmd.Start())
	inR.Close()
	outW.Close()
	a := &testAgent{cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(a.done) }()
	a.Client, err = NewClient(via(outR, inW))
	if err != nil {
		_ = cmd.Process.Kill()
		<-a.done
		require.NoError(t, err)
	}
	t.Cleanup(func() {
		a.Close()
		inW.Close() // the agent's stdin at its end: it exits
		outR.Close()
		select {
		case <-a.done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-a.done
			t.Error("the agent did not exit within 30s of its channel closing")
		}
	})
	return a
}

// result is one run's outcome, with its output.
type result struct {
	Exit
	stdout, stderr string
	err            error
}

func (a *testAgent) run(ctx context.Context, req Request, stdin io.Reader) result {
	var out, errb testkit.LockedBuffer
	ex, err := a.Run(ctx, req, stdin, &out, &errb)
	return result{Exit: ex, stdout: out.String(), stderr: errb.String(), err: err}
}

func (a *testAgent) sh(ctx context.Context, script string, args ...string) result {
	return a.run(ctx, Request{Argv: append([]string{"/bin/busybox", "sh", "-c", script, "sh"}, args...)}, nil)
}

// alive returns the host pids of processes whose command line holds
// marker.
func alive(marker string) []string {
	var pids []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(d + "/cmdline")
		if err == nil && strings.Contains(string(b), marker) {
			pids = append(pids, filepath.Base(d)+":"+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return pids
}
