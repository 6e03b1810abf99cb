package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/mock/gomock"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/exec/execmock"
	"github.com/podvm/podvm/internal/podman"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/internal/testkit"
)

const testID = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

// Placeholders in a wanted Command: the field must be set, to anything.
var (
	anyReader io.Reader = strings.NewReader("any reader")
	anyWriter io.Writer = new(strings.Builder)
)

// randomParts are the argv parts that differ on every call: the creation
// time, our token label, the run marker.
var randomParts = regexp.MustCompile(`^(` + LabelCreated + `|` + labelToken + `|` + markerKey + `|TMPDIR)=.*$`)

// commandMatcher matches an exec.Command field by field: argv exactly
// (random parts replaced by "*"), readers and writers by identity.
type commandMatcher struct{ want exec.Command }

func cmdIs(want exec.Command) gomock.Matcher { return commandMatcher{want} }

func normalize(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = randomParts.ReplaceAllString(a, "$1=*")
	}
	return out
}

func sameIO[T comparable](want, got, placeholder T) bool {
	var zero T
	if want == placeholder {
		return got != zero
	}
	return want == got
}

func (m commandMatcher) Matches(x any) bool {
	got, ok := x.(exec.Command)
	w := m.want
	return ok && got.Name == w.Name && slices.Equal(normalize(got.Args), w.Args) &&
		got.Dir == w.Dir && slices.Equal(normalize(got.Env), w.Env) &&
		got.Timeout == w.Timeout && got.MaxOutputBytes == w.MaxOutputBytes &&
		sameIO(w.Stdin, got.Stdin, anyReader) && sameIO(w.Stdout, got.Stdout, anyWriter) &&
		sameIO(w.Stderr, got.Stderr, anyWriter)
}

func (m commandMatcher) String() string {
	return fmt.Sprintf("command %s %q (timeout %v, max %d, stdin %v, stdout %v, stderr %v)", m.want.Name, m.want.Args,
		m.want.Timeout, m.want.MaxOutputBytes, m.want.Stdin != nil, m.want.Stdout != nil, m.want.Stderr != nil)
}

// isInfo matches `podman info --format json`, with or without --url.
var isInfo = gomock.Cond(func(c exec.Command) bool {
	return slices.Equal(c.Args[max(len(c.Args)-3, 0):], []string{"info", "--format", "json"})
})

// rootfulInfo is `podman info --format json` of a rootful service on
// cgroup v1, as much of it as podvm reads.
const rootfulInfo = `{"host":{"cgroupVersion":"v1","cgroupControllers":["cpuset","cpu","cpuacct","blkio","memory","devices","freezer","pids"],"security":{"rootless":false}}}`

// isVersion matches `podman version --format json`, which the CLI driver
// asks once per service: a remote client before 5.7 runs its execs
// under a script.
var isVersion = gomock.Cond(func(c exec.Command) bool {
	return slices.Equal(c.Args[max(len(c.Args)-3, 0):], []string{"version", "--format", "json"})
})

// expectInfo lets x answer `podman info` as a rootful service, and
// `podman version` as a local client (its execs run as they are), any
// number of times, apart from the calls a test orders.
func expectInfo(x *execmock.MockExecutor) {
	x.EXPECT().Run(gomock.Any(), isInfo).Return(&exec.Result{Stdout: rootfulInfo}, nil).AnyTimes()
	x.EXPECT().Run(gomock.Any(), isVersion).Return(&exec.Result{Stdout: `{"Client":{"Version":"4.3.1"}}`}, nil).AnyTimes()
}

// newMock is a CLIVM on the Podman exec path (the mocks run no agent)
// whose podman runs through a mock.
func newMock(t *testing.T, cfg Config, opts ...Option) (*CLIVM, *execmock.MockExecutor) {
	t.Helper()
	cfg.PodmanExec = true
	x := execmock.NewMockExecutor(gomock.NewController(t))
	expectInfo(x)
	v, err := NewCLIVM(cfg, x, opts...)
	require.NoError(t, err)
	return v, x
}

// created returns a VM on which Create succeeded with container testID.
func created(t *testing.T, cfg Config, opts ...Option) (*CLIVM, *execmock.MockExecutor) {
	t.Helper()
	v, x := newMock(t, cfg, opts...)
	gomock.InOrder(
		x.EXPECT().Run(gomock.Any(), cmdIs(inspectArch)).Return(&exec.Result{Stdout: "amd64\n"}, nil),
		x.EXPECT().Run(gomock.Any(), gomock.Any()).Return(&exec.Result{Stdout: testID + "\n"}, nil),
	)
	require.NoError(t, v.Create(context.Background()))
	require.Equal(t, testID, v.ID())
	return v, x
}

