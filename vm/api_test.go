package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/libpod/libpodtest"
	"github.com/podvm/podvm/internal/testkit"
)

// These tests run APIVM against a fake service replaying answers
// recorded from Podman (testdata/libpod); the integration tests run it
// against the real one.

const testImage = "localhost/podvm-test:latest"

// fakeVM returns an APIVM for cfg on a fake service of version with
// routes (over libpodtest.Defaults), not created.
func fakeVM(t *testing.T, version string, routes libpodtest.Routes, cfg Config) (*APIVM, *libpodtest.Service) {
	t.Helper()
	svc := libpodtest.Serve(t, version, routes)
	if cfg.Image == "" {
		cfg.Image = testImage
	}
	cfg.PodmanExec = true // the fake service runs exec sessions, not the agent
	v, err := NewAPIVM(context.Background(), svc.URI, cfg)
	require.NoError(t, err)
	return v, svc
}

// createdVM is fakeVM, created.
func createdVM(t *testing.T, version string, routes libpodtest.Routes) (*APIVM, *libpodtest.Service) {
	t.Helper()
	v, svc := fakeVM(t, version, routes, Config{})
	require.NoError(t, v.Create(context.Background()))
	return v, svc
}

// routes lists the routes the service was asked, in order.
func routes(svc *libpodtest.Service) []string {
	var r []string
	for _, req := range svc.Requests() {
		r = append(r, req.Route)
	}
	return r
}

// body is the body of the first request svc received on route.
func body(t *testing.T, svc *libpodtest.Service, route string) []byte {
	t.Helper()
	i := slices.Index(routes(svc), route)
	require.GreaterOrEqual(t, i, 0, "no %s in %v", route, routes(svc))
	return svc.Requests()[i].Body
}

var sh3 = exec.Command{Name: "sh", Args: []string{"-c", "echo hi; echo oops >&2; exit 3"}}

func TestAPIUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	svc := libpodtest.Serve(t, "4.3", nil)
	v, err := NewAPIVM(ctx, svc.URI, Config{Image: testImage, PodmanExec: true})
	require.NoError(t, err)
	require.NoError(t, v.Create(ctx))
	svc.Close() // the socket is gone

	res, err := v.Run(ctx, sh3)
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.Nil(t, res)
	assert.ErrorIs(t, v.CopyIn(ctx, "/tmp", bytes.NewReader(nil)), ErrUnavailable)
	assert.ErrorIs(t, v.CopyOut(ctx, "/tmp", io.Discard), ErrUnavailable)
	assert.ErrorIs(t, v.Remove(ctx), ErrUnavailable)

	_, err = NewAPIVM(ctx, svc.URI, Config{Image: testImage})
	assert.ErrorIs(t, err, ErrUnavailable)
	assert.ErrorContains(t, err, svc.URI)
}

// The service's own failure to start a command is an exec error naming
// it; a command's own 126 or 127 is data.
func TestAPIExecFailures(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		answer string
		want   error
	}{
		{"exec-start-not-found", exec.ErrNotFound},
		{"exec-start-not-executable", exec.ErrPermission},
		{"exec-start-is-directory", exec.ErrPermission},
		{"exec-start-no-workdir", exec.ErrDirNotFound},
		{"exec-start-unknown-user", ErrPodman},
		{"exec-start-127-is-data", nil},
	} {
		t.Run(c.answer, func(t *testing.T) {
			t.Parallel()
			v, _ := createdVM(t, "4.3", libpodtest.Routes{
				"POST /exec/{id}/start": libpodtest.Recorded(c.answer),
				"GET /exec/{id}/json":   libpodtest.Recorded(c.answer + "-inspect"),
			})
			var live bytes.Buffer
			res, err := v.Run(context.Background(), exec.Command{Name: "the-command", Stderr: &live, MaxOutputBytes: 10})
			if c.want == nil {
				require.NoError(t, err)
				assert.Equal(t, 127, res.ExitCode)
				assert.Equal(t, "gone\n", res.Stderr)
				return
			}
			assert.ErrorIs(t, err, c.want)
			assert.Nil(t, res)
			if c.want != ErrPodman {
				assert.ErrorContains(t, err, "the-command")
			}
		})
	}
}

