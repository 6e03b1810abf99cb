package vmtest

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/testkit"
	"github.com/podvm/podvm/vm"
)

// Grace is how long past its timeout a Run may take to return: the time
// to kill the command inside the sandbox and collect its result.
const Grace = 10 * time.Second

// sh runs a shell script in the sandbox, passing args as $1...
func sh(script string, args ...string) exec.Command {
	return exec.Command{Name: "sh", Args: append([]string{"-c", script, "sh"}, args...)}
}

// run runs cmd, observing its outcome under label.
func run(ctx context.Context, v exec.Executor, label string, cmd exec.Command) (*exec.Result, error, observation) {
	res, err := v.Run(ctx, cmd)
	return res, err, observe(label, res, err)
}

// want checks a finished run's outcome; a nil error is expected.
func want(t *testing.T, res *exec.Result, err error, stdout, stderr string, code int) {
	t.Helper()
	if err != nil {
		t.Fatalf("Run: unexpected error %v", err)
	}
	if res.Stdout != stdout || res.Stderr != stderr || res.ExitCode != code {
		t.Errorf("got stdout %s, stderr %s, exit %d; want %q, %q, %d", clip(res.Stdout), clip(res.Stderr), res.ExitCode, stdout, stderr, code)
	}
}

// single is a case made of one command whose outcome is fully known.
func single(name, promise string, cmd exec.Command, stdout, stderr string, code int) testCase {
	return testCase{Name: name, Promise: promise, Shared: true, Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
		res, err, o := run(ctx, v, name, cmd)
		want(t, res, err, stdout, stderr, code)
		return []observation{o}
	}}
}

// failing is a case whose command must fail with target before running.
func failing(name, promise string, cmd exec.Command, target error) testCase {
	return testCase{Name: name, Promise: promise, Shared: true, Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
		res, err, o := run(ctx, v, name, cmd)
		if !errors.Is(err, target) {
			t.Fatalf("got error %v (result %+v); want one matching %v", err, res, target)
		}
		if res != nil {
			t.Errorf("a command that did not start has no Result; got %+v", res)
		}
		return []observation{o}
	}}
}