// inspectArch is Create's first podman command: the image is present,
// of this architecture.
var inspectArch = exec.Command{Name: "podman", Args: []string{"image", "inspect", "--format", "{{.Architecture}}", "img"}, MaxOutputBytes: podman.MessageBytes}

// ownLabels are the argv of podvm's labels, sorted, as the tests expect
// them for this process.
func ownLabels(t *testing.T, user map[string]string) []string {
	host, err := os.Hostname()
	require.NoError(t, err)
	l := map[string]string{
		LabelCreated: "*", LabelManaged: "true", LabelOwnerHost: host,
		LabelOwnerPID: strconv.Itoa(os.Getpid()), LabelOwner: self(), labelToken: "*",
	}
	for k, v := range user {
		l[k] = v
	}
	var a []string
	for _, k := range slices.Sorted(maps.Keys(l)) {
		a = append(a, "--label", k+"="+l[k])
	}
	return a
}

func concat(parts ...[]string) []string { return slices.Concat(parts...) }

// replay is a mock Run that plays res back as podman would: its output
// through the command's writers, then res and err.
func replay(res *exec.Result, err error) func(context.Context, exec.Command) (*exec.Result, error) {
	return func(_ context.Context, c exec.Command) (*exec.Result, error) {
		if c.Stdin != nil {
			// podman sends the command all of its stdin; one it was
			// still sending when it exited is a lost stream.
			io.Copy(io.Discard, c.Stdin)
		}
		if res != nil && c.Stdout != nil {
			io.WriteString(c.Stdout, res.Stdout)
		}
		if res != nil && c.Stderr != nil {
			io.WriteString(c.Stderr, res.Stderr)
		}
		return res, err
	}
}

// execCmd is the Command the CLI driver gives the executor for an exec
// with these podman arguments: the sandbox captures through the writers
// and enforces the timeout through the context.
func execCmd(stdin bool, args ...string) exec.Command {
	c := exec.Command{Name: "podman", Args: args, Stdout: anyWriter, Stderr: anyWriter, MaxOutputBytes: 1}
	if stdin {
		c.Stdin = anyReader
	}
	return c
}

func TestCLICreateArgv(t *testing.T) {
	t.Parallel()
	full := Config{
		Image:          "registry.example/img:1",
		Name:           "box",
		Mounts:         []Mount{{Source: "/src", Target: "/work"}, {Source: "/etc/ssl", Target: "/ssl", ReadOnly: true}},
		Workdir:        "/work",
		Env:            []string{"A=1", "B=two words"},
		User:           "1000:1000",
		Network:        "bridge",
		Memory:         64 << 20,
		CPUs:           1.5,
		Pids:           100,
		ReadOnlyRootfs: true,
		Labels:         map[string]string{"team": "x"},
		Pull:           PullAlways,
	}
	secure := []string{"--security-opt", "no-new-privileges", "--cap-drop", "all",
		"--cap-add", "CHOWN,DAC_OVERRIDE,FOWNER,FSETID,KILL,SETGID,SETUID"}
	pid1 := []string{"--init", "--entrypoint", `["/run/podman-init","-P"]`}
	for _, c := range []struct {
		name string
		cfg  Config
		opts []Option
		want exec.Command
	}{
		{"defaults", Config{Image: "img"}, nil, exec.Command{Name: "podman", MaxOutputBytes: podman.MessageBytes, Args: concat(
			[]string{"run", "-d", "--pull", "never"}, ownLabels(t, nil),
			[]string{"--network", "none"}, secure, []string{"--pids-limit", "1024", "--http-proxy=false"},
			pid1, []string{"img"})}},
		// Every Config field set; a remote URL, so /src is not checked.
		{"every field", full, []Option{WithURL("tcp://podman.example:8080"), WithPodman("/opt/podman")},
			exec.Command{Name: "/opt/podman", MaxOutputBytes: podman.MessageBytes, Args: concat(
				[]string{"--url", "tcp://podman.example:8080", "run", "-d", "--pull", "never", "--name", "box"},
				ownLabels(t, map[string]string{"team": "x"}),
				[]string{"--network", "bridge"}, secure, []string{"--pids-limit", "100", "--http-proxy=false",
					"--memory", "67108864", "--memory-swap", "67108864", "--cpus", "1.5",
					"--read-only", "--read-only-tmpfs",
					"-v", "/src:/work", "-v", "/etc/ssl:/ssl:ro",
					"--workdir", "/work", "--user", "1000:1000", "--env", "A=1", "--env", "B=two words"},
				pid1, []string{"registry.example/img:1"})}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			v, x := newMock(t, c.cfg, c.opts...)
			// The image is made present first (pulled under PullAlways),
			// then created with --pull never.
			if c.cfg.Pull == PullAlways {
				x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(func(_ context.Context, cmd exec.Command) (*exec.Result, error) {
					assert.Equal(t, []string{"pull", "-q", c.cfg.Image}, cmd.Args[len(cmd.Args)-3:])
					return &exec.Result{}, nil
				})
			}
			x.EXPECT().Run(gomock.Any(), gomock.Any()).Return(&exec.Result{Stdout: "amd64\n"}, nil)
			x.EXPECT().Run(gomock.Any(), cmdIs(c.want)).Return(&exec.Result{Stdout: testID + "\n"}, nil)
			require.NoError(t, v.Create(context.Background()))
			assert.Equal(t, testID, v.ID())
			assert.ErrorIs(t, v.Create(context.Background()), ErrAlreadyCreated)
		})
	}
}

