package vm_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/vm"
)

// discoveryEnv points every place New looks at dir, where nothing answers
// unless the test puts a socket there.
func discoveryEnv(t *testing.T) (dir string) {
	dir = t.TempDir()
	t.Setenv("CONTAINER_HOST", "unix://"+filepath.Join(dir, "host.sock"))
	t.Setenv("XDG_RUNTIME_DIR", dir)
	return dir
}

func logTo(buf *bytes.Buffer) vm.Option {
	return vm.WithLogger(slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
}

var anyConfig = vm.Config{Image: "localhost/podvm-test:latest"}

func TestNewTriesSocketsInOrder(t *testing.T) {
	dir := discoveryEnv(t)
	_, err := vm.New(context.Background(), anyConfig, vm.WithBackend(vm.BackendAPI))
	require.ErrorIs(t, err, vm.ErrUnavailable)
	msg := err.Error()
	host := strings.Index(msg, "unix://"+filepath.Join(dir, "host.sock"))
	xdg := strings.Index(msg, "unix://"+filepath.Join(dir, "podman", "podman.sock"))
	system := strings.Index(msg, "unix:///run/podman/podman.sock")
	assert.True(t, host >= 0 && xdg > host && system > xdg, "CONTAINER_HOST, then XDG_RUNTIME_DIR, then /run, all named: %v", err)
}

// silentSocket listens at path until the test ends, and holds every
// connection open, never answering.
func silentSocket(t *testing.T, path string) {
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
}

// A socket that accepts but never answers costs the ping timeout, not a hang.
func TestNewSocketThatDoesNotAnswer(t *testing.T) {
	dir := discoveryEnv(t)
	path := filepath.Join(dir, "host.sock")
	silentSocket(t, path)
	_, err := vm.New(context.Background(), anyConfig, vm.WithBackend(vm.BackendAPI), vm.WithPingTimeout(300*time.Millisecond))
	require.ErrorIs(t, err, vm.ErrUnavailable)
	assert.Contains(t, err.Error(), "unix://"+path+": no answer within 300ms")

	// NewAPIVM too, with a context that never ends.
	start := time.Now()
	_, err = vm.NewAPIVM(context.Background(), "unix://"+path, anyConfig, vm.WithPingTimeout(300*time.Millisecond))
	require.ErrorIs(t, err, vm.ErrUnavailable)
	assert.Less(t, time.Since(start), 30*time.Second, "bounded by the ping timeout")
}

// A ctx that ends while New looks for a service is what failed, not the
// services: New says so, and does not fall back to the CLI.
func TestNewContextEndsWhileLooking(t *testing.T) {
	dir := discoveryEnv(t)
	silentSocket(t, filepath.Join(dir, "host.sock"))
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	v, err := vm.New(ctx, anyConfig, vm.WithPodman("true"), vm.WithPingTimeout(time.Minute))
	require.ErrorIs(t, err, context.DeadlineExceeded, "got %T", v)
	assert.Contains(t, err.Error(), "looking for a Podman service")
}

// A missing mount source on this machine is a bad config, refused before
// any socket is probed: no probe is logged, and none is waited for.
func TestNewRefusesMissingMountBeforeProbing(t *testing.T) {
	dir := discoveryEnv(t)
	cfg := anyConfig
	cfg.Mounts = []vm.Mount{{Source: filepath.Join(dir, "no-such-dir"), Target: "/src"}}
	for _, opts := range [][]vm.Option{{vm.WithBackend(vm.BackendAPI)}, {vm.WithBackend(vm.BackendAPI), vm.WithURL("unix://" + filepath.Join(dir, "s.sock"))}, nil} {
		var log bytes.Buffer
		_, err := vm.New(context.Background(), cfg, append(opts, logTo(&log))...)
		require.ErrorIs(t, err, vm.ErrInvalidConfig)
		assert.NotErrorIs(t, err, vm.ErrUnavailable)
		assert.Empty(t, log.String(), "no probe was made")
	}
}

func TestNewFallsBackToTheCLI(t *testing.T) {
	discoveryEnv(t)
	var log bytes.Buffer
	// Any binary on PATH stands in for podman: New runs nothing.
	v, err := vm.New(context.Background(), anyConfig, vm.WithPodman("true"), logTo(&log))
	require.NoError(t, err)
	assert.IsType(t, &vm.CLIVM{}, v)
	assert.Contains(t, log.String(), "using the CLI backend")
	assert.Contains(t, log.String(), "no socket answered")
}

func TestNewNothingUsable(t *testing.T) {
	discoveryEnv(t)
	_, err := vm.New(context.Background(), anyConfig, vm.WithPodman("podvm-no-such-podman"))
	require.ErrorIs(t, err, vm.ErrUnavailable)
	assert.Contains(t, err.Error(), "host.sock: no socket")
	assert.Contains(t, err.Error(), "no podman binary")
}

// A named service is the only one tried: the CLI would go to the same place.
func TestNewExplicitURLDoesNotFallBack(t *testing.T) {
	discoveryEnv(t)
	_, err := vm.New(context.Background(), anyConfig, vm.WithURL("unix:///nonexistent/podvm.sock"), vm.WithPodman("true"))
	require.ErrorIs(t, err, vm.ErrUnavailable)
	assert.NotContains(t, err.Error(), "host.sock", "nothing else is tried")
}

func TestNewRefusesBadInputBeforeProbing(t *testing.T) {
	discoveryEnv(t)
	var log bytes.Buffer
	_, err := vm.New(context.Background(), vm.Config{Image: "--privileged"}, logTo(&log))
	require.ErrorIs(t, err, vm.ErrInvalidConfig)
	assert.Empty(t, log.String(), "no probe was made")

	_, err = vm.New(context.Background(), anyConfig, vm.WithBackend("docker"))
	require.ErrorIs(t, err, vm.ErrInvalidConfig)
}

func TestNewCLIBackendOnRequest(t *testing.T) {
	discoveryEnv(t)
	var log bytes.Buffer
	v, err := vm.New(context.Background(), anyConfig, vm.WithBackend(vm.BackendCLI), vm.WithPodman("true"), logTo(&log))
	require.NoError(t, err)
	assert.IsType(t, &vm.CLIVM{}, v)
	assert.NotContains(t, log.String(), "no service", "no socket was probed")
}

func TestReapNeverWithoutPodman(t *testing.T) {
	discoveryEnv(t)
	_, err := vm.Reap(context.Background(), time.Hour, vm.WithPodman("podvm-no-such-podman"))
	require.True(t, errors.Is(err, vm.ErrUnavailable), "got %v", err)
}

func TestMain(m *testing.M) {
	if os.Getenv(crashEnv) != "" {
		os.Exit(crashAfterCreate())
	}
	if uri := os.Getenv(sshAPIEnv); uri != "" {
		os.Exit(sshAPIConnect(uri))
	}
	os.Exit(m.Run())
}

// BackendKube without vm/kube imported says what to import.
func TestNewKubeNotImported(t *testing.T) {
	_, err := vm.New(context.Background(), vm.Config{Image: "x"}, vm.WithBackend(vm.BackendKube))
	if !errors.Is(err, vm.ErrInvalidConfig) || !strings.Contains(err.Error(), "vm/kube") {
		t.Errorf("got %v; want ErrInvalidConfig naming vm/kube", err)
	}
}