// sandboxPS lists the sandbox's processes' command lines.
func sandboxPS(ctx context.Context, t *testing.T, v vm.VM) string {
	t.Helper()
	res, err := v.Run(ctx, exec.Command{Name: "ps", Args: []string{"-o", "pid,args"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("ps in the sandbox: %v %+v", err, res)
	}
	return res.Stdout
}

// stopped is the shared body of the timeout and cancel cases: the command
// must be stopped within its deadline plus Grace, keep its partial output,
// and leave nothing of itself in the sandbox.
func stopped(ctx context.Context, t *testing.T, v vm.VM, stop func(context.Context) (context.Context, exec.Command, time.Duration), target error) []observation {
	return stoppedWith(ctx, t, v, stop, target, "started\n")
}

// stoppedWith is stopped for a command whose output before the stop is
// out.
func stoppedWith(ctx context.Context, t *testing.T, v vm.VM, stop func(context.Context) (context.Context, exec.Command, time.Duration), target error, out string) []observation {
	// The sleeps' durations are unique so ps can tell them apart.
	rctx, cmd, limit := stop(ctx)
	start := time.Now()
	return stoppedSince(ctx, t, v, rctx, cmd, func() time.Time { return start }, limit, target, out)
}

// stoppedSince is stoppedWith for a Run of cmd under rctx that must
// return within limit + Grace of since().
func stoppedSince(ctx context.Context, t *testing.T, v vm.VM, rctx context.Context, cmd exec.Command, since func() time.Time, limit time.Duration, target error, out string) []observation {
	res, err := v.Run(rctx, cmd)
	elapsed := time.Since(since())
	if !errors.Is(err, target) {
		t.Fatalf("got error %v; want one matching %v", err, target)
	}
	if res == nil {
		t.Fatal("a stopped run returns its partial Result")
	}
	if !res.TimedOut || res.ExitCode != -1 {
		t.Errorf("TimedOut %v, ExitCode %d; want true, -1", res.TimedOut, res.ExitCode)
	}
	if res.Stdout != out {
		t.Errorf("partial output %s; want %s", clip(res.Stdout), clip(out))
	}
	if elapsed > limit+Grace {
		t.Errorf("Run returned after %v; want within %v + %v", elapsed, limit, Grace)
	}
	if ps := sandboxPS(ctx, t, v); strings.Contains(ps, "sleep 3011") {
		t.Errorf("the command's processes survived in the sandbox:\n%s", ps)
	}
	return []observation{observe("stopped", res, err)}
}

const treeScript = `echo started; sleep 3011 & sleep 3011`

// inFlightScript prints inFlightOut at once, then waits as treeScript
// does.
const inFlightScript = `echo started; head -c 20000 /dev/zero | tr '\0' x; echo; echo done; sleep 3011 & sleep 3011`

var inFlightOut = "started\n" + strings.Repeat("x", 20000) + "\ndone\n"

// gate is a live writer that holds its first write until open is
// closed: what the command printed is still on its way when the run is
// stopped.
type gate struct{ open chan struct{} }

func (g gate) Write(p []byte) (int, error) {
	<-g.open
	return len(p), nil
}

// cancelAfterOutput returns a context that is cancelled after the
// command's first output, and a Stdout for the command that notes it
// and then writes to w (nil: drops it), and when the cancel came: a
// command that starts late (a Podman exec on a loaded machine can take
// seconds) is never cancelled before it printed.
func cancelAfterOutput(ctx context.Context, after time.Duration, w io.Writer) (context.Context, io.Writer, func() time.Time) {
	rctx, cancel := context.WithCancel(ctx)
	n := &noticer{w: w}
	var mu sync.Mutex
	var at time.Time
	n.first = func() {
		time.AfterFunc(after, func() {
			mu.Lock()
			at = time.Now()
			mu.Unlock()
			cancel()
		})
	}
	return rctx, n, func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return at
	}
}

// noticer calls first at its first Write, then writes to w.
type noticer struct {
	w     io.Writer
	first func()
	once  sync.Once
}

func (n *noticer) Write(p []byte) (int, error) {
	n.once.Do(n.first)
	if n.w == nil {
		return len(p), nil
	}
	return n.w.Write(p)
}

// Cases returns the conformance cases, a fresh table each call.
func cases(h Harness) []testCase {
	cases := []testCase{
		single("output/text", "stdout is captured as produced",
			exec.Command{Name: "echo", Args: []string{"hello, sandbox"}}, "hello, sandbox\n", "", 0),
		single("output/binary", "output is bytes, NULs and invalid UTF-8 included",
			exec.Command{Name: "printf", Args: []string{`a\000b\377\n`}}, "a\x00b\xff\n", "", 0),
		single("output/empty", "a silent command has empty output",
			exec.Command{Name: "true"}, "", "", 0),
		single("output/separate", "stdout and stderr are separate",
			sh(`echo out; echo err >&2; echo out2`), "out\nout2\n", "err\n", 0),
		{Name: "output/10MB", Promise: "large output arrives whole under a large enough cap",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				cmd := sh(`dd if=/dev/zero bs=1048576 count=10 2>/dev/null`)
				cmd.MaxOutputBytes = 16 << 20
				res, err, o := run(ctx, v, "10MB", cmd)
				if err != nil {
					t.Fatal(err)
				}
				if res.StdoutBytes != 10<<20 || res.Stdout != strings.Repeat("\x00", 10<<20) || res.Truncated {
					t.Errorf("got %d bytes (captured %d, truncated %v); want 10 MiB of NULs", res.StdoutBytes, len(res.Stdout), res.Truncated)
				}
				return []observation{o}
			}},
		{Name: "output/both-busy", Promise: "both streams are drained concurrently, in order, without deadlock",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				res, err, o := run(ctx, v, "busy", sh(`i=0; while [ $i -lt 20000 ]; do echo "out $i"; echo "err $i" >&2; i=$((i+1)); done`))
				if err != nil {
					t.Fatal(err)
				}
				var out, errs strings.Builder
				for i := range 20000 {
					fmt.Fprintf(&out, "out %d\n", i)
					fmt.Fprintf(&errs, "err %d\n", i)
				}
				if res.Stdout != out.String() || res.Stderr != errs.String() {
					t.Errorf("streams mixed or lost: stdout %d bytes, stderr %d bytes; want %d, %d", len(res.Stdout), len(res.Stderr), out.Len(), errs.Len())
				}
				return []observation{o}
			}},
		{Name: "output/over-cap", Promise: "the capture keeps head and tail, counts every byte and tails from the true end",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				cmd := exec.Command{Name: "seq", Args: []string{"1", "100000"}, MaxOutputBytes: 1000}
				res, err, o := run(ctx, v, "over-cap", cmd)
				if err != nil {
					t.Fatal(err)
				}
				if !res.Truncated || res.StdoutBytes != 588895 || !strings.HasPrefix(res.Stdout, "1\n2\n3\n") || len(res.Stdout) > 1100 {
					t.Errorf("truncated %v, %d bytes, captured %s", res.Truncated, res.StdoutBytes, clip(res.Stdout))
				}
				if tail := res.StdoutTail(2); tail != "99999\n100000\n" {
					t.Errorf("StdoutTail(2) = %q", tail)
				}
				return []observation{o}
			}},
		single("exit/signal", "death by a signal is 128+signal",
			sh(`kill -9 $$`), "", "", 137),
		failing("exit/not-found", "a missing command is exec.ErrNotFound, not an exit code",
			exec.Command{Name: "podvm-no-such-command"}, exec.ErrNotFound),
		failing("exit/not-executable", "a file without the exec bit is exec.ErrPermission",
			exec.Command{Name: "/etc/passwd"}, exec.ErrPermission),
		single("exit/127-is-data", "a command's own exit 127 is data, not ErrNotFound",
			sh(`echo gone >&2; exit 127`), "", "gone\n", 127),
		single("args/verbatim", "arguments arrive byte for byte; no shell interprets them",
			exec.Command{Name: "printf", Args: []string{`%s|`, "$(id)", "`id`", "*", "a;b", `"q"`, "'s'", "two words", "", "ünï€ødé", "$HOME"}},
			"$(id)|`id`|*|a;b|\"q\"|'s'|two words||ünï€ødé|$HOME|", "", 0),
		{Name: "env/merge", Promise: "config env and command env merge, the command winning; no host variable enters",
			Config: func(c *vm.Config) { c.Env = []string{"A=config", "B=config"} },
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				cmd := exec.Command{Name: "env", Env: []string{"B=command", "C=command"}}
				res, err, _ := run(ctx, v, "env", cmd)
				if err != nil {
					t.Fatal(err)
				}
				vars := strings.Split(strings.TrimSpace(res.Stdout), "\n")
				for _, w := range []string{"A=config", "B=command", "C=command"} {
					if !slices.Contains(vars, w) {
						t.Errorf("%s missing from %q", w, vars)
					}
				}
				for _, kv := range os.Environ() {
					k, _, _ := strings.Cut(kv, "=")
					if k != "PATH" && k != "HOME" && k != "HOSTNAME" && k != "TERM" && k != "container" && slices.Contains(vars, kv) {
						t.Errorf("host variable %s leaked into the sandbox", kv)
					}
				}
				// The env output is compared by the variables podvm controls,
				// sorted: the order of the environment is no promise.
				r := *res
				r.Stdout, r.StdoutBytes = "", 0
				slices.Sort(vars)
				for _, kv := range vars {
					if strings.HasPrefix(kv, "A=") || strings.HasPrefix(kv, "B=") || strings.HasPrefix(kv, "C=") {
						r.Stdout += kv + "\n"
					}
				}
				return []observation{observe("env", &r, nil)}
			}},
		{Name: "workdir", Promise: "the config's workdir is the default, Command.Dir overrides it, a missing one is ErrDirNotFound",
			Config: func(c *vm.Config) { c.Workdir = "/tmp" },
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				res, err, o1 := run(ctx, v, "default", exec.Command{Name: "pwd"})
				want(t, res, err, "/tmp\n", "", 0)
				res, err, o2 := run(ctx, v, "override", exec.Command{Name: "pwd", Dir: "/etc"})
				want(t, res, err, "/etc\n", "", 0)
				_, err, o3 := run(ctx, v, "missing", exec.Command{Name: "pwd", Dir: "/no/such/dir"})
				if !errors.Is(err, exec.ErrDirNotFound) {
					t.Errorf("missing workdir: got %v; want exec.ErrDirNotFound", err)
				}
				return []observation{o1, o2, o3}
			}},
		{Name: "user", Promise: "commands run as the config's user",
			Config: func(c *vm.Config) { c.User = "65534:65534" },
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				res, err, o := run(ctx, v, "id", sh(`id -u; id -g`))
				want(t, res, err, "65534\n65534\n", "", 0)
				return []observation{o}
			}},
		{Name: "stdin", Promise: "stdin is streamed whole and closed; no stdin reads as empty",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				var obs []observation
				big := make([]byte, 5<<20)
				_, _ = rand.Read(big)
				for _, in := range []struct {
					label string
					data  []byte
				}{{"small", []byte("hello\n")}, {"5MB", big}, {"none", nil}} {
					cmd := exec.Command{Name: "cat", MaxOutputBytes: 8 << 20}
					if in.data != nil {
						cmd.Stdin = bytes.NewReader(in.data)
					}
					res, err, o := run(ctx, v, in.label, cmd)
					want(t, res, err, string(in.data), "", 0)
					if in.label == "5MB" { // random: compare by length only
						o.Result.Stdout = strconv.Itoa(len(o.Result.Stdout))
					}
					obs = append(obs, o)
				}
				return obs
			}},
		{Name: "stdin-stuck", Promise: "a Stdin that never ends does not hold Run once the command has exited; a Stdin that fails is reported with the Result",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				stuck := make(chan struct{})
				defer close(stuck)
				never := blockingReader(stuck)
				var obs []observation
				for _, c := range []struct {
					label string
					cmd   exec.Command
					out   string
				}{
					{"ignored", exec.Command{Name: "true", Stdin: never}, ""},
					{"read a little", exec.Command{Name: "head", Args: []string{"-c", "3"}, Stdin: io.MultiReader(strings.NewReader("abcdef"), never)}, "abc"},
				} {
					res, err, o := run(ctx, v, c.label, c.cmd)
					want(t, res, err, c.out, "", 0)
					obs = append(obs, o)
				}
				boom := errors.New("stdin failed")
				res, err, o := run(ctx, v, "failing", exec.Command{Name: "cat", Stdin: io.MultiReader(strings.NewReader("part"), iotest.ErrReader(boom))})
				if !errors.Is(err, boom) || res == nil || res.Stdout != "part" {
					t.Errorf("a failing Stdin: got %+v, %v; want stdout \"part\" and an error wrapping %q", res, err, boom)
				}
				if errors.Is(err, boom) {
					o.Err = "the Stdin's error" // the wrapping text is each backend's own
				}
				return append(obs, o)
			}},
		{Name: "timeout", Promise: "a timeout kills the command and its children inside the sandbox, keeping partial output",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				return stopped(ctx, t, v, func(ctx context.Context) (context.Context, exec.Command, time.Duration) {
					cmd := sh(treeScript)
					cmd.Timeout = 2 * time.Second
					return ctx, cmd, cmd.Timeout
				}, context.DeadlineExceeded)
			}},
		{Name: "cancel", Promise: "cancelling the context kills the command and its children inside the sandbox",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				rctx, w, cancelled := cancelAfterOutput(ctx, 2*time.Second, nil)
				cmd := sh(treeScript)
				cmd.Stdout = w
				return stoppedSince(ctx, t, v, rctx, cmd, cancelled, 0, context.Canceled, "started\n")
			}},
		{Name: "timeout/in-flight", Promise: "a timeout keeps all the output the command printed before it, even what was still on its way to a live writer that was slow to take it",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				return stoppedWith(ctx, t, v, func(ctx context.Context) (context.Context, exec.Command, time.Duration) {
					cmd := sh(inFlightScript)
					cmd.Timeout = 2 * time.Second
					g := gate{make(chan struct{})}
					time.AfterFunc(cmd.Timeout+50*time.Millisecond, func() { close(g.open) })
					cmd.Stdout = g
					return ctx, cmd, cmd.Timeout
				}, context.DeadlineExceeded, inFlightOut)
			}},
		{Name: "cancel/in-flight", Promise: "cancelling the context keeps all the output the command printed before it, even what was still on its way to a live writer that was slow to take it",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				// Cancelled 2 s after its first output, all of it
				// printed by then; the writer takes it 50 ms after.
				g := gate{make(chan struct{})}
				rctx, w, cancelled := cancelAfterOutput(ctx, 2*time.Second, g)
				context.AfterFunc(rctx, func() { time.AfterFunc(50*time.Millisecond, func() { close(g.open) }) })
				cmd := sh(inFlightScript)
				cmd.Stdout = w
				return stoppedSince(ctx, t, v, rctx, cmd, cancelled, 0, context.Canceled, inFlightOut)
			}},
		{Name: "concurrent", Promise: "concurrent Runs on one VM each get their own result",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				obs := make([]observation, 16)
				var wg sync.WaitGroup
				for i := range obs {
					wg.Add(1)
					go func() {
						defer wg.Done()
						id := strconv.Itoa(i)
						res, err := v.Run(ctx, sh(`echo "out $1"; echo "err $1" >&2; exit $1`, id))
						if err != nil || res.Stdout != "out "+id+"\n" || res.Stderr != "err "+id+"\n" || res.ExitCode != i {
							t.Errorf("run %d: got %+v, %v", i, res, err)
						}
						obs[i] = observe(id, res, err)
					}()
				}
				wg.Wait()
				return obs
			}},
		{Name: "lifecycle/remove-twice", Promise: "Remove is idempotent; Run after Remove is ErrRemoved",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				for i := range 2 {
					if err := v.Remove(ctx); err != nil {
						t.Fatalf("Remove #%d: %v", i+1, err)
					}
				}
				res, err, o := run(ctx, v, "after-remove", exec.Command{Name: "true"})
				if !errors.Is(err, vm.ErrRemoved) || res != nil {
					t.Errorf("Run after Remove: got %v, %v; want ErrRemoved", res, err)
				}
				if v.CopyIn(ctx, "/tmp", bytes.NewReader(nil)) == nil {
					t.Error("CopyIn after Remove succeeded")
				}
				return []observation{o}
			}},
		{Name: "lifecycle/remove-during-run", Promise: "a Run in progress when Remove is called ends promptly with ErrRemoved, not as a command that exited",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				started := make(chan struct{})
				var once sync.Once
				out := writerFunc(func(p []byte) (int, error) {
					once.Do(func() { close(started) })
					return len(p), nil
				})
				type ran struct {
					res *exec.Result
					err error
				}
				done := make(chan ran, 1)
				go func() {
					res, err := v.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", "echo started; sleep 300"}, Stdout: out})
					done <- ran{res, err}
				}()
				select {
				case <-started:
				case r := <-done:
					t.Fatalf("the run ended before Remove: %+v, %v", r.res, r.err)
				}
				if err := v.Remove(ctx); err != nil {
					t.Fatalf("Remove: %v", err)
				}
				var r ran
				select {
				case r = <-done:
				case <-time.After(Grace):
					t.Fatalf("Run still running %v after Remove", Grace)
				}
				if !errors.Is(r.err, vm.ErrRemoved) {
					t.Errorf("got %+v, %v; want an error matching ErrRemoved", r.res, r.err)
				}
				// What the run printed and its status are the backend's own.
				return []observation{observe("run", nil, r.err)}
			}},
		{Name: "lifecycle/uncreated", Promise: "Run before Create is ErrNotCreated; Remove of a never-created VM succeeds",
			Uncreated: true,
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				res, err, o := run(ctx, v, "before-create", exec.Command{Name: "true"})
				if !errors.Is(err, vm.ErrNotCreated) || res != nil {
					t.Errorf("Run before Create: got %v, %v; want ErrNotCreated", res, err)
				}
				if v.ID() != "" {
					t.Errorf("ID before Create = %q", v.ID())
				}
				if err := v.Remove(ctx); err != nil {
					t.Errorf("Remove before Create: %v", err)
				}
				return []observation{o}
			}},
		{Name: "copy/round-trip", Promise: "files copied in come back out byte for byte with their modes",
			Test: copyRoundTrip},
	}
	for _, code := range []int{0, 1, 7, 255} {
		cases = append(cases, single("exit/"+strconv.Itoa(code), "a non-zero exit is data, never an error",
			sh(`exit $1`, strconv.Itoa(code)), "", "", code))
	}
	cases = append(cases, contractCases(h)...)
	cases = append(cases, lifecycleCases(h)...)
	cases = append(cases, trackedCases(h)...)
	cases = append(cases, fileCases()...)
	cases = append(cases, failureCases()...)
	cases = append(cases, snapshotCases(h)...)
	cases = append(cases, checkpointCases(h)...)
	cases = append(cases, nameCases()...)
	cases = append(cases, escapeCases(h)...)
	cases = append(cases, streamCases()...)
	for _, c := range append(processCases(h), serviceCases(h)...) {
		c.Agent = true
		cases = append(cases, c)
	}
	cases = append(cases, testCase{Name: "live/refused", Promise: "a path without podvm's agent refuses Start, Dial, WaitListening and Forward with vm.ErrNotSupported naming Config.PodmanExec, before anything runs; with the agent each works",
		Test: liveRefused(h)})
	cases = append(cases, hardeningCases(h)...)
	for _, c := range cases {
		if c.Shared && (c.Config != nil || c.Setup != nil || c.Uncreated) {
			panic("vmtest: case " + c.Name + " is Shared but asks for a sandbox of its own")
		}
	}
	// The longest first: inOrder starts them in this order,
	// -test.parallel at a time, and a four-minute case begun last would
	// run on alone at the end. A case's deadline is the measure of its
	// length at hand (and is the same for every h, as RunParity needs).
	slices.SortStableFunc(cases, func(a, b testCase) int { return cmp.Compare(b.deadline(), a.deadline()) })
	return cases
}

