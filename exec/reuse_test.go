package exec_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/podvm/podvm/exec"
)

// cgroupExecutor returns an executor of its own with the cgroup
// containment, and the cgroup v2 mount its run cgroups are under.
func cgroupExecutor(t *testing.T) (*exec.CommandExecutor, string) {
	t.Helper()
	x := exec.NewCommandExecutor(exec.WithContainment(exec.ContainCgroup))
	if _, err := x.Containment(); err != nil {
		t.Skip(err)
	}
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var fs unix.Statfs_t
		if unix.Statfs(root, &fs) == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC {
			return x, root
		}
	}
	t.Fatal("the cgroup containment works but no cgroup v2 is mounted where the test looks")
	return nil, ""
}

// cgroupOf is the run's cgroup, as `cat /proc/self/cgroup` printed it first.
func cgroupOf(t *testing.T, stdout string) string {
	t.Helper()
	for line := range strings.Lines(stdout) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "0::"); ok {
			return p
		}
	}
	t.Fatalf("no cgroup v2 line in %q", stdout)
	return ""
}

// Runs that follow one another share a cgroup, emptied between them; a
// run whose cgroup is not as a new one would be, after it, gets another:
// one killed (Linux kills whatever is cloned into a killed cgroup), one
// frozen by a process that left it, one with a cgroup of its own. Each
// run reports only its own CPU time.
func TestCgroupReuse(t *testing.T) {
	x, root := cgroupExecutor(t)
	own, err := os.ReadFile("/proc/self/cgroup")
	require.NoError(t, err)
	parent := filepath.Join(root, cgroupOf(t, string(own)))
	show := "cat /proc/self/cgroup; cg=$ROOT$(sed -n 's/^0:://p' /proc/self/cgroup); "
	run := func(script string, timeout time.Duration) (*exec.Result, error) {
		return x.Run(context.Background(), exec.Command{Name: "sh", Args: []string{"-c", show + script},
			Env: []string{"ROOT=" + root, "PARENT=" + parent}, Timeout: timeout})
	}
	for _, c := range []struct {
		name, script string
		timeout      time.Duration
		reused       bool
	}{
		{"clean", "true", 0, true},
		{"burnt", `"$0" burn 300ms`, 0, true},
		{"killed", "exec sleep 10", 200 * time.Millisecond, false},
		{"frozen", `echo $$ > "$PARENT/cgroup.procs" && echo 1 > "$cg/cgroup.freeze"`, 0, false},
		{"child cgroup", `mkdir "$cg/child"`, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := run("true", 0) // runs that follow one another
			require.NoError(t, err)
			cmd := exec.Command{Name: "sh", Args: []string{"-c", show + c.script, os.Args[0]},
				Env: []string{"ROOT=" + root, "PARENT=" + parent, "PODVM_TEST_HELPER=1"}, Timeout: c.timeout}
			first, err := x.Run(context.Background(), cmd)
			if c.timeout > 0 {
				require.ErrorIs(t, err, context.DeadlineExceeded)
			} else {
				require.NoError(t, err)
				require.Equal(t, 0, first.ExitCode, first.Stderr)
			}
			// Not bounded by its timeout: a clone into a frozen cgroup
			// never returns.
			type ran struct {
				res *exec.Result
				err error
			}
			done := make(chan ran, 1)
			go func() {
				res, err := run("true", 10*time.Second)
				done <- ran{res, err}
			}()
			var next *exec.Result
			select {
			case r := <-done:
				next, err = r.res, r.err
			case <-time.After(15 * time.Second):
				t.Fatal("the next run hangs")
			}
			require.NoError(t, err, "the next run works")
			require.Equal(t, 0, next.ExitCode, next.Stderr)
			if c.reused {
				assert.Equal(t, cgroupOf(t, first.Stdout), cgroupOf(t, next.Stdout), "the emptied cgroup serves the next run")
			} else {
				assert.NotEqual(t, cgroupOf(t, first.Stdout), cgroupOf(t, next.Stdout), "a spoilt cgroup is not reused")
			}
			require.NotNil(t, next.Usage)
			assert.Less(t, next.Usage.UserCPU+next.Usage.SystemCPU, 100*time.Millisecond,
				"the next run's usage is its own (first: %+v)", first.Usage)
		})
	}
	require.Eventually(t, func() bool { return len(ownCgroups(t)) == 0 }, 5*time.Second, 50*time.Millisecond,
		"kept cgroups are removed a second after the last run: %v", ownCgroups(t))
}

// Runs stopped as they exit never touch a cgroup that already serves
// another run: every run of a busy executor that is not stopped exits 0.
func TestCgroupReuseStopRace(t *testing.T) {
	x, _ := cgroupExecutor(t)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for range 50 {
				cmd := exec.Command{Name: "true"}
				if i%2 == 1 { // stopped around the moment it exits
					cmd = exec.Command{Name: "sleep", Args: []string{"0.002"}, Timeout: 2 * time.Millisecond}
				}
				res, err := x.Run(context.Background(), cmd)
				if i%2 == 0 {
					if assert.NoError(t, err) {
						assert.Equal(t, 0, res.ExitCode, "killed by another run's stop")
					}
				}
			}
		})
	}
	wg.Wait()
}
