package vm_test

import (
	"archive/tar"
	"bytes"
	"context"
	"io/fs"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/vmtest"
)

// apiFactory makes API-backed VMs on the service and image of env, each
// with a connection of its own.
func apiFactory(env podmantest.Env) vmtest.NewVM {
	return func(t *testing.T, cfg vm.Config) (vm.VM, error) {
		cfg.Image = env.Image
		return vm.NewAPIVM(context.Background(), env.Host, cfg)
	}
}

func TestConformanceAPI(t *testing.T) {
	vmtest.Run(t, apiFactory(podmantest.Need(t)))
}

// newAPI returns an APIVM for cfg, created, removed when the test ends.
func newAPI(ctx context.Context, t *testing.T, env podmantest.Env, cfg vm.Config) *vm.APIVM {
	t.Helper()
	cfg.Image = env.Image
	v, err := vm.NewAPIVM(ctx, env.Host, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		assert.NoError(t, v.Remove(ctx))
	})
	require.NoError(t, v.Create(ctx))
	return v
}

// apiClient is a client of env's service, to check what a VM did.
func apiClient(ctx context.Context, t *testing.T, env podmantest.Env) *libpod.Client {
	t.Helper()
	c, err := libpod.Connect(ctx, env.Host)
	require.NoError(t, err)
	return c
}

// token labels the test's sandboxes, so that the service can list them.
func token(t *testing.T) (map[string]string, string) {
	v := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + "-" + strconv.Itoa(os.Getpid())
	return map[string]string{"io.podvm.test": v}, "io.podvm.test=" + v
}

// An APIVM removed leaves no connection to the service, nor goroutines
// serving one, behind. Not parallel: it counts the process's goroutines.
func TestAPIRemoveReleasesConnections(t *testing.T) {
	env := podmantest.Need(t)
	ctx := context.Background()
	before := runtime.NumGoroutine()
	for range 5 {
		v, err := vm.NewAPIVM(ctx, env.Host, vm.Config{Image: env.Image})
		require.NoError(t, err)
		require.NoError(t, v.Create(ctx))
		_, err = v.Run(ctx, exec.Command{Name: "true"})
		assert.NoError(t, err)
		require.NoError(t, v.Remove(ctx))
	}
	after := runtime.NumGoroutine()
	for end := time.Now().Add(10 * time.Second); after > before && time.Now().Before(end); after = runtime.NumGoroutine() {
		time.Sleep(10 * time.Millisecond)
	}
	assert.LessOrEqual(t, after, before, "goroutines left by 5 removed APIVMs")
}

func TestAPIConcurrentRuns(t *testing.T) {
	t.Parallel()
	env := podmantest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v := newAPI(ctx, t, env, vm.Config{})

	// Each run differs in its output, its stderr, its stdin, its exit
	// status and its size, so that a mix-up between runs shows.
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := strconv.Itoa(i)
			in := strings.Repeat("in "+id+"\n", 1000*i)
			cmd := exec.Command{Name: "sh", Args: []string{"-c", `wc -c; seq 1 $(($1 * 2000)) | tail -n 1; echo "err $1" >&2; exit $1`, "sh", id}}
			if i%2 == 0 {
				cmd.Stdin = strings.NewReader(in)
			}
			res, err := v.Run(ctx, cmd)
			if !assert.NoError(t, err, "run %d", i) {
				return
			}
			wantIn := 0
			if cmd.Stdin != nil {
				wantIn = len(in)
			}
			last := ""
			if i > 0 {
				last = strconv.Itoa(i*2000) + "\n"
			}
			assert.Equal(t, strconv.Itoa(wantIn)+"\n"+last, res.Stdout, "run %d: stdout", i)
			assert.Equal(t, "err "+id+"\n", res.Stderr, "run %d: stderr", i)
			assert.Equal(t, i, res.ExitCode, "run %d: exit status", i)
		}()
	}
	wg.Wait()
}

