package exec_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/testkit"
)

// contained is an executor whose containment must leave nothing alive.
type contained struct {
	name string
	x    *exec.CommandExecutor
}

// strict returns an executor for each containment that kills whatever a
// process does to detach. Both work on the project's machine (root, a
// cgroup v2 mounted beside v1); a host without one skips its cases.
func strict(t *testing.T) []contained {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("the cgroup and subreaper containments are Linux only")
	}
	var out []contained
	for _, c := range []exec.Containment{exec.ContainCgroup, exec.ContainSubreaper} {
		x := exec.NewCommandExecutor(exec.WithContainment(c))
		if _, err := x.Containment(); err != nil {
			t.Logf("%v: not tested here: %v", c, err)
			continue
		}
		out = append(out, contained{c.String(), x})
	}
	require.NotEmpty(t, out, "the subreaper needs only exec.Init, which TestMain calls")
	return out
}

var marks atomic.Int64

// mark returns a string no other process carries: a sleep duration too.
func mark() string { return fmt.Sprintf("1011.%d%06d", os.Getpid(), marks.Add(1)) }

// survivors lists the live processes whose argv or environment holds mark.
func survivors(mark string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		environ, _ := os.ReadFile("/proc/" + e.Name() + "/environ")
		if (bytes.Contains(cmdline, []byte(mark)) || bytes.Contains(environ, []byte("PODVM_MARK="+mark))) && testkit.Alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// requireNothingLeft checks, the moment Run has returned, that none of
// pids and no process carrying mark is alive.
func requireNothingLeft(t *testing.T, pids []int, mark string) {
	t.Helper()
	var live []string
	for _, p := range append(slices.DeleteFunc(pids, func(p int) bool { return !testkit.Alive(p) }), survivors(mark)...) {
		live = append(live, testkit.Describe(p))
		_ = syscallKill(p)
	}
	require.Empty(t, live, "processes left alive after Run returned")
}

// Each way a process detaches, ended by each way a run ends: nothing is
// left, and Run returns on time.
func TestRunContainsEscapes(t *testing.T) {
	t.Parallel()
	// Long enough for the escaped process to print its pid first: these
	// subtests start 30 helpers at once under the race detector, and at
	// 500 ms a loaded machine sometimes ran out of it.
	const stopAfter = 2 * time.Second
	for _, c := range strict(t) {
		for _, how := range []string{"setsid", "setpgid", "doublefork", "clearenv", "rename"} {
			for _, end := range []string{"timeout", "cancel", "exit"} {
				t.Run(c.name+"/"+how+"/"+end, func(t *testing.T) {
					t.Parallel()
					m := mark()
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					cmd := helper("escape", how, m, "hang")
					switch end {
					case "timeout":
						cmd.Timeout = stopAfter
					case "cancel":
						time.AfterFunc(stopAfter, cancel)
					case "exit":
						cmd = helper("escape", how, m, "exit")
					}
					start := time.Now()
					res, err := c.x.Run(ctx, cmd)
					elapsed := time.Since(start)
					require.NotNil(t, res, "%v", err)
					switch end {
					case "timeout":
						require.ErrorIs(t, err, context.DeadlineExceeded)
						assert.True(t, res.TimedOut)
					case "cancel":
						require.ErrorIs(t, err, context.Canceled)
					case "exit":
						require.NoError(t, err)
						assert.Equal(t, 0, res.ExitCode)
					}
					pids := pidsOf(t, res.Stdout)
					require.NotEmpty(t, pids, "the escaped process's pid")
					requireNothingLeft(t, pids, m)
					// Nothing held the pipes past the kill: no grace was needed.
					assert.Less(t, elapsed, stopAfter+exec.DefaultKillGrace+scheduling)
				})
			}
		}
	}
}

// scheduling is what a loaded shared machine may add to a bound that
// the code keeps: enough that only a Run that waits for its processes
// (a fork bomb never ends by itself) fails, never a slow machine.
const scheduling = 30 * time.Second

// The case, verbatim but for a unique sleep.
func TestRunTimeoutKillsSetsidSleep(t *testing.T) {
	t.Parallel()
	for _, c := range strict(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			m := mark()
			res, err := c.x.Run(context.Background(), exec.Command{Name: "sh", Args: []string{"-c", "setsid sleep " + m + " & sleep 100"}, Timeout: time.Second})
			require.ErrorIs(t, err, context.DeadlineExceeded)
			assert.True(t, res.TimedOut)
			requireNothingLeft(t, nil, m)
		})
	}
}