func TestAPIRun(t *testing.T) {
	t.Parallel()
	v, svc := createdVM(t, "4.3", nil)
	var liveOut, liveErr bytes.Buffer
	cmd := sh3
	cmd.Env = []string{"A=1"}
	cmd.Dir = "/work"
	cmd.Stdout, cmd.Stderr = &liveOut, &liveErr
	res, err := v.Run(context.Background(), cmd)
	require.NoError(t, err)
	assert.Equal(t, "hi\n", res.Stdout)
	assert.Equal(t, "oops\n", res.Stderr)
	assert.Equal(t, 3, res.ExitCode)
	assert.Equal(t, int64(3), res.StdoutBytes)
	assert.Equal(t, "hi\n", liveOut.String())
	assert.Equal(t, "oops\n", liveErr.String())

	var sent libpod.ExecConfig
	for _, r := range svc.Requests() {
		if r.Route == "POST /containers/{id}/exec" {
			require.NoError(t, json.Unmarshal(r.Body, &sent))
		}
	}
	assert.Equal(t, []string{"sh", "-c", "echo hi; echo oops >&2; exit 3"}, sent.Cmd)
	assert.Equal(t, "A=1", sent.Env[0])
	assert.True(t, strings.HasPrefix(sent.Env[1], markerKey+"="))
	assert.Equal(t, "/work", sent.WorkingDir)
	assert.False(t, sent.AttachStdin, "no stdin, none attached")
	assert.True(t, sent.AttachStdout && sent.AttachStderr)
	assert.NotContains(t, routes(svc), "POST /exec/{id}/remove")
}

func TestAPIRunCapsOutput(t *testing.T) {
	t.Parallel()
	v, _ := createdVM(t, "4.3", libpodtest.Routes{
		"POST /exec/{id}/start": libpodtest.Recorded("exec-start-big"),
		"GET /exec/{id}/json":   libpodtest.Recorded("exec-start-big-inspect"),
	})
	var live bytes.Buffer
	res, err := v.Run(context.Background(), exec.Command{Name: "x", MaxOutputBytes: 1000, Stdout: &live})
	require.NoError(t, err)
	assert.True(t, res.Truncated)
	assert.Equal(t, int64(256<<10), res.StdoutBytes)
	assert.Less(t, len(res.Stdout), 1100)
	assert.Equal(t, 256<<10, live.Len(), "the live writer gets everything")
}

// The exit status is read only once the stream is drained: output still
// in flight when the session already reports its exit is not lost.
func TestAPIRunExitCodeAfterDrain(t *testing.T) {
	t.Parallel()
	name := "exec-start-exit-3"
	firstFrame := libpodtest.HeaderEnd(name) + 8 + 3 // header, then "hi\n"
	v, svc := createdVM(t, "4.3", libpodtest.Routes{
		// stderr comes 300 ms after stdout, the exit already recorded.
		"POST /exec/{id}/start": libpodtest.Pause(name, firstFrame, 300*time.Millisecond),
	})
	res, err := v.Run(context.Background(), sh3)
	require.NoError(t, err)
	assert.Equal(t, "hi\n", res.Stdout)
	assert.Equal(t, "oops\n", res.Stderr, "output after the exit was recorded")
	assert.Equal(t, 3, res.ExitCode)
	assert.GreaterOrEqual(t, res.Duration, 300*time.Millisecond)

	// A session still running when its stream has ended is inspected again
	// until it stops.
	v, svc = createdVM(t, "4.3", libpodtest.Routes{
		"GET /exec/{id}/json": libpodtest.Seq(
			libpodtest.Recorded("exec-inspect-running"), libpodtest.Recorded("exec-inspect-running"),
			libpodtest.Recorded("exec-start-exit-3-inspect")),
	})
	res, err = v.Run(context.Background(), sh3)
	require.NoError(t, err)
	assert.Equal(t, 3, res.ExitCode)
	assert.Equal(t, 3, svc.Count("GET /exec/{id}/json"))
}