func TestAPITimeoutKillsInsideTheContainer(t *testing.T) {
	t.Parallel()
	env := podmantest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v := newAPI(ctx, t, env, vm.Config{})

	for _, stop := range []string{"timeout", "cancel"} {
		cmd := exec.Command{Name: "sh", Args: []string{"-c", "echo started; sleep 300 & sleep 300"}}
		rctx, rcancel := context.WithCancel(ctx)
		if stop == "timeout" {
			cmd.Timeout = time.Second
		} else {
			time.AfterFunc(time.Second, rcancel)
		}
		start := time.Now()
		res, err := v.Run(rctx, cmd)
		rcancel()
		elapsed := time.Since(start)
		want := context.DeadlineExceeded
		if stop == "cancel" {
			want = context.Canceled
		}
		require.ErrorIs(t, err, want, stop)
		require.NotNil(t, res, stop)
		assert.True(t, res.TimedOut, stop)
		assert.Equal(t, -1, res.ExitCode, stop)
		assert.Equal(t, "started\n", res.Stdout, stop)
		assert.Less(t, elapsed, time.Second+vmtest.Grace, stop)

		ps, err := v.Run(ctx, exec.Command{Name: "ps", Args: []string{"-o", "pid,args"}})
		require.NoError(t, err)
		assert.NotContains(t, ps.Stdout, "sleep", "%s: the command's processes survived:\n%s", stop, ps.Stdout)
	}
}

// A session's stream ends with its process: a background child that
// keeps the output open does not hold the run.
func TestAPIRunEndsWithItsProcess(t *testing.T) {
	t.Parallel()
	env := podmantest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v := newAPI(ctx, t, env, vm.Config{})
	start := time.Now()
	res, err := v.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", "echo hi; sleep 30 & exit 4"}})
	require.NoError(t, err)
	assert.Equal(t, "hi\n", res.Stdout)
	assert.Equal(t, 4, res.ExitCode)
	assert.Less(t, time.Since(start), 10*time.Second)
}