func TestCLIRunArgv(t *testing.T) {
	t.Parallel()
	in, out, errw := strings.NewReader("input"), new(bytes.Buffer), new(bytes.Buffer)
	for _, c := range []struct {
		name string
		cfg  Config
		cmd  exec.Command
		want exec.Command
	}{
		{"defaults", Config{Image: "img"}, exec.Command{Name: "true"},
			execCmd(false, "exec", "--env", "PODVM_RUN=*", testID, "true")},
		{"config workdir and user", Config{Image: "img", Workdir: "/w", User: "nobody", Env: []string{"C=config"}},
			exec.Command{Name: "pwd"},
			execCmd(false, "exec", "--env", "PODVM_RUN=*", "--workdir", "/w", "--user", "nobody", testID, "pwd")},
		{"every command field", Config{Image: "img", Workdir: "/w", User: "1000"},
			exec.Command{Name: "-odd name", Args: []string{"-c", "$(x) `y`", ""}, Dir: "/d", Env: []string{"E=1", "F=a b"},
				Stdin: in, Stdout: out, Stderr: errw, Timeout: 3 * time.Second, MaxOutputBytes: 100},
			execCmd(true, "exec", "-i", "--env", "E=1", "--env", "F=a b", "--env", "PODVM_RUN=*",
				"--workdir", "/d", "--user", "1000", testID, "-odd name", "-c", "$(x) `y`", "")},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			v, x := created(t, c.cfg)
			x.EXPECT().Run(gomock.Any(), cmdIs(c.want)).DoAndReturn(replay(&exec.Result{Stdout: "out", Stderr: "err", ExitCode: 3}, nil))
			res, err := v.Run(context.Background(), c.cmd)
			require.NoError(t, err, "a non-zero exit is data")
			assert.Equal(t, "out", res.Stdout)
			assert.Equal(t, "err", res.Stderr)
			assert.Equal(t, 3, res.ExitCode)
		})
	}
}

func TestCLIRunPodmanFailures(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		sample string // in testdata/podman-stderr
		want   error  // nil: the command's own result
	}{
		{"exec-not-found-remote.127.txt", exec.ErrNotFound},
		{"exec-not-executable-loc.126.txt", exec.ErrPermission},
		{"exec-no-workdir-remote.127.txt", exec.ErrDirNotFound},
		{"exec-no-such-container-remote.125.txt", ErrNoSuchContainer},
		{"exec-not-running-loc.255.txt", ErrContainerNotRunning},
		{"unreachable-socket.125.txt", ErrUnavailable},
		{"command-exit-127.127.txt", nil},
		{"command-exit-125.125.txt", nil},
		{"command-error-line-127.127.txt", nil},
	} {
		t.Run(c.sample, func(t *testing.T) {
			t.Parallel()
			v, x := created(t, Config{Image: "img"})
			res := podmantest.Sample(t, c.sample)
			x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(replay(res, nil))
			got, err := v.Run(context.Background(), exec.Command{Name: "podvm-cmd"})
			if c.want == nil {
				require.NoError(t, err)
				assert.Equal(t, res.Stderr, got.Stderr)
				assert.Equal(t, res.ExitCode, got.ExitCode)
				return
			}
			assert.ErrorIs(t, err, c.want)
			assert.Nil(t, got, "a command that did not start has no Result")
			if c.want == exec.ErrNotFound {
				assert.ErrorContains(t, err, "podvm-cmd", "the error names the command")
			}
		})
	}
}