// A stream that stays open after its process has exited is closed; Run
// does not wait for it.
func TestAPIRunHangingStream(t *testing.T) {
	t.Parallel()
	v, svc := createdVM(t, "4.3", libpodtest.Routes{"POST /exec/{id}/start": libpodtest.Hold("exec-start-exit-3")})
	start := time.Now()
	res, err := v.Run(context.Background(), sh3)
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 5*time.Second)
	assert.Equal(t, "hi\n", res.Stdout)
	assert.Equal(t, "oops\n", res.Stderr)
	assert.Equal(t, 3, res.ExitCode)
	assert.False(t, res.TimedOut)
	assert.GreaterOrEqual(t, svc.Count("GET /exec/{id}/json"), 2, "polled while the stream was open, then read the exit")
}

// A connection dropped mid-stream is ErrUnavailable, with the output so
// far; what runs is killed.
func TestAPIRunStreamDropped(t *testing.T) {
	t.Parallel()
	name := "exec-start-interleaved"
	v, svc := createdVM(t, "4.3", libpodtest.Routes{
		"POST /exec/{id}/start": libpodtest.Seq(libpodtest.Cut(name, libpodtest.HeaderEnd(name)+1000), libpodtest.Stream("podvm-kill: done\n")),
		"GET /exec/{id}/json":   libpodtest.Recorded("exec-start-big-inspect"),
	})
	res, err := v.Run(context.Background(), exec.Command{Name: "x"})
	assert.ErrorIs(t, err, ErrUnavailable)
	require.NotNil(t, res)
	assert.True(t, strings.HasPrefix(res.Stdout, "out 0\nout 1\n"), res.Stdout)
	assert.Less(t, res.StdoutBytes+res.StderrBytes, int64(1000))
	assert.Equal(t, -1, res.ExitCode)
	assert.Equal(t, 2, svc.Count("POST /containers/{id}/exec"), "a second session kills what ran")
}

// On timeout the run is killed inside the sandbox by a second session;
// only a service that has the endpoint (Podman 4.8+) is asked to
// force-remove the session as well.
func TestAPIRunTimeoutKillsByVersion(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		version string
		remove  int
	}{{"4.3", 0}, {"5.4", 1}} {
		t.Run(c.version, func(t *testing.T) {
			t.Parallel()
			routes := libpodtest.Routes{
				// Session 1, the run, prints and hangs; session 2 is the kill.
				"POST /exec/{id}/start": libpodtest.ByExec(libpodtest.Hold("exec-start-exit-3"), libpodtest.Stream("podvm-kill: done\n")),
				"GET /exec/{id}/json":   libpodtest.ByExec(libpodtest.Recorded("exec-inspect-running"), libpodtest.Recorded("exec-start-big-inspect")),
			}
			if c.remove > 0 {
				routes["POST /exec/{id}/remove"] = libpodtest.Recorded("exec-remove-v5")
			}
			v, svc := createdVM(t, c.version, routes)
			cmd := sh3
			cmd.Timeout = 300 * time.Millisecond
			start := time.Now()
			res, err := v.Run(context.Background(), cmd)
			assert.ErrorIs(t, err, context.DeadlineExceeded)
			assert.Less(t, time.Since(start), 5*time.Second)
			require.NotNil(t, res)
			assert.True(t, res.TimedOut)
			assert.Equal(t, -1, res.ExitCode)
			assert.Equal(t, "hi\n", res.Stdout, "the partial output")

			var kill libpod.ExecConfig
			var removed []*libpodtest.Request
			for _, r := range svc.Requests() {
				switch r.Route {
				case "POST /containers/{id}/exec":
					require.NoError(t, json.Unmarshal(r.Body, &kill)) // the last: the kill
				case "POST /exec/{id}/remove":
					removed = append(removed, r)
				}
			}
			assert.Equal(t, "/bin/sh", kill.Cmd[0])
			assert.Contains(t, kill.Cmd, "podvm-kill")
			assert.True(t, strings.HasPrefix(kill.Cmd[len(kill.Cmd)-1], markerKey+"="))
			require.Len(t, removed, c.remove)
			if c.remove > 0 {
				assert.Contains(t, removed[0].URL.Path, libpodtest.ExecID(1))
				assert.JSONEq(t, `{"Force":true}`, string(removed[0].Body))
			}
		})
	}
}

