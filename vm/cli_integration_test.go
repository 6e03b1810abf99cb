package vm_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
)

// cliMode is how the suite runs the CLI backend. For a service on this
// machine the host's podman runs locally, on the service's storage, as
// vm.New's fallback runs it:
// podman-remote's exec now and then loses the output of a short command
// under load (containers/podman#25855, #21741), which no caller of it can
// repair; the other TestCLI tests run it remotely, through --url. The matrix's
// Podman 5 client is remote only.
func cliMode(env podmantest.Env) (exec.Executor, []vm.Option) {
	if env.RemoteOnly || !strings.HasPrefix(env.Host, "unix://") { // a local podman reaches only this machine
		return nil, []vm.Option{vm.WithURL(env.Host)}
	}
	var local []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CONTAINER_HOST=") && !strings.HasPrefix(kv, "CONTAINER_CONNECTION=") {
			local = append(local, kv)
		}
	}
	return exec.NewCommandExecutor(exec.WithBaseEnv(local), exec.WithContainment(exec.ContainProcessGroup)), nil
}

// podman runs the podman CLI against env's service, outside any VM, to
// check what a VM did.
func podman(ctx context.Context, t *testing.T, env podmantest.Env, args ...string) string {
	t.Helper()
	res, err := exec.NewCommandExecutor().Run(ctx, exec.Command{Name: "podman", Args: append([]string{"--url", env.Host}, args...)})
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, "podman %v: %s", args, res.Stderr)
	return res.Stdout
}

// newCLI returns a CLIVM for cfg, removed when the test ends.
func newCLI(t *testing.T, env podmantest.Env, cfg vm.Config) *vm.CLIVM {
	t.Helper()
	cfg.Image = env.Image
	v, err := vm.NewCLIVM(cfg, nil, vm.WithURL(env.Host))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		assert.NoError(t, v.Remove(ctx))
	})
	return v
}

// withTestLabel labels the test's sandboxes, so that podman can list them.
func withTestLabel(t *testing.T) (vm.Config, string) {
	filter := "label=io.podvm.test=" + strings.ReplaceAll(t.Name(), "/", "_")
	_, kv, _ := strings.Cut(filter, "label=")
	k, v, _ := strings.Cut(kv, "=")
	return vm.Config{Labels: map[string]string{k: v}}, filter
}

// BenchmarkCLIRun compares one Run through CLIVM with the same command
// run by a plain `podman exec` on the same container. Each iteration runs
// both, one after the other, so that both see the same machine load; the
// metrics are the median wall time of each and their ratio. Run it with
// -benchtime 40x or so.
func BenchmarkCLIRun(b *testing.B) {
	env := podmantest.Need(b)
	ctx := context.Background()
	v, err := vm.NewCLIVM(vm.Config{Image: env.Image}, nil, vm.WithURL(env.Host))
	require.NoError(b, err)
	require.NoError(b, v.Create(ctx))
	b.Cleanup(func() { assert.NoError(b, v.Remove(context.Background())) })
	cmd := exec.Command{Name: "sh", Args: []string{"-c", "echo hi; echo oops >&2; exit 3"}}
	plain := exec.Command{Name: "podman", Args: append([]string{"--url", env.Host, "exec", v.ID(), cmd.Name}, cmd.Args...)}
	host := exec.NewCommandExecutor()
	runs := []func() (*exec.Result, error){
		func() (*exec.Result, error) { return v.Run(ctx, cmd) },
		func() (*exec.Result, error) { return host.Run(ctx, plain) },
	}
	var took [2][]time.Duration
	for b.Loop() {
		for i, run := range runs {
			start := time.Now()
			res, err := run()
			took[i] = append(took[i], time.Since(start))
			if err != nil || res.ExitCode != 3 || res.Stdout != "hi\n" || res.Stderr != "oops\n" {
				b.Fatalf("run %d: got %+v, %v", i, res, err)
			}
		}
	}
	var p50 [2]float64
	for i := range took {
		slices.Sort(took[i])
		p50[i] = float64(took[i][len(took[i])/2].Microseconds()) / 1000
	}
	b.ReportMetric(p50[0], "clivm-p50-ms")
	b.ReportMetric(p50[1], "podman-exec-p50-ms")
	b.ReportMetric(p50[0]/p50[1], "ratio")
}