func TestCLIKillsInsideOnStop(t *testing.T) {
	t.Parallel()
	for _, stop := range []string{"timeout", "cancel"} {
		t.Run(stop, func(t *testing.T) {
			t.Parallel()
			v, x := created(t, Config{Image: "img", User: "65534"})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			cmd := exec.Command{Name: "sh", Args: []string{"-c", "sleep 300 & sleep 300"}}
			if stop == "timeout" {
				cmd.Timeout = 100 * time.Millisecond
			}
			partial := &exec.Result{Stdout: "started\n", StdoutBytes: 8, TimedOut: true, ExitCode: -1}
			var marker string
			gomock.InOrder(
				x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(func(rctx context.Context, c exec.Command) (*exec.Result, error) {
					assert.Zero(t, c.Timeout, "the sandbox enforces the timeout, through the context")
					_, hasDeadline := rctx.Deadline()
					assert.Equal(t, stop == "timeout", hasDeadline)
					for _, a := range c.Args {
						if strings.HasPrefix(a, markerKey+"=") {
							marker = a
						}
					}
					io.WriteString(c.Stdout, partial.Stdout)
					if stop == "cancel" {
						cancel()
					}
					<-rctx.Done() // as the executor does: it returns when the run is stopped
					return partial, fmt.Errorf("exec: podman: %w", rctx.Err())
				}),
				x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(func(kctx context.Context, c exec.Command) (*exec.Result, error) {
					assert.NoError(t, kctx.Err(), "the kill runs with a fresh context")
					_, hasDeadline := kctx.Deadline()
					assert.True(t, hasDeadline, "the kill is bounded")
					want := []string{"exec", "--env", killCheck, "--user", "65534", testID, "/bin/sh", "-c", killScript, "podvm-kill", marker}
					assert.Equal(t, want, c.Args)
					io.WriteString(c.Stdout, killDone+"\n")
					return &exec.Result{}, nil
				}),
			)
			res, err := v.Run(ctx, cmd)
			assert.Equal(t, partial.Stdout, res.Stdout, "the partial output is kept")
			assert.True(t, res.TimedOut)
			assert.Equal(t, -1, res.ExitCode)
			if stop == "timeout" {
				assert.ErrorIs(t, err, context.DeadlineExceeded)
				assert.ErrorContains(t, err, "vm: sh: timed out after 100ms")
			} else {
				assert.ErrorIs(t, err, context.Canceled)
			}
			assert.NotEmpty(t, marker)
		})
	}
}

// timedOut is a mock Run of a command that runs until it is stopped.
func timedOut(ctx context.Context, _ exec.Command) (*exec.Result, error) {
	<-ctx.Done()
	return &exec.Result{TimedOut: true, ExitCode: -1}, ctx.Err()
}

func TestCLIKillFailureIsReported(t *testing.T) {
	t.Parallel()
	v, x := created(t, Config{Image: "img"})
	gomock.InOrder(
		x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(timedOut),
		// No /bin/sh in the image: no retry can help.
		x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(replay(podmantest.Sample(t, "exec-not-found-remote.127.txt"), nil)),
	)
	_, err := v.Run(context.Background(), exec.Command{Name: "x", Timeout: 10 * time.Millisecond})
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.ErrorContains(t, err, "killing its processes")
}

// A kill refused while a fork bomb holds every pid is tried again.
func TestCLIKillIsRetried(t *testing.T) {
	t.Parallel()
	v, x := created(t, Config{Image: "img"})
	gomock.InOrder(
		x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(timedOut),
		x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(replay(&exec.Result{ExitCode: 2, Stderr: "sh: can't fork: Resource temporarily unavailable\n"}, nil)).Times(2),
		x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(replay(&exec.Result{Stdout: killDone + "\n"}, nil)),
	)
	_, err := v.Run(context.Background(), exec.Command{Name: "x", Timeout: 10 * time.Millisecond})
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.NotContains(t, err.Error(), "killing its processes", "the third try succeeded")
}