func TestAPIRunCancelled(t *testing.T) {
	t.Parallel()
	v, _ := createdVM(t, "4.3", libpodtest.Routes{
		"POST /exec/{id}/start": libpodtest.ByExec(libpodtest.Hold("exec-start-exit-3"), libpodtest.Stream("podvm-kill: done\n")),
		"GET /exec/{id}/json":   libpodtest.ByExec(libpodtest.Recorded("exec-inspect-running"), libpodtest.Recorded("exec-start-big-inspect")),
	})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	res, err := v.Run(ctx, sh3)
	assert.ErrorIs(t, err, context.Canceled)
	require.NotNil(t, res)
	assert.True(t, res.TimedOut)

	res, err = v.Run(ctx, sh3)
	assert.ErrorIs(t, err, context.Canceled, "a context already done")
	assert.Nil(t, res)
}

// A kill that cannot start (at the pids limit, say) is tried again.
func TestAPIRunKillRetried(t *testing.T) {
	t.Parallel()
	v, svc := createdVM(t, "4.3", libpodtest.Routes{
		"POST /exec/{id}/start": libpodtest.ByExec(libpodtest.Hold("exec-start-exit-3"),
			libpodtest.Recorded("exec-start-unknown-user"), libpodtest.Stream("podvm-kill: done\n")),
		"GET /exec/{id}/json": libpodtest.ByExec(libpodtest.Recorded("exec-inspect-running"),
			libpodtest.Recorded("exec-inspect-running"), libpodtest.Recorded("exec-start-big-inspect")),
	})
	cmd := sh3
	cmd.Timeout = 200 * time.Millisecond
	res, err := v.Run(context.Background(), cmd)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.NotErrorIs(t, err, ErrPodman, "the second kill succeeded")
	require.NotNil(t, res)
	assert.True(t, res.TimedOut)
	assert.Equal(t, 3, svc.Count("POST /containers/{id}/exec"))
}

func TestAPIRunStdin(t *testing.T) {
	t.Parallel()
	// The stream stays open while stdin is copied.
	name := "exec-start-exit-3"
	v, svc := createdVM(t, "4.3", libpodtest.Routes{
		"POST /exec/{id}/start": libpodtest.Pause(name, libpodtest.HeaderEnd(name), 200*time.Millisecond)})
	cmd := sh3
	cmd.Stdin = strings.NewReader("input")
	_, err := v.Run(context.Background(), cmd)
	require.NoError(t, err)
	var sent libpod.ExecConfig
	for _, r := range svc.Requests() {
		if r.Route == "POST /containers/{id}/exec" {
			require.NoError(t, json.Unmarshal(r.Body, &sent))
		}
	}
	assert.True(t, sent.AttachStdin)

	boom := errors.New("boom")
	cmd.Stdin = io.MultiReader(strings.NewReader("in"), iotest.ErrReader(boom))
	res, err := v.Run(context.Background(), cmd)
	if assert.ErrorIs(t, err, boom) {
		assert.NotNil(t, res)
	}
}

func TestAPIConcurrentRunsUnit(t *testing.T) {
	t.Parallel()
	v, svc := createdVM(t, "4.3", nil)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := v.Run(context.Background(), sh3)
			if assert.NoError(t, err) {
				assert.Equal(t, "hi\n", res.Stdout)
				assert.Equal(t, 3, res.ExitCode)
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 16, svc.Count("POST /exec/{id}/start"))
}