type file struct {
	name string
	mode int64
	data []byte
}

func copyRoundTrip(ctx context.Context, t *testing.T, v vm.VM) []observation {
	blob := make([]byte, 256<<10)
	_, _ = rand.Read(blob)
	files := []file{
		{"box/", 0o750, nil},
		{"box/tool", 0o755, append([]byte("\x7fELF\x00\x00"), blob...)},
		{"box/notes.txt", 0o600, []byte("line 1\nline 2\n")},
		{"box/empty", 0o644, nil},
	}
	var entries []testkit.Entry
	for _, f := range files {
		if strings.HasSuffix(f.name, "/") {
			entries = append(entries, testkit.Dir(f.name, f.mode))
		} else {
			entries = append(entries, testkit.File(f.name, string(f.data), f.mode))
		}
	}
	if err := v.CopyIn(ctx, "/tmp", bytes.NewReader(testkit.Tar(t, entries...))); err != nil {
		skipIfNotSupported(t, err)
		t.Fatalf("CopyIn: %v", err)
	}
	res, err, o := run(ctx, v, "ls", sh(`cd /tmp/box && stat -c '%n %a %s' tool notes.txt empty`))
	want(t, res, err, fmt.Sprintf("tool 755 %d\nnotes.txt 600 14\nempty 644 0\n", len(files[1].data)), "", 0)

	var out bytes.Buffer
	if err := v.CopyOut(ctx, "/tmp/box", &out); err != nil {
		t.Fatalf("CopyOut: %v", err)
	}
	entries, err = testkit.Untar(out.Bytes())
	if err != nil {
		t.Fatalf("reading CopyOut's tar: %v", err)
	}
	got := map[string]file{}
	for _, e := range entries {
		name := e.Name
		if e.Typeflag == tar.TypeDir {
			name = strings.TrimSuffix(name, "/") + "/"
		}
		got[name] = file{name, e.Mode & 0o7777, []byte(e.Body)}
	}
	for _, f := range files {
		g, ok := got[f.name]
		switch {
		case !ok:
			t.Errorf("CopyOut lacks %s (has %v)", f.name, keys(got))
		case g.mode != f.mode:
			t.Errorf("%s: mode %o; want %o", f.name, g.mode, f.mode)
		case !bytes.Equal(g.data, f.data):
			t.Errorf("%s: %d bytes differ from the %d copied in", f.name, len(g.data), len(f.data))
		}
	}
	return []observation{o}
}

func keys(m map[string]file) []string {
	var k []string
	for n := range m {
		k = append(k, n)
	}
	slices.Sort(k)
	return k
}

// blockingReader's Read blocks until done is closed, then reports the end.
type blockingReader <-chan struct{}

func (b blockingReader) Read([]byte) (int, error) {
	<-b
	return 0, io.EOF
}

// writerFunc is a function as an io.Writer.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