func TestCLIRemove(t *testing.T) {
	t.Parallel()
	rm := exec.Command{Name: "podman", MaxOutputBytes: podman.MessageBytes, Args: []string{"rm", "-f", "-t", "0", "--ignore", testID}}

	t.Run("idempotent", func(t *testing.T) {
		t.Parallel()
		v, x := created(t, Config{Image: "img"})
		x.EXPECT().Run(gomock.Any(), cmdIs(rm)).Return(&exec.Result{Stdout: testID + "\n"}, nil).Times(1)
		ctx := context.Background()
		require.NoError(t, v.Remove(ctx))
		require.NoError(t, v.Remove(ctx), "the second Remove calls no podman")
		res, err := v.Run(ctx, exec.Command{Name: "true"})
		assert.ErrorIs(t, err, ErrRemoved)
		assert.Nil(t, res)
		assert.ErrorIs(t, v.CopyIn(ctx, "/tmp", strings.NewReader("")), ErrRemoved)
		assert.ErrorIs(t, v.CopyOut(ctx, "/tmp", io.Discard), ErrRemoved)
		assert.ErrorIs(t, v.Create(ctx), ErrRemoved)
	})
	t.Run("before create", func(t *testing.T) {
		t.Parallel()
		v, _ := newMock(t, Config{Image: "img"}) // any podman call fails the test
		require.NoError(t, v.Remove(context.Background()))
		assert.ErrorIs(t, v.Create(context.Background()), ErrRemoved)
	})
	t.Run("already gone", func(t *testing.T) {
		t.Parallel()
		v, x := created(t, Config{Image: "img"})
		x.EXPECT().Run(gomock.Any(), cmdIs(rm)).Return(podmantest.Sample(t, "rm-no-such-container-remote.1.txt"), nil)
		assert.NoError(t, v.Remove(context.Background()))
	})
	t.Run("failed, then retried", func(t *testing.T) {
		t.Parallel()
		v, x := created(t, Config{Image: "img"})
		gomock.InOrder(
			x.EXPECT().Run(gomock.Any(), cmdIs(rm)).Return(podmantest.Sample(t, "unreachable-socket.125.txt"), nil),
			x.EXPECT().Run(gomock.Any(), cmdIs(rm)).Return(&exec.Result{}, nil),
		)
		assert.ErrorIs(t, v.Remove(context.Background()), ErrUnavailable)
		_, err := v.Run(context.Background(), exec.Command{Name: "true"})
		assert.ErrorIs(t, err, ErrRemoved, "Run is refused once Remove was called")
		assert.NoError(t, v.Remove(context.Background()))
	})
}

// tokenOf returns the value of our token label in a `podman run` argv.
func tokenOf(args []string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, labelToken+"="); ok {
			return v
		}
	}
	return ""
}

func TestCLICreateFailureRemovesWhatItMade(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name   string
		result *exec.Result
		err    error
		want   error
	}{
		{"name in use", podmantest.Sample(t, "run-name-in-use-remote.125.txt"), nil, ErrNameInUse},
		{"start failed", podmantest.Sample(t, "run-oci-error-remote.126.txt"), nil, ErrPodman},
		{"image", podmantest.Sample(t, "run-image-not-known-remote.125.txt"), nil, ErrImageNotFound},
		{"cancelled", &exec.Result{TimedOut: true, ExitCode: -1}, fmt.Errorf("exec: podman: %w", context.Canceled), context.Canceled},
		{"garbage", &exec.Result{Stdout: "not an ID\n"}, nil, ErrPodman},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			v, x := newMock(t, Config{Image: "img", Name: "box"})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var token string
			const made = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
			gomock.InOrder(
				x.EXPECT().Run(gomock.Any(), cmdIs(inspectArch)).Return(&exec.Result{Stdout: "amd64\n"}, nil),
				x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(func(_ context.Context, cmd exec.Command) (*exec.Result, error) {
					token = tokenOf(cmd.Args)
					if c.err != nil {
						cancel()
					}
					return c.result, c.err
				}),
				x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(func(kctx context.Context, cmd exec.Command) (*exec.Result, error) {
					assert.NoError(t, kctx.Err(), "cleanup runs with a context of its own")
					assert.Equal(t, []string{"ps", "-a", "--filter", "label=" + labelToken + "=" + token, "--format", "json"}, cmd.Args,
						"found by our label, never by Name: the name may be another's")
					return &exec.Result{Stdout: `[{"Id":"` + made + `"}]`}, nil
				}),
				x.EXPECT().Run(gomock.Any(), cmdIs(exec.Command{Name: "podman", MaxOutputBytes: podman.MessageBytes, Args: []string{"rm", "-f", "-t", "0", "--ignore", made}})).
					Return(&exec.Result{}, nil),
			)
			err := v.Create(ctx)
			assert.ErrorIs(t, err, c.want)
			assert.NotEmpty(t, token)
			assert.Empty(t, v.ID())
			assert.ErrorIs(t, v.Create(context.Background()), ErrAlreadyCreated)
			assert.NoError(t, v.Remove(context.Background()))
			assert.NoError(t, v.Remove(context.Background()))
		})
	}
}

func TestCLIPodmanUnavailable(t *testing.T) {
	t.Parallel()
	v, x := newMock(t, Config{Image: "img"}, WithPodman("/no/podman"))
	x.EXPECT().Run(gomock.Any(), gomock.Any()).Return(nil, fmt.Errorf("%w: /no/podman", exec.ErrNotFound))
	err := v.Create(context.Background())
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.NotErrorIs(t, err, exec.ErrNotFound, "must not read as a command missing in the sandbox")
	assert.NoError(t, v.Remove(context.Background()), "nothing was made: nothing to remove, no podman call")
}