func TestAPICreateSpec(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	v, svc := fakeVM(t, "4.3", nil, Config{
		Name:           "box",
		Mounts:         []Mount{{Source: dir, Target: "/src", ReadOnly: true}, {Source: dir, Target: "/out"}},
		Workdir:        "/src",
		Env:            []string{"A=1", "B=x=y"},
		User:           "65534:65534",
		Network:        "my-net",
		Memory:         64 << 20,
		CPUs:           0.5,
		ReadOnlyRootfs: true,
		Labels:         map[string]string{"team": "build"},
	})
	require.NoError(t, v.Create(context.Background()))
	assert.Len(t, v.ID(), 64)
	assert.Equal(t, []string{"GET /_ping", "GET /info", "GET /images/localhost/podvm-test:latest/json",
		"POST /containers/create", "POST /containers/{id}/start"}, routes(svc))

	var spec map[string]any
	require.NoError(t, json.Unmarshal(body(t, svc, "POST /containers/create"), &spec))
	labels := spec["labels"].(map[string]any)
	assert.Equal(t, "build", labels["team"])
	assert.Equal(t, "true", labels[LabelManaged])
	assert.Equal(t, strconv.Itoa(os.Getpid()), labels[LabelOwnerPID])
	assert.Equal(t, self(), labels[LabelOwner])
	assert.Equal(t, v.token, labels[labelToken])
	for k, want := range map[string]any{
		"name":                 "box",
		"image":                testImage,
		"init":                 true,
		"entrypoint":           []any{"/run/podman-init", "-P"},
		"env":                  map[string]any{"A": "1", "B": "x=y"},
		"work_dir":             "/src",
		"user":                 "65534:65534",
		"httpproxy":            false,
		"netns":                map[string]any{"nsmode": "bridge"},
		"Networks":             map[string]any{"my-net": map[string]any{}},
		"no_new_privileges":    true,
		"cap_drop":             []any{"ALL"},
		"cap_add":              []any{"CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID"},
		"read_only_filesystem": true,
		"resource_limits": map[string]any{
			"memory": map[string]any{"limit": float64(64 << 20), "swap": float64(64 << 20)},
			"cpu":    map[string]any{"quota": float64(50000), "period": float64(100000)},
			"pids":   map[string]any{"limit": float64(DefaultPids)},
		},
		"mounts": []any{
			map[string]any{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": []any{"rw", "nosuid", "nodev"}},
			map[string]any{"destination": "/var/tmp", "type": "tmpfs", "source": "tmpfs", "options": []any{"rw", "nosuid", "nodev"}},
			map[string]any{"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": []any{"rw", "nosuid", "nodev"}},
			map[string]any{"destination": "/src", "type": "bind", "source": dir, "options": []any{"rbind", "ro"}},
			map[string]any{"destination": "/out", "type": "bind", "source": dir, "options": []any{"rbind", "rw"}},
		},
	} {
		assert.Equal(t, want, spec[k], k)
	}

	// The defaults: no network, nothing else.
	v, svc = fakeVM(t, "4.3", nil, Config{})
	require.NoError(t, v.Create(context.Background()))
	spec = nil
	require.NoError(t, json.Unmarshal(body(t, svc, "POST /containers/create"), &spec))
	assert.Equal(t, map[string]any{"nsmode": "none"}, spec["netns"])
	for _, k := range []string{"name", "Networks", "mounts", "read_only_filesystem", "user", "work_dir", "env"} {
		assert.NotContains(t, spec, k)
	}
	assert.Equal(t, map[string]any{"pids": map[string]any{"limit": float64(DefaultPids)}}, spec["resource_limits"])
}

func TestAPICreatePullPolicy(t *testing.T) {
	t.Parallel()
	missing := "localhost/podvm-no-such-image:latest"
	// The image is inspected for its architecture, which also says
	// whether it is present.
	inspect, inspectMissing := "GET /images/localhost/podvm-test:latest/json", "GET /images/"+missing+"/json"
	absent := libpodtest.Recorded("image-inspect-missing")
	absentThenPulled := libpodtest.Seq(absent, libpodtest.Recorded("image-inspect"))
	for _, c := range []struct {
		name   string
		image  string
		pull   PullPolicy
		routes libpodtest.Routes
		want   error
		asked  []string
	}{
		{"missing, present", testImage, PullMissing, nil, nil,
			[]string{inspect, "POST /containers/create"}},
		{"missing, absent", missing, PullMissing, libpodtest.Routes{inspectMissing: absentThenPulled}, nil,
			[]string{inspectMissing, "POST /images/pull", inspectMissing, "POST /containers/create"}},
		{"missing, no registry has it", missing, PullMissing, libpodtest.Routes{inspectMissing: absent,
			"POST /images/pull": libpodtest.Recorded("image-pull-unreachable")}, ErrImageNotFound,
			[]string{inspectMissing, "POST /images/pull"}},
		{"never, absent", missing, PullNever, libpodtest.Routes{inspectMissing: absent}, ErrImageNotFound,
			[]string{inspectMissing}},
		{"always", testImage, PullAlways, nil, nil, []string{"POST /images/pull", inspect, "POST /containers/create"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			v, svc := fakeVM(t, "4.3", c.routes, Config{Image: c.image, Pull: c.pull})
			err := v.Create(context.Background())
			if c.want == nil {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, c.want)
				assert.Empty(t, v.ID())
			}
			got := routes(svc)[2:] // after the ping and the info
			assert.Equal(t, c.asked, got[:min(len(got), len(c.asked))])
			if c.want != nil {
				assert.Equal(t, c.asked, got, "nothing made, nothing removed")
				assert.NoError(t, v.Remove(context.Background()))
				assert.Equal(t, c.asked, routes(svc)[2:], "Remove asks nothing")
			}
		})
	}
}