// A fork bomb, bounded so as to spare a shared machine (32 shells, each
// starting a detached sleep every 0.1 s until killed), stopped by a
// timeout in the middle of its forking.
func TestRunForkBombUnderTimeout(t *testing.T) {
	for _, c := range strict(t) {
		t.Run(c.name, func(t *testing.T) {
			m := mark()
			script := `b() { if [ "$1" -gt 0 ]; then b $(($1-1)) & b $(($1-1)) & else while :; do setsid sleep ` + m + ` & sleep 0.1; done; fi; wait; }; b 5`
			const timeout = time.Second
			start := time.Now()
			res, err := c.x.Run(context.Background(), exec.Command{Name: "sh", Args: []string{"-c", script}, Timeout: timeout})
			elapsed := time.Since(start)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			assert.True(t, res.TimedOut)
			assert.Less(t, elapsed, timeout+exec.DefaultKillGrace+scheduling, "returns on time")
			requireNothingLeft(t, nil, m)
		})
	}
}

// Under the process group, a process that leaves the group escapes: the
// documented weakness, checked so the documentation stays true.
func TestRunProcessGroupLetsSetsidEscape(t *testing.T) {
	t.Parallel()
	x := exec.NewCommandExecutor(exec.WithContainment(exec.ContainProcessGroup))
	got, err := x.Containment()
	require.NoError(t, err)
	require.Equal(t, exec.ContainProcessGroup, got)
	start := time.Now()
	// The pause lets setsid happen before the group is killed.
	res, err := x.Run(context.Background(), exec.Command{Name: "sh", Args: []string{"-c", "setsid sleep 30 & sleep 0.3; echo $!"}})
	elapsed := time.Since(start)
	require.NoError(t, err)
	pids := pidsOf(t, res.Stdout)
	t.Cleanup(func() {
		for _, p := range pids {
			syscallKill(p)
		}
	})
	require.True(t, testkit.Alive(pids[0]), "the escaped process should have survived the group kill")
	assert.GreaterOrEqual(t, elapsed, exec.DefaultKillGrace, "Run waited for the pipes for the grace")
	assert.Less(t, elapsed, exec.DefaultKillGrace+3*time.Second, "then closed them")
}

func TestContainmentChoice(t *testing.T) {
	t.Parallel()
	auto, err := exec.NewCommandExecutor().Containment()
	require.NoError(t, err)
	cg, cgErr := exec.NewCommandExecutor(exec.WithContainment(exec.ContainCgroup)).Containment()
	assert.Equal(t, exec.ContainCgroup, cg)
	switch {
	case cgErr == nil:
		assert.Equal(t, exec.ContainCgroup, auto, "the cgroup works here, so auto picks it")
	case runtime.GOOS == "linux":
		require.ErrorIs(t, cgErr, exec.ErrUnsupported)
		assert.Equal(t, exec.ContainSubreaper, auto, "exec.Init was called, so auto falls back to the subreaper")
	default:
		assert.Equal(t, exec.ContainProcessGroup, auto)
	}

	// A cgroup parent that is not a cgroup is refused, not ignored.
	x := exec.NewCommandExecutor(exec.WithContainment(exec.ContainCgroup), exec.WithCgroupParent(t.TempDir()))
	_, err = x.Containment()
	require.ErrorIs(t, err, exec.ErrUnsupported)
	res, err := x.Run(context.Background(), exec.Command{Name: "true"})
	require.ErrorIs(t, err, exec.ErrUnsupported, "a required containment that is missing fails the run")
	assert.Nil(t, res)
	assert.Equal(t, "process-group", exec.ContainProcessGroup.String())
}

// everyContainment returns an executor per containment this host offers.
func everyContainment(t *testing.T) []contained {
	pg := exec.NewCommandExecutor(exec.WithContainment(exec.ContainProcessGroup))
	if runtime.GOOS != "linux" {
		return []contained{{"process-group", pg}}
	}
	return append(strict(t), contained{"process-group", pg})
}

func TestRunUsage(t *testing.T) {
	for _, c := range everyContainment(t) {
		t.Run(c.name+"/cpu", func(t *testing.T) {
			res, err := c.x.Run(context.Background(), helper("burn", "1s"))
			require.NoError(t, err)
			require.NotNil(t, res.Usage)
			cpu := res.Usage.UserCPU + res.Usage.SystemCPU
			assert.GreaterOrEqual(t, cpu, 900*time.Millisecond, "usage %+v", res.Usage)
			assert.Less(t, cpu, 1500*time.Millisecond+res.Duration, "usage %+v", res.Usage)
		})
		t.Run(c.name+"/memory", func(t *testing.T) {
			res, err := c.x.Run(context.Background(), helper("touch", "64"))
			require.NoError(t, err)
			require.NotNil(t, res.Usage)
			assert.GreaterOrEqual(t, res.Usage.PeakRSS, int64(64<<20), "usage %+v", res.Usage)
			assert.Less(t, res.Usage.PeakRSS, int64(1<<30), "usage %+v", res.Usage)
		})
	}
}