func TestCLIRefusesInvalidInput(t *testing.T) {
	t.Parallel()
	x := execmock.NewMockExecutor(gomock.NewController(t)) // no call expected
	for name, cfg := range map[string]Config{
		"empty image":          {},
		"relative mount":       {Image: "img", Mounts: []Mount{{Source: "src", Target: "/w"}}},
		"mount over root":      {Image: "img", Mounts: []Mount{{Source: "/src", Target: "/"}}},
		"mount over the agent": {Image: "img", Mounts: []Mount{{Source: "/tmp", Target: "/.podvm/"}}},
		"mount in the agent":   {Image: "img", Mounts: []Mount{{Source: "/tmp", Target: "/.podvm/podvm-agent"}}},
		"missing local source": {Image: "img", Mounts: []Mount{{Source: "/podvm/no/such/dir", Target: "/w"}}},
		"bad env":              {Image: "img", Env: []string{"NOEQUALS"}},
		"bad pull":             {Image: "img", Pull: "sometimes"},
		"flag as image":        {Image: "--privileged"},
	} {
		_, err := NewCLIVM(cfg, x, WithURL("unix:///run/podman.sock"))
		assert.ErrorIs(t, err, ErrInvalidConfig, name)
	}
	for name, opt := range map[string]Option{"empty path": WithPodman(""), "flag as URL": WithURL("--help")} {
		_, err := NewCLIVM(Config{Image: "img"}, x, opt)
		assert.ErrorIs(t, err, ErrInvalidConfig, name)
	}

	_, err := NewCLIVM(Config{Image: "img", PodmanExec: true, Mounts: []Mount{{Source: "/tmp", Target: "/.podvm"}}}, x)
	assert.NoError(t, err, "without the agent, /.podvm is the user's")

	v, err := NewCLIVM(Config{Image: "img"}, x)
	require.NoError(t, err)
	ctx := context.Background()
	_, err = v.Run(ctx, exec.Command{Name: "true"})
	assert.ErrorIs(t, err, ErrNotCreated)
	assert.ErrorIs(t, v.CopyIn(ctx, "/tmp", strings.NewReader("")), ErrNotCreated)

	v, x = created(t, Config{Image: "img"})
	for name, cmd := range map[string]exec.Command{
		"empty name":       {},
		"NUL in argument":  {Name: "echo", Args: []string{"a\x00b"}},
		"env without '='":  {Name: "env", Env: []string{"X"}},
		"negative timeout": {Name: "true", Timeout: -1},
	} {
		res, err := v.Run(ctx, cmd)
		assert.ErrorIs(t, err, exec.ErrInvalidCommand, name)
		assert.Nil(t, res, name)
	}
	assert.Error(t, v.CopyIn(ctx, "tmp", strings.NewReader("")), "relative dir")
	assert.Error(t, v.CopyOut(ctx, "etc/passwd", io.Discard), "relative path")
	_ = x
}