// A Create that fails after the container was made removes it: by ID
// when known, else by its label.
func TestAPICreateFailureRemovesWhatItMade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	v, svc := fakeVM(t, "4.3", libpodtest.Routes{"POST /containers/{id}/start": libpodtest.Recorded("container-start-no-such-container")}, Config{})
	assert.ErrorIs(t, v.Create(ctx), ErrNoSuchContainer)
	assert.Equal(t, "DELETE /containers/{id}", routes(svc)[len(routes(svc))-1])
	assert.Empty(t, v.ID())
	assert.ErrorIs(t, v.Create(ctx), ErrAlreadyCreated)
	n := len(svc.Requests())
	require.NoError(t, v.Remove(ctx))
	assert.Len(t, svc.Requests(), n, "already removed")

	// The answer to create was lost: the container is found by label.
	v, svc = fakeVM(t, "4.3", libpodtest.Routes{"POST /containers/create": libpodtest.Cut("container-create", 30)}, Config{})
	assert.ErrorIs(t, v.Create(ctx), ErrUnavailable)
	got := routes(svc)
	assert.Equal(t, []string{"GET /containers/json", "DELETE /containers/{id}"}, got[len(got)-2:])
	list := svc.Requests()[len(got)-2]
	assert.Equal(t, `{"label":["`+labelToken+`=`+v.token+`"]}`, list.URL.Query().Get("filters"))
}