// A tree's usage is the whole tree's where the run is contained: a CPU
// burner left in the background and killed at the end still counts.
func TestRunUsageCountsTheTree(t *testing.T) {
	t.Parallel()
	for _, c := range strict(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// The shell exits once its orphan has burnt 400 ms of CPU,
			// however loaded the machine; the orphan burns on until the
			// run's end kills it.
			cmd := helper("", "")
			cmd.Name, cmd.Args = "sh", []string{"-c", `"$0" burn 400ms "$1" & while [ ! -e "$1" ]; do sleep 0.05; done`,
				os.Args[0], filepath.Join(t.TempDir(), "burnt")}
			cmd.Timeout = time.Minute
			res, err := c.x.Run(context.Background(), cmd)
			require.NoError(t, err)
			require.NotNil(t, res.Usage)
			assert.GreaterOrEqual(t, res.Usage.UserCPU+res.Usage.SystemCPU, 300*time.Millisecond,
				"the orphaned burner's CPU counts (usage %+v)", res.Usage)
		})
	}
}

func TestRunLimits(t *testing.T) {
	t.Parallel()
	for _, c := range strict(t) {
		t.Run(c.name+"/MaxCPUTime", func(t *testing.T) {
			t.Parallel()
			res, err := c.x.Run(context.Background(), exec.Command{Name: "sh", Args: []string{"-c", "while :; do :; done"},
				MaxCPUTime: 500 * time.Millisecond, Timeout: 20 * time.Second})
			require.NoError(t, err)
			assert.Equal(t, 128+24, res.ExitCode, "SIGXCPU at the limit, rounded up to 1 s")
			assert.Less(t, res.Duration, 10*time.Second)
		})
		// Where the cgroup lacks the controller, the limit is refused by
		// name and nothing runs; where it has it, the kernel enforces it.
		touch := helper("touch", "256")
		touch.MaxMemoryBytes = 64 << 20
		for _, lc := range []struct {
			field string
			cmd   exec.Command
			check func(t *testing.T, res *exec.Result)
		}{
			{"MaxMemoryBytes", touch, func(t *testing.T, res *exec.Result) {
				assert.Equal(t, 137, res.ExitCode, "the kernel's OOM killer ends it")
			}},
			{"MaxPids", exec.Command{Name: "sh", Args: []string{"-c", `for i in $(seq 40); do sleep 5 & done 2>/dev/null; jobs -p | wc -l`}, MaxPids: 10},
				func(t *testing.T, res *exec.Result) {
					n, _ := strconv.Atoi(strings.TrimSpace(res.Stdout))
					assert.Less(t, n, 10, "forks past the limit fail")
				}},
		} {
			t.Run(c.name+"/"+lc.field, func(t *testing.T) {
				t.Parallel()
				res, err := c.x.Run(context.Background(), lc.cmd)
				if errors.Is(err, exec.ErrUnsupported) {
					t.Logf("refused here: %v", err)
					assert.ErrorContains(t, err, lc.field, "the refusal names the limit")
					assert.Nil(t, res, "nothing ran")
					return
				}
				require.NoError(t, err)
				lc.check(t, res)
			})
		}
	}
	t.Run("process group refuses every limit", func(t *testing.T) {
		t.Parallel()
		x := exec.NewCommandExecutor(exec.WithContainment(exec.ContainProcessGroup))
		for _, cmd := range []exec.Command{
			{Name: "true", MaxCPUTime: time.Second},
			{Name: "true", MaxMemoryBytes: 1 << 30},
			{Name: "true", MaxPids: 100},
		} {
			res, err := x.Run(context.Background(), cmd)
			require.ErrorIs(t, err, exec.ErrUnsupported)
			assert.Nil(t, res)
		}
	})
}