func TestCLICopyIn(t *testing.T) {
	t.Parallel()
	safe := testkit.Tar(t, testkit.Dir("box/", 0o755), testkit.File("box/f", strings.Repeat("x", 70000), 0o644))
	unsafe := testkit.Tar(t, testkit.File("ok", "x", 0), testkit.File("../escape", "x", 0))
	// podman cp - spools stdin into TMPDIR: a private one, per call.
	want := exec.Command{Name: "podman", Args: []string{"cp", "-", testID + ":/dst"}, Env: []string{"TMPDIR=*"}, Stdin: anyReader, MaxOutputBytes: podman.MessageBytes}

	t.Run("streamed", func(t *testing.T) {
		t.Parallel()
		v, x := created(t, Config{Image: "img"})
		var got []byte
		var tmp string
		x.EXPECT().Run(gomock.Any(), cmdIs(want)).DoAndReturn(func(_ context.Context, c exec.Command) (*exec.Result, error) {
			tmp = strings.TrimPrefix(c.Env[0], "TMPDIR=")
			if fi, err := os.Stat(tmp); assert.NoError(t, err) {
				assert.Equal(t, fs.ModeDir|0o700, fi.Mode(), "podman's TMPDIR is private")
			}
			var err error
			got, err = io.ReadAll(c.Stdin)
			return &exec.Result{}, err
		})
		require.NoError(t, v.CopyIn(context.Background(), "/dst", bytes.NewReader(safe)))
		assert.Equal(t, safe, got, "the guard re-emits a safe archive as it was")
		_, err := os.Stat(tmp)
		assert.ErrorIs(t, err, fs.ErrNotExist, "podman's TMPDIR, and what it spooled there, is removed")
	})
	t.Run("unsafe", func(t *testing.T) {
		t.Parallel()
		v, x := created(t, Config{Image: "img"})
		x.EXPECT().Run(gomock.Any(), cmdIs(want)).DoAndReturn(func(_ context.Context, c exec.Command) (*exec.Result, error) {
			_, err := io.ReadAll(c.Stdin)
			assert.Error(t, err)
			// As os/exec does: the copy error loses to podman's exit.
			return podmantest.Sample(t, "cp-in-not-a-dir-remote.125.txt"), nil
		})
		err := v.CopyIn(context.Background(), "/dst", bytes.NewReader(unsafe))
		assert.ErrorIs(t, err, ErrUnsafeArchive)
		assert.ErrorContains(t, err, "../escape")
	})
	t.Run("podman fails", func(t *testing.T) {
		t.Parallel()
		v, x := created(t, Config{Image: "img"})
		x.EXPECT().Run(gomock.Any(), cmdIs(want)).Return(podmantest.Sample(t, "cp-in-no-such-container-remote.125.txt"), nil)
		assert.ErrorIs(t, v.CopyIn(context.Background(), "/dst", bytes.NewReader(safe)), ErrNoSuchContainer)
	})
}

func TestCLICopyOut(t *testing.T) {
	t.Parallel()
	safe := testkit.Tar(t, testkit.Dir("box/", 0o755), testkit.File("box/f", strings.Repeat("x", 200000), 0o644))
	unsafe := testkit.Tar(t, testkit.Symlink("box/link", "/etc/shadow"))
	want := exec.Command{Name: "podman", Args: []string{"cp", testID + ":/src/box", "-"}, Stdout: anyWriter, MaxOutputBytes: podman.MessageBytes}
	// podman writes the archive, padded to a tar record, to the Stdout writer.
	writes := func(archive []byte, res *exec.Result) func(context.Context, exec.Command) (*exec.Result, error) {
		return func(_ context.Context, c exec.Command) (*exec.Result, error) {
			padded := append(slices.Clone(archive), make([]byte, 10240-len(archive)%10240)...)
			for chunk := range slices.Chunk(padded, 4096) {
				if _, err := c.Stdout.Write(chunk); err != nil {
					return res, fmt.Errorf("exec: podman: stdout writer: %w", err)
				}
			}
			return res, nil
		}
	}
	t.Run("streamed", func(t *testing.T) {
		t.Parallel()
		v, x := created(t, Config{Image: "img"})
		x.EXPECT().Run(gomock.Any(), cmdIs(want)).DoAndReturn(writes(safe, &exec.Result{}))
		var out bytes.Buffer
		require.NoError(t, v.CopyOut(context.Background(), "/src/box", &out))
		assert.Equal(t, safe, out.Bytes())
	})
	t.Run("unsafe", func(t *testing.T) {
		t.Parallel()
		v, x := created(t, Config{Image: "img"})
		x.EXPECT().Run(gomock.Any(), cmdIs(want)).DoAndReturn(writes(unsafe, &exec.Result{}))
		err := v.CopyOut(context.Background(), "/src/box", io.Discard)
		assert.ErrorIs(t, err, ErrUnsafeArchive)
	})
	t.Run("writer fails", func(t *testing.T) {
		t.Parallel()
		v, x := created(t, Config{Image: "img"})
		x.EXPECT().Run(gomock.Any(), cmdIs(want)).DoAndReturn(writes(safe, &exec.Result{}))
		broken := errors.New("disk full")
		err := v.CopyOut(context.Background(), "/src/box", testkit.FailingWriter{Err: broken})
		assert.ErrorIs(t, err, broken)
	})
	// Podman says the same of a missing path and of one under a file: a
	// copy out of the parent, to its first entry, tells.
	for _, c := range []struct {
		name   string
		parent testkit.Entry
		want   error
	}{
		{"podman fails", testkit.Dir("src/", 0o755), fs.ErrNotExist},
		{"under a file", testkit.File("src", "", 0o644), syscall.ENOTDIR},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			v, x := created(t, Config{Image: "img"})
			x.EXPECT().Run(gomock.Any(), cmdIs(want)).Return(podmantest.Sample(t, "cp-out-no-such-path-remote.125.txt"), nil)
			parent := exec.Command{Name: "podman", Args: []string{"cp", testID + ":/src", "-"}, Stdout: anyWriter, MaxOutputBytes: podman.MessageBytes}
			x.EXPECT().Run(gomock.Any(), cmdIs(parent)).DoAndReturn(writes(testkit.Tar(t, c.parent), &exec.Result{}))
			err := v.CopyOut(context.Background(), "/src/box", io.Discard)
			assert.ErrorIs(t, err, c.want)
			for _, other := range []error{fs.ErrNotExist, syscall.ENOTDIR, ErrPodman} {
				if other != c.want {
					assert.NotErrorIs(t, err, other, "one failure, one sentinel")
				}
			}
			assert.ErrorContains(t, err, "could not be found")
		})
	}
}