func TestAPIRemove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// Before Create: nothing asked; then Run is ErrRemoved.
	v, svc := fakeVM(t, "4.3", nil, Config{})
	require.NoError(t, v.Remove(ctx))
	assert.Equal(t, []string{"GET /_ping"}, routes(svc))
	_, err := v.Run(ctx, sh3)
	assert.ErrorIs(t, err, ErrRemoved)
	assert.ErrorIs(t, v.Create(ctx), ErrRemoved)

	// DoRequest tries three times.
	cut := libpodtest.Cut("container-remove", 0)
	v, svc = createdVM(t, "4.3", libpodtest.Routes{"DELETE /containers/{id}": libpodtest.Seq(
		cut, cut, cut, libpodtest.Recorded("container-remove-no-such-container"))})
	_, err = v.Run(ctx, exec.Command{Name: "true"})
	require.NoError(t, err)
	assert.ErrorIs(t, v.Remove(ctx), ErrUnavailable, "the service died")
	_, err = v.Run(ctx, sh3)
	assert.ErrorIs(t, err, ErrRemoved, "even after a failed Remove")
	require.NoError(t, v.Remove(ctx), "tried again: already gone counts as removed")
	n := svc.Count("DELETE /containers/{id}")
	require.NoError(t, v.Remove(ctx))
	assert.Equal(t, n, svc.Count("DELETE /containers/{id}"), "idempotent")
	assert.ErrorIs(t, v.CopyIn(ctx, "/tmp", bytes.NewReader(nil)), ErrRemoved)
}

func TestAPICopyIn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	v, svc := createdVM(t, "4.3", libpodtest.Routes{"HEAD /containers/{id}/archive": libpodtest.Seq(
		libpodtest.Recorded("archive-head"), libpodtest.Recorded("archive-head"), libpodtest.Recorded("archive-head-file"),
		libpodtest.Recorded("archive-head-missing")),
		// What a missing /no/such is: /no/such and /no are missing too.
		"GET /containers/{id}/archive": libpodtest.Seq(libpodtest.Recorded("archive-get-missing"), libpodtest.Recorded("archive-get-missing"))})
	in := testkit.Tar(t, testkit.File("a", "\x00\x00\x00", 0o644))
	require.NoError(t, v.CopyIn(ctx, "/tmp", bytes.NewReader(in)))
	put := svc.Requests()[len(svc.Requests())-1]
	assert.Equal(t, "PUT /containers/{id}/archive", put.Route)
	assert.Equal(t, "/tmp", put.URL.Query().Get("path"))
	sent, err := testkit.Untar(in)
	require.NoError(t, err)
	got, err := testkit.Untar(put.Body)
	require.NoError(t, err)
	assert.Equal(t, testkit.Names(sent), testkit.Names(got))

	evil := testkit.Tar(t, testkit.File("ok", "", 0o644), testkit.File("../x", "", 0o644))
	assert.ErrorIs(t, v.CopyIn(ctx, "/tmp", bytes.NewReader(evil)), ErrUnsafeArchive)
	assert.ErrorIs(t, v.CopyIn(ctx, "/etc/passwd", bytes.NewReader(in)), syscall.ENOTDIR, "not a directory")
	assert.ErrorIs(t, v.CopyIn(ctx, "/no/such", bytes.NewReader(in)), fs.ErrNotExist, "no such directory")
	assert.Error(t, v.CopyIn(ctx, "relative", bytes.NewReader(in)))
}

func TestAPICopyOut(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	v, _ := createdVM(t, "4.3", libpodtest.Routes{"GET /containers/{id}/archive": libpodtest.Seq(
		libpodtest.Recorded("archive-get"), libpodtest.Recorded("archive-get-missing"),
		// What a missing /no/such/path is: /no/such and /no are missing too.
		libpodtest.Recorded("archive-get-missing"), libpodtest.Recorded("archive-get-missing"),
		libpodtest.Cut("archive-get", libpodtest.HeaderEnd("archive-get")+1000))})
	var out bytes.Buffer
	require.NoError(t, v.CopyOut(ctx, "/tmp/record.sh", &out))
	got, err := testkit.Untar(out.Bytes())
	require.NoError(t, err)
	assert.Equal(t, []string{"record.sh"}, testkit.Names(got))
	err = v.CopyOut(ctx, "/no/such/path", io.Discard)
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.ErrorContains(t, err, "no such file or directory")
	assert.ErrorIs(t, v.CopyOut(ctx, "/tmp/record.sh", io.Discard), ErrUnavailable, "dropped mid-stream")
}