// 300 runs, a tenth of them timed out and a tenth ended by a panicking
// Stdout writer, leave no cgroup, no descriptor and no zombie behind: a
// leak of one descriptor in each faulty run is 30 of each kind, over the
// slack of two. (1,000 runs found nothing more and cost CI 70 s.)
func TestRunHundredsLeaveNothing(t *testing.T) {
	for _, c := range strict(t) {
		t.Run(c.name, func(t *testing.T) {
			before := openFDs(t)
			for i := range 300 {
				cmd := exec.Command{Name: "/bin/true"}
				switch i % 10 {
				case 3:
					cmd = exec.Command{Name: "sh", Args: []string{"-c", "setsid sleep 60 & sleep 60"}, Timeout: 10 * time.Millisecond}
				case 7:
					cmd = exec.Command{Name: "sh", Args: []string{"-c", "setsid sleep 60 & echo x; sleep 60"}, Stdout: panicWriter{}}
				}
				func() {
					defer func() {
						if v := recover(); i%10 == 7 {
							assert.Equal(t, "boom", v, "the writer's panic reaches the caller")
						} else if v != nil {
							panic(v)
						}
					}()
					c.x.Run(context.Background(), cmd)
				}()
			}
			assert.LessOrEqual(t, openFDs(t), before+2, "descriptors left open")
			assert.Empty(t, zombieChildren(), "zombies left")
			assert.Empty(t, ownCgroups(t), "cgroups left")
		})
	}
}

type panicWriter struct{}

func (panicWriter) Write([]byte) (int, error) { panic("boom") }

// zombieChildren lists this process's unreaped children.
func zombieChildren() []int {
	ents, _ := os.ReadDir("/proc")
	var z []int
	for _, e := range ents {
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(stat)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[0] == "Z" && f[1] == strconv.Itoa(os.Getpid()) {
			pid, _ := strconv.Atoi(e.Name())
			z = append(z, pid)
		}
	}
	return z
}

// ownCgroups lists the run cgroups of this process left in its cgroup v2.
func ownCgroups(t *testing.T) []string { return ownRunCgroups(t, strconv.Itoa(os.Getpid())) }

// runCgroups lists the run cgroups of process pid, of this PID namespace,
// left in dirs.
func runCgroups(t *testing.T, pid string, dirs ...string) []string {
	left, err := runCgroupsIn(dirs, pid)
	require.NoError(t, err)
	return left
}

// ownRunCgroups is runCgroups in this process's cgroup v2.
func ownRunCgroups(t *testing.T, pid string) []string {
	dirs, err := ownCgroupDirs()
	require.NoError(t, err)
	return runCgroups(t, pid, dirs...)
}

// ownCgroupDirs lists where this process's cgroup v2 may be: under
// /sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host.
func ownCgroupDirs() ([]string, error) {
	data, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	var rel string
	for line := range strings.Lines(string(data)) {
		if p, ok := strings.CutPrefix(strings.TrimSpace(line), "0::"); ok {
			rel = p
		}
	}
	return []string{filepath.Join("/sys/fs/cgroup", rel), filepath.Join("/sys/fs/cgroup/unified", rel)}, nil
}

// runCgroupsIn lists the run cgroups of process pid, of this PID
// namespace, in dirs: run cgroups are named podvm-PIDNS-PID-TOKEN-SEQ.
func runCgroupsIn(dirs []string, pid string) ([]string, error) {
	ns, err := os.Stat("/proc/self/ns/pid")
	if err != nil {
		return nil, err
	}
	prefix := fmt.Sprintf("podvm-%d-%s-", ns.Sys().(*syscall.Stat_t).Ino, pid)
	var left []string
	for _, dir := range dirs {
		found, _ := filepath.Glob(filepath.Join(dir, prefix+"*"))
		left = append(left, found...)
	}
	return left, nil
}

// privateParent makes a cgroup v2 of the test's own, under this
// process's, for an executor's run cgroups (WithCgroupParent): no other
// process's sweep looks there.
func privateParent(t *testing.T) string {
	t.Helper()
	dirs, err := ownCgroupDirs()
	require.NoError(t, err)
	for _, d := range dirs {
		var fs unix.Statfs_t
		if unix.Statfs(d, &fs) == nil && fs.Type == unix.CGROUP2_SUPER_MAGIC {
			dir := filepath.Join(d, "podvm-test-"+mark())
			require.NoError(t, os.Mkdir(dir, 0o755))
			t.Cleanup(func() {
				// What the code under test failed to remove goes too.
				left, _ := filepath.Glob(filepath.Join(dir, "podvm-*"))
				for _, cg := range left {
					os.WriteFile(filepath.Join(cg, "cgroup.kill"), []byte("1"), 0)
				}
				for _, cg := range left {
					assert.Eventually(t, func() bool { return os.Remove(cg) == nil }, 5*time.Second, 20*time.Millisecond)
				}
				os.Remove(dir)
			})
			return dir
		}
	}
	t.Fatal("the cgroup containment works but no cgroup v2 of this process is where the test looks")
	return ""
}