func TestAPIConfigReachesTheContainer(t *testing.T) {
	t.Parallel()
	env := podmantest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	src := t.TempDir()
	require.NoError(t, os.WriteFile(src+"/seed.txt", []byte("seed\n"), 0o644))
	labels, _ := token(t)
	labels["team"] = "build"
	v := newAPI(ctx, t, env, vm.Config{
		Name:           "podvm-apitest-" + strconv.Itoa(os.Getpid()),
		Mounts:         []vm.Mount{{Source: src, Target: "/src", ReadOnly: true}, {Source: src, Target: "/rw"}},
		Workdir:        "/src",
		Env:            []string{"GREETING=hello", "EMPTY="},
		User:           "65534:65534",
		Memory:         64 << 20,
		CPUs:           1.5,
		Pids:           99,
		ReadOnlyRootfs: true,
		Labels:         labels,
	})

	info, err := apiClient(ctx, t, env).ContainerInspect(ctx, v.ID())
	require.NoError(t, err)
	assert.Equal(t, "podvm-apitest-"+strconv.Itoa(os.Getpid()), info.Name)
	assert.Equal(t, "build", info.Config.Labels["team"])
	assert.Equal(t, "true", info.Config.Labels[vm.LabelManaged])
	assert.Equal(t, strconv.Itoa(os.Getpid()), info.Config.Labels[vm.LabelOwnerPID])
	assert.Equal(t, "none", info.HostConfig.NetworkMode)
	assert.Contains(t, info.HostConfig.SecurityOpt, "no-new-privileges")
	assert.True(t, info.HostConfig.ReadonlyRootfs)
	assert.Equal(t, int64(64<<20), info.HostConfig.Memory)
	assert.Equal(t, int64(64<<20), info.HostConfig.MemorySwap)
	assert.Equal(t, int64(150000), info.HostConfig.CPUQuota)
	assert.Equal(t, uint64(100000), info.HostConfig.CPUPeriod)
	assert.Equal(t, int64(99), info.HostConfig.PidsLimit)
	caps := slices.Clone(info.EffectiveCaps)
	slices.Sort(caps)
	var want []string
	for _, c := range vm.DefaultCapabilities {
		want = append(want, "CAP_"+c)
	}
	slices.Sort(want)
	assert.Equal(t, want, caps)

	res, err := v.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", `pwd; id -u; echo "$GREETING/$EMPTY"; cat seed.txt
touch /src/x 2>/dev/null && echo src-writable; touch /rw/x && echo rw-writable; touch /tmp/x && echo tmp-writable; touch /etc/x 2>/dev/null && echo etc-writable
ps -o pid,args | sed -n 2p`}})
	require.NoError(t, err)
	assert.Equal(t, "/src\n65534\nhello/\nseed\nrw-writable\ntmp-writable\n    1 /run/podman-init -- /run/podman-init -P\n", res.Stdout, res.Stderr)
	assert.FileExists(t, src+"/x", "the writable mount reaches the host")
}

func TestAPICreateCancelledLeavesNothing(t *testing.T) {
	t.Parallel()
	env := podmantest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := apiClient(ctx, t, env)
	labels, filter := token(t)
	// Cancelled at successive points of Create: before it, during the
	// image check, the create, the start.
	for _, after := range []time.Duration{0, time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond, 50 * time.Millisecond} {
		v, err := vm.NewAPIVM(ctx, env.Host, vm.Config{Image: env.Image, Labels: labels})
		require.NoError(t, err)
		cctx, ccancel := context.WithTimeout(ctx, after)
		err = v.Create(cctx)
		ccancel()
		if err == nil {
			require.NoError(t, v.Remove(ctx)) // too fast to cancel
			continue
		}
		assert.ErrorIs(t, err, context.DeadlineExceeded, "cancelled after %v", after)
		ids, err := c.ContainerList(ctx, filter)
		require.NoError(t, err)
		assert.Empty(t, ids, "cancelled after %v: containers left", after)
		require.NoError(t, v.Remove(ctx))
		require.ErrorIs(t, v.Create(ctx), vm.ErrRemoved)
	}
}

func TestAPICreateFailures(t *testing.T) {
	t.Parallel()
	env := podmantest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name := "podvm-apitest-taken-" + strconv.Itoa(os.Getpid())
	first := newAPI(ctx, t, env, vm.Config{Name: name})
	labels, filter := token(t)

	for _, c := range []struct {
		name string
		cfg  vm.Config
		want error
		// libpod: the service's error is wrapped (none when podvm
		// decided alone).
		libpod bool
	}{
		{"name in use", vm.Config{Image: env.Image, Name: name}, vm.ErrNameInUse, true},
		{"never pull a missing image", vm.Config{Image: "localhost/podvm-no-such-image:latest", Pull: vm.PullNever}, vm.ErrImageNotFound, false},
		{"no registry has it", vm.Config{Image: "localhost/podvm-no-such-image:latest"}, vm.ErrImageNotFound, true},
		{"short name, no registries", vm.Config{Image: "podvm-no-such-image", Pull: vm.PullAlways}, vm.ErrImageNotFound, true},
	} {
		c.cfg.Labels = labels
		v, err := vm.NewAPIVM(ctx, env.Host, c.cfg)
		require.NoError(t, err, c.name)
		err = v.Create(ctx)
		assert.ErrorIs(t, err, c.want, c.name)
		if c.libpod {
			var le *libpod.Error
			assert.ErrorAs(t, err, &le, "%s: the libpod error is wrapped", c.name)
		}
		assert.ErrorIs(t, v.Create(ctx), vm.ErrAlreadyCreated, c.name)
		assert.NoError(t, v.Remove(ctx), c.name)
	}
	ids, err := apiClient(ctx, t, env).ContainerList(ctx, filter)
	require.NoError(t, err)
	assert.Empty(t, ids, "failed creates left containers")
	assert.ErrorIs(t, first.Create(ctx), vm.ErrAlreadyCreated)
}

func TestAPIRemovedBehindItsBack(t *testing.T) {
	t.Parallel()
	env := podmantest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v := newAPI(ctx, t, env, vm.Config{})
	require.NoError(t, apiClient(ctx, t, env).ContainerRemove(ctx, v.ID()))

	res, err := v.Run(ctx, exec.Command{Name: "true"})
	assert.ErrorIs(t, err, vm.ErrNoSuchContainer)
	assert.Nil(t, res)
	assert.ErrorIs(t, v.CopyIn(ctx, "/tmp", bytes.NewReader(nil)), vm.ErrNoSuchContainer)
	assert.ErrorIs(t, v.CopyOut(ctx, "/tmp", new(bytes.Buffer)), vm.ErrNoSuchContainer)
	assert.NoError(t, v.Remove(ctx), "a container already gone counts as removed")
}

func TestAPICopyFailures(t *testing.T) {
	t.Parallel()
	env := podmantest.Need(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	v := newAPI(ctx, t, env, vm.Config{})

	var one bytes.Buffer
	tw := tar.NewWriter(&one)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "f", Mode: 0o644, Size: 2, Typeflag: tar.TypeReg}))
	tw.Write([]byte("hi"))
	tw.Close()
	assert.ErrorIs(t, v.CopyIn(ctx, "/no/such/dir", bytes.NewReader(one.Bytes())), fs.ErrNotExist)
	assert.ErrorIs(t, v.CopyIn(ctx, "/etc/passwd", bytes.NewReader(one.Bytes())), vm.ErrPodman, "not a directory")
	res, err := v.Run(ctx, exec.Command{Name: "ls", Args: []string{"/no"}})
	require.NoError(t, err)
	assert.NotEqual(t, 0, res.ExitCode, "CopyIn made the missing directory")

	var evil bytes.Buffer
	tw = tar.NewWriter(&evil)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "../escape", Mode: 0o644, Typeflag: tar.TypeReg}))
	tw.Close()
	assert.ErrorIs(t, v.CopyIn(ctx, "/tmp", &evil), vm.ErrUnsafeArchive)

	err = v.CopyOut(ctx, "/no/such/path", new(bytes.Buffer))
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.ErrorContains(t, err, "no such file or directory")
}

func TestAPIUnavailable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	uri := "unix://" + t.TempDir() + "/no.sock"
	_, err := vm.NewAPIVM(ctx, uri, vm.Config{Image: "localhost/podvm-test:latest"})
	assert.ErrorIs(t, err, vm.ErrUnavailable)
	assert.ErrorContains(t, err, uri)

	// An invalid config is refused before any connection is tried.
	start := time.Now()
	_, err = vm.NewAPIVM(ctx, "tcp://192.0.2.1:9", vm.Config{})
	assert.ErrorIs(t, err, vm.ErrInvalidConfig)
	assert.Less(t, time.Since(start), 100*time.Millisecond)
	_, err = vm.NewAPIVM(ctx, uri, vm.Config{Image: "localhost/podvm-test:latest", Mounts: []vm.Mount{{Source: "/no/such/dir", Target: "/x"}}})
	assert.ErrorIs(t, err, vm.ErrInvalidConfig)
}

// BenchmarkAPIRun measures one Run of a small command, output on both
// streams and a non-zero exit, on one VM.
func BenchmarkAPIRun(b *testing.B) {
	env := podmantest.Need(b)
	ctx := context.Background()
	v, err := vm.NewAPIVM(ctx, env.Host, vm.Config{Image: env.Image})
	require.NoError(b, err)
	require.NoError(b, v.Create(ctx))
	defer v.Remove(ctx)
	cmd := exec.Command{Name: "sh", Args: []string{"-c", "echo hi; echo oops >&2; exit 3"}}
	b.ResetTimer()
	for b.Loop() {
		res, err := v.Run(ctx, cmd)
		if err != nil || res.ExitCode != 3 {
			b.Fatal(res, err)
		}
	}
}