// With an image archive, a missing image is loaded from it and run with
// no registry pull.
func TestCLIImageArchive(t *testing.T) {
	t.Parallel()
	archive := filepath.Join(t.TempDir(), "image.tar")
	require.NoError(t, os.WriteFile(archive, []byte("tar"), 0o644))
	arch := &exec.Result{Stdout: "amd64\n"}
	v, x := newMock(t, Config{Image: "img", Pull: PullAlways, ImageArchive: archive})
	gomock.InOrder(
		x.EXPECT().Run(gomock.Any(), cmdIs(exec.Command{Name: "podman", MaxOutputBytes: podman.MessageBytes, Args: []string{"load", "-q", "-i", archive}})).
			Return(&exec.Result{Stdout: "Loaded image: localhost/img:latest\n"}, nil),
		x.EXPECT().Run(gomock.Any(), cmdIs(inspectArch)).Return(arch, nil),
		x.EXPECT().Run(gomock.Any(), gomock.Any()).DoAndReturn(func(_ context.Context, c exec.Command) (*exec.Result, error) {
			assert.Equal(t, []string{"run", "-d", "--pull", "never"}, c.Args[:4], "no registry after the load")
			return &exec.Result{Stdout: testID + "\n"}, nil
		}),
	)
	require.NoError(t, v.Create(context.Background()))

	present, x := newMock(t, Config{Image: "img", ImageArchive: archive})
	gomock.InOrder(
		x.EXPECT().Run(gomock.Any(), cmdIs(inspectArch)).Return(arch, nil),
		x.EXPECT().Run(gomock.Any(), gomock.Any()).Return(&exec.Result{Stdout: testID + "\n"}, nil),
	)
	require.NoError(t, present.Create(context.Background()), "a present image is not loaded again")

	gone, x := newMock(t, Config{Image: "img", ImageArchive: filepath.Join(t.TempDir(), "none.tar")})
	x.EXPECT().Run(gomock.Any(), cmdIs(inspectArch)).Return(podmantest.Sample(t, "run-image-not-known-loc.125.txt"), nil)
	assert.ErrorIs(t, gone.Create(context.Background()), ErrInvalidConfig, "a missing archive names itself")
}

// Whether the CLI driver's podman talks to a local service follows what
// podman is given: --url, else CONTAINER_HOST, except after New fell back
// from a socket that did not answer, which runs podman without it.
func TestCLIDriverLocal(t *testing.T) {
	t.Setenv("CONTAINER_HOST", "tcp://127.0.0.1:1")
	for _, c := range []struct {
		name     string
		opts     []Option
		fallback bool
		local    bool
	}{
		{"CONTAINER_HOST remote", nil, false, false},
		{"fallback drops CONTAINER_HOST", nil, true, true},
		{"--url local", []Option{WithURL("unix:///run/podman/podman.sock")}, false, true},
		{"--url remote, fallback keeps it", []Option{WithURL("ssh://h/run/podman/podman.sock")}, true, false},
	} {
		d, err := newOptions(append(c.opts, WithPodman("/bin/true"))).cliDriver(c.fallback)
		require.NoError(t, err, c.name)
		local, _ := d.Local()
		assert.Equal(t, c.local, local, c.name)
	}
}

// An image of an architecture the module carries no agent for is refused
// before anything is made, naming the way out.
func TestCLICreateUnknownArch(t *testing.T) {
	t.Parallel()
	x := execmock.NewMockExecutor(gomock.NewController(t)) // nothing but the info and the inspect
	expectInfo(x)
	v, err := NewCLIVM(Config{Image: "img"}, x)
	require.NoError(t, err)
	x.EXPECT().Run(gomock.Any(), cmdIs(inspectArch)).Return(&exec.Result{Stdout: "mips64le\n"}, nil)
	err = v.Create(context.Background())
	assert.ErrorIs(t, err, ErrNotSupported)
	assert.ErrorContains(t, err, "PodmanExec")
	assert.NoError(t, v.Remove(context.Background()))
}
