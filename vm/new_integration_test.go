package vm_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/internal/podmantest/podmanharness"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/vmtest"
)

func TestNewFindsTheService(t *testing.T) {
	env := podmantest.Need(t)
	path, ok := strings.CutPrefix(env.Host, "unix://")
	if !ok {
		t.Skip("needs a unix:// CONTAINER_HOST")
	}
	cfg := vm.Config{Image: env.Image}

	var log bytes.Buffer
	v, err := vm.New(context.Background(), cfg, logTo(&log))
	require.NoError(t, err)
	assert.IsType(t, &vm.APIVM{}, v, "CONTAINER_HOST answers")
	assert.Contains(t, log.String(), env.Host)

	// Without CONTAINER_HOST, the rootless socket is next.
	dir := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(dir, "podman"), 0o700))
	require.NoError(t, os.Symlink(path, filepath.Join(dir, "podman", "podman.sock")))
	t.Setenv("CONTAINER_HOST", "")
	t.Setenv("XDG_RUNTIME_DIR", dir)
	log.Reset()
	v, err = vm.New(context.Background(), cfg, logTo(&log))
	require.NoError(t, err)
	assert.IsType(t, &vm.APIVM{}, v)
	assert.Contains(t, log.String(), filepath.Join(dir, "podman", "podman.sock"))
}

// service is a Podman API service of the test's own, on its own socket,
// sharing the storage of the project's.
type service struct {
	t    *testing.T
	uri  string
	path string
	cmd  *osexec.Cmd
}

// startService starts a service on uri; "" means a unix socket of its own.
func startService(t *testing.T, uri string) *service {
	t.Helper()
	s := &service{t: t, uri: uri}
	if uri == "" {
		dir, err := os.MkdirTemp("", "podvm-svc-") // short: socket paths are limited
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		s.path = filepath.Join(dir, "s.sock")
		s.uri = "unix://" + s.path
	}
	s.start()
	t.Cleanup(s.stop)
	return s
}

func (s *service) start() {
	s.t.Helper()
	cmd := osexec.Command("podman", "system", "service", "--time=0", s.uri)
	cmd.Env = withoutEnv(os.Environ(), "CONTAINER_HOST")
	require.NoError(s.t, cmd.Start())
	s.cmd = cmd
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for ctx.Err() == nil {
		if _, err := vm.NewAPIVM(ctx, s.uri, vm.Config{Image: "x"}); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("podman service on %s did not answer", s.uri)
}

func (s *service) stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	_ = s.cmd.Wait()
	s.cmd = nil
}

