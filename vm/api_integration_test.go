package vm_test

import (
	"context"
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
	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
)

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
