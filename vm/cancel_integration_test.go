package vm_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
)

// A Create cancelled while Podman starts the container leaves no process
// of it on the host. A podman client killed between the runtime's create
// and start leaves, with Podman 4.3, a conmon and a `runc init` that no
// removal finds, for as long as the machine runs: the local CLI's agent
// path did so once in every ~15 cancellations at the start. The cases
// cancel Creates of sandboxes with names of their own at points spread
// over how long a whole Create takes, then look for a conmon naming any
// of them. Only where the service is this machine's, as a local podman
// reaches it.
func TestCancelledCreateLeavesNoRuntimeProcess(t *testing.T) {
	env := podmantest.Need(t)
	if !strings.HasPrefix(env.Host, "unix://") || env.RemoteOnly {
		t.Skip("the service's processes are not this machine's to see")
	}
	for _, c := range []struct {
		name       string
		podmanExec bool
		cli        bool
	}{{"cli", false, true}, {"cli-exec", true, true}, {"api", false, false}} {
		t.Run(c.name, func(t *testing.T) {
			h := apiHarness(env, c.podmanExec)
			if c.cli {
				h = cliHarness(env, c.podmanExec)
			}
			prefix := fmt.Sprintf("podvm-cancel-%d-%s-", os.Getpid(), c.name)
			n := 0
			create := func(ctx context.Context) (time.Duration, error) {
				n++
				v, err := h.NewVM(t, vm.Config{Name: fmt.Sprint(prefix, n)})
				require.NoError(t, err)
				start := time.Now()
				err = v.Create(ctx)
				took := time.Since(start)
				require.NoError(t, v.Remove(context.Background()))
				return took, err
			}
			// How long a whole Create takes here, now.
			whole, err := create(context.Background())
			require.NoError(t, err)
			for i := range 24 {
				after := whole * time.Duration(30+4*i) / 100 // 30% to 122%
				ctx, cancel := context.WithTimeout(context.Background(), after)
				_, err := create(ctx)
				cancel()
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("cancelled after %v: %v", after, err)
				}
			}
			// A conmon of a removed container ends at once; give a
			// loaded machine a moment.
			deadline := time.Now().Add(5 * time.Second)
			left := conmons(t, prefix)
			for len(left) > 0 && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond)
				left = conmons(t, prefix)
			}
			if len(left) > 0 {
				t.Errorf("conmon still runs for removed sandboxes %v (a whole Create took %v)", left, whole)
			}
		})
	}
}

// conmons returns the names of the containers, named with prefix, that a
// conmon process on this machine is running: its argv's -n.
func conmons(t *testing.T, prefix string) []string {
	t.Helper()
	all, err := conmonArgvs()
	require.NoError(t, err)
	var names []string
	for _, argv := range all {
		for i := 0; i+1 < len(argv); i++ {
			if argv[i] == "-n" && strings.HasPrefix(argv[i+1], prefix) {
				names = append(names, argv[i+1])
			}
		}
	}
	return names
}

// conmonArgvs returns the arguments of every conmon on this machine,
// each by its PID.
func conmonArgvs() (map[string][]string, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	all := map[string][]string{}
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil {
			continue // not a process, or gone
		}
		argv := strings.Split(string(b), "\x00")
		if strings.HasSuffix(argv[0], "conmon") {
			all[e.Name()] = argv
		}
	}
	return all, nil
}