func TestErrUnsupported(t *testing.T) {
	t.Parallel()
	_, err := exec.NewCommandExecutor(exec.WithContainment(exec.ContainProcessGroup)).Run(context.Background(), exec.Command{Name: "true", MaxPids: 1})
	require.ErrorIs(t, err, exec.ErrUnsupported)
	require.ErrorIs(t, err, errors.ErrUnsupported, "the standard library's sentinel matches too")
	assert.Equal(t, "exec: not supported here: true: MaxPids needs the cgroup containment; this executor's is process-group", err.Error())
}

// The command cannot reach its helper's control socket (it could forge
// its own exit status).
func TestRunInheritsOnlyStdio(t *testing.T) {
	t.Parallel()
	for _, c := range strict(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			res, err := c.x.Run(context.Background(), exec.Command{Name: "ls", Args: []string{"-l", "/proc/self/fd/"}})
			require.NoError(t, err)
			assert.Contains(t, res.Stdout, "pipe:", "the listing works")
			assert.NotContains(t, res.Stdout, "socket:")
		})
	}
}

// A caller that dies mid-run takes its runs with it: the subreaper
// helper sees its control socket close, the cgroup watcher its pipe, and
// each kills the whole run at once, with no other executor to look (the
// cgroup runs are under a parent of their own, which no other test
// process sweeps).
func TestRunCallerCrash(t *testing.T) {
	for _, c := range strict(t) {
		t.Run(c.name, func(t *testing.T) {
			m := mark()
			args := []string{c.name, m}
			if c.name == "cgroup" {
				args = append(args, privateParent(t))
			}
			// Not from a run cgroup of this process: the crashed caller's
			// would be nested in it, and killed with it.
			pg := exec.NewCommandExecutor(exec.WithContainment(exec.ContainProcessGroup))
			res, err := pg.Run(context.Background(), helper("crash", args...))
			require.NoError(t, err)
			require.Equal(t, 3, res.ExitCode, res.Stderr)
			require.Eventually(t, func() bool { return len(survivors(m)) == 0 }, 5*time.Second, 20*time.Millisecond,
				"the run outlived its dead caller: %v", survivors(m))
			if c.name == "cgroup" {
				require.Eventually(t, func() bool { return len(runCgroups(t, res.Stdout, args[2])) == 0 }, 5*time.Second, 20*time.Millisecond,
					"the dead caller's run cgroup is left: %v", runCgroups(t, res.Stdout, args[2]))
			}
		})
	}
}

// A program that exits the moment its last run returns leaves no cgroup:
// each run's is removed before Run returns, not later (the program looks
// itself, before its watcher could clean up after it).
func TestRunCgroupGoneWhenRunReturns(t *testing.T) {
	x := exec.NewCommandExecutor(exec.WithContainment(exec.ContainCgroup))
	if _, err := x.Containment(); err != nil {
		t.Skip(err)
	}
	// Not from a run cgroup of this process: the program's would be
	// nested in it, and removed with it.
	pg := exec.NewCommandExecutor(exec.WithContainment(exec.ContainProcessGroup))
	res, err := pg.Run(context.Background(), helper("runs", "50"))
	require.NoError(t, err)
	require.Equal(t, 0, res.ExitCode, res.Stderr)
	assert.Empty(t, ownRunCgroups(t, res.Stdout), "cgroups of the exited program's runs")
}

// A command that makes cgroups of its own under its run cgroup (a nested
// podvm, a container runtime) does not keep the run cgroup from going.
func TestRunNestedCgroupsRemoved(t *testing.T) {
	x := exec.NewCommandExecutor(exec.WithContainment(exec.ContainCgroup))
	if _, err := x.Containment(); err != nil {
		t.Skip(err)
	}
	m := mark()
	res, err := x.Run(context.Background(), helper("crash", "cgroup", m))
	require.NoError(t, err)
	assert.Equal(t, 3, res.ExitCode)
	requireNothingLeft(t, nil, m)
	assert.Empty(t, ownCgroups(t))
}

// Executors are cheap: making many holds no descriptor.
func TestExecutorsHoldNoDescriptor(t *testing.T) {
	before := openFDs(t)
	for range 50 {
		x := exec.NewCommandExecutor()
		_, err := x.Run(context.Background(), exec.Command{Name: "true"})
		require.NoError(t, err)
	}
	assert.LessOrEqual(t, openFDs(t), before+2)
}
