package vm_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/vmtest"
)

// The suite's transport sample over tcp://, a service the host's disk
// does not reach in podvm's eyes: the agent gets in as an image imported
// through the service, its channel is the service's attach, and no bind
// mount of the caller's disk is involved. What tcp:// adds is how the
// service is reached; the full suite runs on the same service over its
// socket (TestParity), and every case again here cost CI 90 s.
func TestConformanceAPITCP(t *testing.T) {
	env := podmantest.Need(t)
	podmantest.NeedBinary(t, "podman") // to run a service of its own
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	env.Host = startService(t, fmt.Sprintf("tcp://127.0.0.1:%d", port)).uri
	vmtest.RunSample(t, apiHarness(env, false), "transport")
}

// podvm's own remote CLI path: 16 concurrent Runs through one
// podman-remote attach, in rounds, every output whole (podman-remote's
// exec loses some: containers/podman#25855).
func TestCLIRemoteConcurrentRuns(t *testing.T) {
	env := podmantest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	v, err := vm.NewCLIVM(vm.Config{Image: env.Image}, nil, vm.WithURL(env.Host), vm.WithPodman(env.Podman))
	require.NoError(t, err)
	require.NoError(t, v.Create(ctx))
	defer v.Remove(context.Background())
	for round := range 8 {
		var wg sync.WaitGroup
		for i := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				word := fmt.Sprintf("round %d run %d", round, i)
				res, err := v.Run(ctx, exec.Command{Name: "echo", Args: []string{word}})
				if assert.NoError(t, err) {
					assert.Equal(t, word+"\n", res.Stdout, "lost or mixed output")
				}
			}()
		}
		wg.Wait()
	}
}

// 2,000 sequential and 64-way concurrent Runs on one sandbox leave no
// host file descriptor, no goroutine and no sandbox process behind. Not
// parallel: it counts the process's goroutines and descriptors.
func TestAgentRunsLeakNothing(t *testing.T) {
	env := podmantest.Need(t)
	for name, h := range map[string]vmtest.Harness{"api": apiHarness(env, false), "cli": cliHarness(env, false)} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			v, err := h.NewVM(t, vm.Config{})
			require.NoError(t, err)
			require.NoError(t, v.Create(ctx))
			defer v.Remove(context.Background())
			_, err = v.Run(ctx, exec.Command{Name: "true"}) // warm
			require.NoError(t, err)
			fds, goroutines := openFDs(t), runtime.NumGoroutine()
			for i := range 2000 {
				res, err := v.Run(ctx, exec.Command{Name: "true"})
				require.NoError(t, err, "run %d", i)
				require.Equal(t, 0, res.ExitCode)
			}
			var wg sync.WaitGroup
			for i := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					res, err := v.Run(ctx, exec.Command{Name: "echo", Args: []string{strconv.Itoa(i)}})
					if assert.NoError(t, err) {
						assert.Equal(t, strconv.Itoa(i)+"\n", res.Stdout)
					}
				}()
			}
			wg.Wait()
			settle(t, func() bool { return runtime.NumGoroutine() <= goroutines+2 && openFDs(t) <= fds+2 },
				func() string {
					return fmt.Sprintf("goroutines %d -> %d, fds %d -> %d", goroutines, runtime.NumGoroutine(), fds, openFDs(t))
				})
			// The header, the agent, the idle shims (the pool keeps up to
			// 32 after a burst), a spare, and ps, once the shims the pool
			// does not keep have been reaped.
			var ps string
			settle(t, func() bool {
				res, err := v.Run(ctx, exec.Command{Name: "ps", Args: []string{"-o", "pid,args"}})
				require.NoError(t, err)
				ps = res.Stdout
				return len(strings.Split(strings.TrimSpace(ps), "\n")) <= 1+1+32+1+1
			}, func() string { return "processes left in the sandbox:\n" + ps })
			assert.NotContains(t, ps, "echo", "runs left processes:\n%s", ps)
		})
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// settle waits up to 10 s for ok, then fails with what says.
func settle(t *testing.T, ok func() bool, says func() string) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !ok(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Errorf("leaked: %s", says())
			return
		}
	}
}

// An image's USER is the default user of its commands on every path: the
// agent runs as root, and runs each command as the image's user.
func TestImageUserIsKept(t *testing.T) {
	env := podmantest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	img := "localhost/podvm-test-user:" + strconv.Itoa(os.Getpid())
	name := "podvm-user-src-" + strconv.Itoa(os.Getpid())
	podman(ctx, t, env, "create", "--name", name, env.Image, "true")
	podman(ctx, t, env, "commit", "-q", "--change", "USER=65534", name, img)
	podman(ctx, t, env, "rm", name)
	defer podman(context.Background(), t, env, "rmi", "-f", img)
	for name, h := range map[string]vmtest.Harness{
		"api": apiHarness(env, false), "cli": cliHarness(env, false),
		"api-exec": apiHarness(env, true), "cli-exec": cliHarness(env, true),
	} {
		t.Run(name, func(t *testing.T) {
			for _, c := range []struct {
				user, want string
			}{{"", "65534\n"}, {"0", "0\n"}} {
				v, err := h.NewVM(t, vm.Config{Image: img, User: c.user})
				require.NoError(t, err)
				require.NoError(t, v.Create(ctx))
				res, err := v.Run(ctx, exec.Command{Name: "id", Args: []string{"-u"}})
				assert.NoError(t, v.Remove(ctx))
				require.NoError(t, err)
				assert.Equal(t, c.want, res.Stdout, "Config.User %q", c.user)
			}
		})
	}
}

// A local sandbox's channel to its agent is a socket of this process in
// a directory of the caller's, bind-mounted read-only: the sandbox, root
// included, can make nothing there, and finds no socket left to connect
// to (it is removed once the agent connected).
func TestChannelDirIsClosedToTheSandbox(t *testing.T) {
	env := podmantest.Need(t)
	if !strings.HasPrefix(env.Host, "unix://") || os.Getenv("PODVM_TEST_MOUNT_DIR") != "" {
		t.Skip("the channel is a socket only where the service sees this machine's directories")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, backend := range []vm.Backend{vm.BackendAPI, vm.BackendCLI} {
		t.Run(string(backend), func(t *testing.T) {
			v, err := vm.New(ctx, sandbox(env, vm.Config{Image: env.Image}), vm.WithURL(env.Host), vm.WithBackend(backend))
			require.NoError(t, err)
			require.NoError(t, v.Create(ctx))
			defer v.Remove(context.Background())
			res, err := v.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c",
				`grep -c ' /.podvm/ch .*ro,' /proc/self/mounts; ls -A /.podvm/ch | wc -l; touch /.podvm/ch/x 2>/dev/null || echo refused`}})
			require.NoError(t, err)
			assert.Equal(t, "1\n0\nrefused\n", res.Stdout, "the channel directory is mounted read-only, and empty")
		})
	}
}