func withoutEnv(env []string, key string) []string {
	var out []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, key+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// When the service dies, the agent's sandboxes go on (their channel is a
// socket of this machine, not the service's attach), Podman exec calls
// fail promptly and clearly; when it is back, they work again; a VM made
// while it is down uses the CLI.
func TestServiceGoesAwayAndComesBack(t *testing.T) {
	env := podmantest.Need(t)
	podmantest.NeedBinary(t, "podman") // to run a service of its own
	svc := startService(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Through the agent on both backends, and through Podman exec (each
	// Run a request).
	hello := exec.Command{Name: "echo", Args: []string{"hello"}}
	var agentBoxes []vm.VM
	var v vm.VM
	for _, b := range []struct {
		backend    vm.Backend
		podmanExec bool
	}{{vm.BackendAPI, false}, {vm.BackendCLI, false}, {vm.BackendAPI, true}} {
		box, err := vm.New(ctx, vm.Config{Image: env.Image, PodmanExec: b.podmanExec}, vm.WithURL(svc.uri), vm.WithBackend(b.backend))
		require.NoError(t, err)
		require.NoError(t, box.Create(ctx))
		// Through the project's service: ours may be down.
		defer podman(context.Background(), t, env, "rm", "-f", "-t", "0", "--ignore", box.ID())
		res, err := box.Run(ctx, hello)
		require.NoError(t, err)
		require.Equal(t, "hello\n", res.Stdout)
		if b.podmanExec {
			v = box
		} else {
			agentBoxes = append(agentBoxes, box)
		}
	}

	svc.stop()
	rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
	_, err := v.Run(rctx, hello)
	rcancel()
	require.ErrorIs(t, err, vm.ErrUnavailable, "a dead service is ErrUnavailable, not a hang")
	for _, b := range agentBoxes {
		res, err := b.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", "echo $((6*7))"}})
		require.NoError(t, err, "the agent's channel does not go through the service")
		assert.Equal(t, "42\n", res.Stdout)
		require.NoError(t, vm.WriteFile(ctx, b, "/tmp/during", []byte("down"), 0o644))
	}

	// Down: New falls back to the CLI, talking to Podman directly.
	t.Setenv("CONTAINER_HOST", svc.uri)
	t.Setenv("XDG_RUNTIME_DIR", t.TempDir())
	var log bytes.Buffer
	fallback, err := vm.New(ctx, vm.Config{Image: env.Image}, logTo(&log))
	require.NoError(t, err)
	assert.IsType(t, &vm.CLIVM{}, fallback, log.String())
	require.NoError(t, fallback.Create(ctx))
	defer fallback.Remove(context.Background())
	res, err := fallback.Run(ctx, hello)
	require.NoError(t, err)
	assert.Equal(t, "hello\n", res.Stdout)

	svc.start()
	res, err = v.Run(ctx, hello)
	require.NoError(t, err, "the service is back")
	assert.Equal(t, "hello\n", res.Stdout)
	for _, b := range agentBoxes {
		got, err := vm.ReadFile(ctx, b, "/tmp/during", 100)
		require.NoError(t, err, "the agent's sandbox lived through the restart")
		assert.Equal(t, "down", string(got))
		require.NoError(t, b.Remove(ctx))
	}
	require.NoError(t, v.Remove(ctx))
}

// crashEnv makes the test binary create a sandbox and die without removing
// it, as a crashed pipeline would.
const crashEnv = "PODVM_TEST_CRASH"

func crashAfterCreate() int {
	ctx := context.Background()
	cfg := sandbox(podmantest.Env{}, vm.Config{Image: os.Getenv("PODVM_TEST_IMAGE"), Labels: map[string]string{"test": os.Getenv(crashEnv)}})
	v, err := vm.NewAPIVM(ctx, os.Getenv("CONTAINER_HOST"), cfg)
	if err == nil {
		err = v.Create(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println(v.ID())
	return 0 // no Remove: the sandbox outlives its owner
}

func TestReap(t *testing.T) {
	env := podmantest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Only this test's sandboxes are reaped: other packages' tests run
	// beside it on the same service.
	tag := fmt.Sprintf("reap-%d", time.Now().UnixNano())
	ps := func() string { return podman(ctx, t, env, "ps", "-a", "-q", "--no-trunc") }

	// Ours, alive; and a container podvm did not make.
	mine, err := vm.NewAPIVM(ctx, env.Host, sandbox(env, vm.Config{Image: env.Image, Labels: map[string]string{"test": tag}}))
	require.NoError(t, err)
	require.NoError(t, mine.Create(ctx))
	defer mine.Remove(context.Background())
	foreign := strings.TrimSpace(podman(ctx, t, env, "run", "-d", "--network", "none", "--label", "test="+tag, "--label", "io.podvm.owner.pid=1",
		"--label", "io.podvm.created=1", "--init", "--entrypoint", `["/run/podman-init","-P"]`, env.Image))
	t.Cleanup(func() { podman(context.Background(), t, env, "rm", "-f", "-t", "0", "--ignore", foreign) })
	// A sandbox of a CI container with this hostname and a PID namespace
	// of its own, whose owner's PID names no process here: not ours to
	// judge by its owner.
	dead := osexec.Command("true")
	require.NoError(t, dead.Run())
	host, _ := os.Hostname()
	twin := strings.TrimSpace(podman(ctx, t, env, "run", "-d", "--network", "none", "--label", "test="+tag,
		"--label", vm.LabelManaged+"=true", "--label", vm.LabelOwner+"=0123456789abcdef."+strconv.Itoa(dead.Process.Pid)+".1",
		"--label", vm.LabelOwnerPID+"="+strconv.Itoa(dead.Process.Pid), "--label", vm.LabelOwnerHost+"="+host,
		"--label", vm.LabelCreated+"="+strconv.FormatInt(time.Now().Unix(), 10),
		"--init", "--entrypoint", `["/run/podman-init","-P"]`, env.Image))
	t.Cleanup(func() { podman(context.Background(), t, env, "rm", "-f", "-t", "0", "--ignore", twin) })

	for _, backend := range []vm.Backend{vm.BackendAPI, vm.BackendCLI} {
		t.Run(string(backend), func(t *testing.T) {
			// A sandbox whose owner died without removing it.
			child := osexec.Command(os.Args[0], "-test.run=^$")
			child.Env = append(os.Environ(), crashEnv+"="+tag)
			if env.PidsUnenforced {
				child.Env = append(child.Env, podmanharness.NoPidsEnv+"=1")
			}
			out, err := child.Output()
			require.NoError(t, err, "crashing child: %s", out)
			orphan := strings.TrimSpace(string(out))
			t.Cleanup(func() { podman(context.Background(), t, env, "rm", "-f", "-t", "0", "--ignore", orphan) })
			require.Contains(t, ps(), orphan)
			// The agent's channel directory the child left (sockets only).
			chans := func(pid int) []string {
				base := filepath.Join(os.TempDir(), "podvm-"+strconv.Itoa(os.Getuid()))
				if rt := os.Getenv("XDG_RUNTIME_DIR"); rt != "" {
					base = filepath.Join(rt, "podvm")
				}
				m, _ := filepath.Glob(filepath.Join(base, strconv.Itoa(pid)+"-*"))
				return m
			}
			require.Len(t, chans(child.Process.Pid), 1, "the crashed child's sandbox has a channel directory")
			require.NotEmpty(t, chans(os.Getpid()), "so has ours")

			removed, err := vm.Reap(ctx, 0, vm.WithURL(env.Host), vm.WithBackend(backend), vm.WithLabel("test", tag))
			require.NoError(t, err)
			assert.Equal(t, []string{orphan}, removed, "only the crashed owner's sandbox is reaped")
			assert.NotContains(t, ps(), orphan)
			assert.Contains(t, ps(), mine.ID(), "a live owner's sandbox is kept")
			assert.Contains(t, ps(), twin, "another PID namespace's sandbox is kept")
			assert.Contains(t, ps(), foreign, "a container without podvm's label is never touched")
			assert.Empty(t, chans(child.Process.Pid), "the dead child's channel directory is removed")
			assert.NotEmpty(t, chans(os.Getpid()), "a live process's channel directories are kept")
		})
	}

	// By age, a live owner's sandbox goes too, and one not ours to judge;
	// the foreign one still stays.
	time.Sleep(1100 * time.Millisecond)
	removed, err := vm.Reap(ctx, time.Millisecond, vm.WithURL(env.Host), vm.WithLabel("test", tag))
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{mine.ID(), twin}, removed)
	assert.Contains(t, ps(), foreign)
}

func TestSandboxHelper(t *testing.T) {
	env := podmantest.Need(t)
	var id string
	t.Run("creates and cleans up", func(t *testing.T) {
		box := vmtest.Sandbox(t, vm.Config{Image: env.Image}, vm.WithURL(env.Host))
		id = box.ID()
		res, err := box.Run(context.Background(), exec.Command{Name: "echo", Args: []string{"ok"}})
		require.NoError(t, err)
		assert.Equal(t, "ok\n", res.Stdout)
	})
	require.NotEmpty(t, id)
	assert.NotContains(t, podman(context.Background(), t, env, "ps", "-a", "-q", "--no-trunc"), id, "removed in Cleanup")

	if os.Getenv(vmtest.RequireEnv) == "" {
		var skipped bool
		t.Run("skips without podman", func(t *testing.T) {
			defer func() { skipped = t.Skipped() }()
			vmtest.Sandbox(t, vm.Config{Image: env.Image}, vm.WithURL("unix:///nonexistent/podvm.sock"))
		})
		assert.True(t, skipped)
	}
}

// An image missing from the service is loaded from Config.ImageArchive, by
// both backends, without a registry.
func TestImageArchive(t *testing.T) {
	env := podmantest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, backend := range []vm.Backend{vm.BackendAPI, vm.BackendCLI} {
		t.Run(string(backend), func(t *testing.T) {
			archive := filepath.Join(t.TempDir(), "image.tar")
			ref := fmt.Sprintf("localhost/podvm-archive-test:%s-%d", backend, time.Now().UnixNano())
			podman(ctx, t, env, "tag", env.Image, ref)
			podman(ctx, t, env, "save", "-q", "-o", archive, ref)
			podman(ctx, t, env, "rmi", ref)
			t.Cleanup(func() { podman(context.Background(), t, env, "rmi", "-i", ref) })

			cfg := sandbox(env, vm.Config{Image: ref, Pull: vm.PullNever, ImageArchive: archive})
			echoIn(ctx, t, cfg, "loaded", vm.WithURL(env.Host), vm.WithBackend(backend), vm.WithPodman(env.Podman))

			cfg.Image = ref + "-absent"
			missing, err := vm.New(ctx, cfg, vm.WithURL(env.Host), vm.WithBackend(backend), vm.WithPodman(env.Podman))
			require.NoError(t, err)
			err = missing.Create(ctx)
			assert.ErrorIs(t, err, vm.ErrImageNotFound, "the archive does not hold that image")
			assert.ErrorContains(t, err, "is not in the image archive")
			require.NoError(t, missing.Remove(ctx))
		})
	}
}

// The API backend reaches a service over TCP as over a unix socket, and
// the CLI backend through podman's --url.
func TestTCPService(t *testing.T) {
	env := podmantest.Need(t)
	podmantest.NeedBinary(t, "podman") // to run a service of its own
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	svc := startService(t, fmt.Sprintf("tcp://127.0.0.1:%d", port))

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, backend := range []vm.Backend{vm.BackendAPI, vm.BackendCLI} {
		t.Run(string(backend), func(t *testing.T) {
			echoIn(ctx, t, vm.Config{Image: env.Image}, "over tcp", vm.WithURL(svc.uri), vm.WithBackend(backend), vm.WithPodman(env.Podman))
		})
	}
}

// echoIn creates a sandbox with vm.New, runs echo word in it, and removes
// it when the test ends.
func echoIn(ctx context.Context, t *testing.T, cfg vm.Config, word string, opts ...vm.Option) {
	t.Helper()
	v, err := vm.New(ctx, cfg, opts...)
	require.NoError(t, err)
	require.NoError(t, v.Create(ctx))
	t.Cleanup(func() { assert.NoError(t, v.Remove(context.Background())) })
	res, err := v.Run(ctx, exec.Command{Name: "echo", Args: []string{word}})
	require.NoError(t, err)
	assert.Equal(t, word+"\n", res.Stdout)
}
