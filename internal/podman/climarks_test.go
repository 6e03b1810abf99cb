package podman

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/marks"
)

func TestOlder(t *testing.T) {
	for v, want := range map[string]bool{
		"5.4.2": true, "4.3.1": true, "5.6.9": true, "5.7.0-dev": false, "5.7.0": false, "5.8.3": false, "6.0": false,
		"5.7": false, "5": true, "v5.4": false, "": false,
	} {
		assert.Equal(t, want, older(v, markedFrom), v)
	}
}

func TestLosesExecOutput(t *testing.T) {
	for _, c := range []struct {
		json string
		want bool
	}{
		{`{"Client":{"Version":"5.4.2"},"Server":{"Version":"5.4.2"}}`, true},
		{`{"Client":{"Version":"4.3.1"},"Server":{"Version":"5.4.2"}}`, true},
		{`{"Client":{"Version":"5.8.3"},"Server":{"Version":"5.4.2"}}`, false},
		{`{"Client":{"Version":"4.3.1"}}`, false}, // local: no server of its own
	} {
		got, err := losesExecOutput(c.json)
		require.NoError(t, err, c.json)
		assert.Equal(t, c.want, got, c.json)
	}
	_, err := losesExecOutput(`{}`)
	assert.ErrorIs(t, err, driver.ErrEngine)
}

// shellPodman is podman as an exec.Executor, run on this machine: its
// `version` says what client it is, and `exec [-i] [flags] ID ARGV`
// runs ARGV here, /bin/sh as this machine's. noShell makes /bin/sh
// missing, as in an image without it; keep cuts the stream's stdout
// after that many bytes, as a lost stream would.
type shellPodman struct {
	version string
	noShell bool
	keep    int
	vanish  string // "gone": the container goes away once the script has printed; "lies": the command says so itself

	mu       sync.Mutex
	execs    [][]string // the argv of each exec, after the ID
	versions int        // how often podman was asked its version
	slow     chan struct{}
}

func (f *shellPodman) Run(ctx context.Context, c exec.Command) (*exec.Result, error) {
	args := c.Args[2:] // after --url URL
	switch args[0] {
	case "version":
		f.mu.Lock()
		f.versions++
		f.mu.Unlock()
		if f.slow != nil {
			<-f.slow
		}
		return &exec.Result{Stdout: f.version}, nil
	case "exec":
	default:
		panic(c.Args)
	}
	at := slices.Index(args, "ctr")
	argv := args[at+1:]
	var env []string
	for i, a := range args[:at] {
		if a == "--env" {
			env = append(env, args[i+1])
		}
	}
	f.mu.Lock()
	f.execs = append(f.execs, argv)
	f.mu.Unlock()
	if argv[0] == "/bin/sh" && f.noShell {
		line := `Error: runc: exec failed: unable to start container process: exec: "/bin/sh": stat /bin/sh: no such file or directory: OCI runtime attempted to invoke a command that was not found` + "\n"
		_, _ = io.WriteString(c.Stderr, line)
		return &exec.Result{ExitCode: 127}, nil
	}
	if argv[0] == "/bin/sh" && f.vanish != "" {
		_, _ = io.WriteString(c.Stdout, "partial\n")
		if f.vanish == "lies" { // the command's own words, and podman's nothing
			_, _ = io.WriteString(c.Stderr, "Error: no container with name or ID \"x\" found: no such container\nand more\n")
			return &exec.Result{ExitCode: 125}, nil
		}
		_, _ = io.WriteString(c.Stderr, "Error: no container with name or ID \"ctr\" found: no such container\n")
		return &exec.Result{ExitCode: 125}, nil
	}
	if f.keep > 0 {
		c.Stdout = &cutWriter{w: c.Stdout, left: f.keep}
	}
	return exec.NewCommandExecutor().Run(ctx, exec.Command{Name: argv[0], Args: argv[1:], Env: env, Stdin: c.Stdin, Stdout: c.Stdout, Stderr: c.Stderr, MaxOutputBytes: 1})
}

// cutWriter passes on its first left bytes and drops the rest.
type cutWriter struct {
	w    io.Writer
	left int
}

func (c *cutWriter) Write(p []byte) (int, error) {
	k := min(len(p), c.left)
	c.left -= k
	if k > 0 {
		if _, err := c.w.Write(p[:k]); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// A client that loses an exec's output runs each command under the
// marks' script: its output, status, environment and directory are the
// command's, its failure to start says why, and a stream cut short is an
// error, never a short result. A client that does not lose it, and an
// image without /bin/sh, run the command as podman would.
func TestExecMarked(t *testing.T) {
	const remote54 = `{"Client":{"Version":"5.4.2"},"Server":{"Version":"5.4.2"}}`
	ctx := context.Background()
	defer func(w time.Duration) { marks.MarkWait = w }(marks.MarkWait)
	marks.MarkWait = 200 * time.Millisecond
	newCLI := func(t *testing.T, f *shellPodman) CLI {
		t.Helper()
		clients.Clear() // a client per test, whatever the one before said
		noShell.Clear()
		d, err := NewCLI(f, "podman", "unix:///run/podvm-test-"+t.Name()+".sock", "")
		require.NoError(t, err)
		return d
	}
	run := func(d CLI, p driver.Process) (string, string, int, error) {
		var out, errs bytes.Buffer
		p.Stdout, p.Stderr = &out, &errs
		code, _, err := d.Exec(ctx, "ctr", p)
		return out.String(), errs.String(), code, err
	}

	t.Run("the command's output and status", func(t *testing.T) {
		f := &shellPodman{version: remote54}
		d := newCLI(t, f)
		out, errs, code, err := run(d, driver.Process{
			Argv:    []string{"sh", "-c", `printf '%s %s ' "$A" "$PWD"; cat; echo err >&2; exit 3`},
			Env:     []string{"A=b c"},
			Workdir: "/",
			Stdin:   strings.NewReader("in"),
		})
		require.NoError(t, err)
		assert.Equal(t, 3, code)
		assert.Equal(t, "b c / in", out)
		assert.Equal(t, "err\n", errs)
		require.Len(t, f.execs, 1)
		assert.Equal(t, "/bin/sh", f.execs[0][0], "run under the script")
		assert.NotContains(t, strings.Join(f.execs[0], "\x00"), "b c", "an environment value in an argv any process can read")
	})
	t.Run("the command's environment is not the script's", func(t *testing.T) {
		d := newCLI(t, &shellPodman{version: remote54})
		out, _, code, err := run(d, driver.Process{Argv: []string{"/usr/bin/env"}, Env: []string{"PATH=/nowhere", "PWD=/mine", "B=2"}})
		require.NoError(t, err, "the script's own tools are found whatever the command's PATH")
		assert.Equal(t, 0, code)
		env := strings.Split(strings.TrimSpace(out), "\n")
		assert.Subset(t, env, []string{"PATH=/nowhere", "PWD=/mine", "B=2"})
		for _, kv := range env {
			assert.False(t, strings.HasPrefix(kv, "SHLVL=") || strings.HasPrefix(kv, "podvm_"), "the script's %s", kv)
		}
		_, _, _, err = run(d, driver.Process{Argv: []string{"true"}, Env: []string{"PATH=/nowhere"}})
		assert.ErrorIs(t, err, exec.ErrNotFound, "the command is looked up in its own PATH")
	})
	t.Run("failures to start", func(t *testing.T) {
		d := newCLI(t, &shellPodman{version: remote54})
		_, _, _, err := run(d, driver.Process{Argv: []string{"podvm-no-such-command"}})
		assert.ErrorIs(t, err, exec.ErrNotFound)
		_, _, _, err = run(d, driver.Process{Argv: []string{"true"}, Workdir: "/no/such/dir"})
		assert.ErrorIs(t, err, exec.ErrDirNotFound)
		_, _, _, err = run(d, driver.Process{Argv: []string{"true"}, Env: []string{"A-B=1"}})
		assert.ErrorIs(t, err, driver.ErrNotSupported)
	})
	t.Run("a stream cut short", func(t *testing.T) {
		d := newCLI(t, &shellPodman{version: remote54, keep: 3})
		_, _, _, err := run(d, driver.Process{Argv: []string{"echo", "a longer line"}})
		assert.ErrorIs(t, err, driver.ErrEngine, "a short result must not pass for the whole")
	})
	t.Run("a container gone after the command began", func(t *testing.T) {
		d := newCLI(t, &shellPodman{version: remote54, vanish: "gone"})
		var out bytes.Buffer
		_, started, err := d.Exec(ctx, "ctr", driver.Process{Argv: []string{"echo", "hi"}, Stdout: &out})
		assert.True(t, started, "output came: the command ran (its partial output is the caller's)")
		assert.ErrorIs(t, err, driver.ErrNoSuchContainer)
		assert.Equal(t, "partial\n", out.String())

		d = newCLI(t, &shellPodman{version: remote54, vanish: "lies"})
		_, _, err = d.Exec(ctx, "ctr", driver.Process{Argv: []string{"echo", "hi"}})
		assert.ErrorIs(t, err, driver.ErrEngine)
		assert.NotErrorIs(t, err, driver.ErrNoSuchContainer, "the command's own stderr is not podman's")
	})
	t.Run("an image without /bin/sh", func(t *testing.T) {
		f := &shellPodman{version: remote54, noShell: true}
		d := newCLI(t, f)
		for range 2 {
			out, _, code, err := run(d, driver.Process{Argv: []string{"echo", "hi"}})
			require.NoError(t, err)
			assert.Equal(t, 0, code)
			assert.Equal(t, "hi\n", out)
		}
		assert.Equal(t, [][]string{{"/bin/sh"}, {"echo", "hi"}, {"echo", "hi"}}, firsts(f.execs), "/bin/sh tried once, then the command alone")
	})
	t.Run("a client that loses nothing", func(t *testing.T) {
		for _, v := range []string{
			`{"Client":{"Version":"5.8.3"},"Server":{"Version":"5.4.2"}}`,
			`{"Client":{"Version":"4.3.1"}}`,
		} {
			f := &shellPodman{version: v}
			d := newCLI(t, f)
			out, _, _, err := run(d, driver.Process{Argv: []string{"echo", "hi"}})
			require.NoError(t, err)
			assert.Equal(t, "hi\n", out)
			assert.Equal(t, [][]string{{"echo", "hi"}}, f.execs, v)
		}
	})
}

// firsts is each argv cut to its first word, but the command's own argv
// whole (for an exec of the command alone).
func firsts(argvs [][]string) [][]string {
	var out [][]string
	for _, a := range argvs {
		if a[0] == "/bin/sh" {
			a = a[:1]
		}
		out = append(out, a)
	}
	return out
}

// The client is asked once for all its callers at once; one whose ctx
// ends first stops waiting, with no.
func TestNeedsMarksAsksOnce(t *testing.T) {
	clients.Clear()
	f := &shellPodman{version: `{"Client":{"Version":"5.4.2"},"Server":{"Version":"5.4.2"}}`, slow: make(chan struct{})}
	d, err := NewCLI(f, "podman", "unix:///run/podvm-test-asks-once.sock", "")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.False(t, d.needsMarks(ctx), "a caller whose ctx ended does not wait")
	var wg sync.WaitGroup
	var yes atomic.Int32
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if d.needsMarks(context.Background()) {
				yes.Add(1)
			}
		}()
	}
	time.Sleep(50 * time.Millisecond)
	close(f.slow)
	wg.Wait()
	assert.Equal(t, int32(32), yes.Load())
	assert.True(t, d.needsMarks(context.Background()))
	assert.Equal(t, 1, f.versions)
}
