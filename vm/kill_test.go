package vm

import (
	"bytes"
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

	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/internal/testkit"
)

// The kill script runs under whatever /bin/sh the image has: dash on
// Debian and Ubuntu, busybox ash on Alpine, bash elsewhere. It is run here,
// on the host, under each of them that is installed, against a marked
// process tree beside an unmarked bystander.
func TestKillScriptUnderEachShell(t *testing.T) {
	shells := map[string][]string{"dash": {"dash"}, "bash": {"bash"}, "busybox ash": {"busybox", "sh"}}
	for name, argv := range shells {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// make podman installs busybox-static; Debian has dash and bash.
			path := podmantest.NeedBinary(t, argv[0])
			marker := newMarker()
			tree := startMarked(t, marker)
			other := startMarked(t, newMarker())

			k := killProcess("", marker)
			script := append(append([]string{}, argv[1:]...), k.Argv[1:]...)
			cmd := osexec.Command(path, script...)
			cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, k.Env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			require.NoError(t, cmd.Run(), "stderr: %s", stderr.String())

			for _, p := range tree {
				assert.True(t, gone(p), "process %d of the run survived the kill under %s", p.Pid, name)
			}
			for _, p := range other {
				assert.True(t, testkit.Alive(p.Pid), "process %d of another run was killed under %s", p.Pid, name)
			}
			assert.Empty(t, marked(t, marker), "marked processes left under %s", name)
		})
	}
}

// A shell that cannot read process environments must fail the kill, not
// report that nothing was left to kill: here its self-check is denied the
// variable it looks for.
func TestKillScriptFailsWhenItCannotSee(t *testing.T) {
	k := killProcess("", newMarker())
	cmd := osexec.Command("sh", k.Argv[1:]...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	out, err := cmd.CombinedOutput()
	var ee *osexec.ExitError
	require.ErrorAs(t, err, &ee)
	assert.Equal(t, 2, ee.ExitCode())
	assert.Contains(t, string(out), "cannot read process environments")
}

// startMarked starts, in a process group of its own, a shell with marker in
// its environment and three children: one marked, one marked that leaves
// the group, one unmarked in the group (only the group kill reaches it).
// It returns them all once they run.
func startMarked(t *testing.T, marker string) []*os.Process {
	t.Helper()
	pidfile := filepath.Join(t.TempDir(), "pids")
	cmd := osexec.Command("sh", "-c", `sleep 300 & a=$!; setsid sleep 300 & b=$!; env -u `+markerKey+` sleep 300 & c=$!
echo "$a $b $c" >"$1.tmp"; mv "$1.tmp" "$1"; wait`, "sh", pidfile)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), marker}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	require.NoError(t, cmd.Start())
	waited := make(chan struct{})
	go func() { cmd.Wait(); close(waited) }()
	procs := []*os.Process{cmd.Process}
	t.Cleanup(func() {
		for _, p := range procs {
			p.Kill()
		}
		<-waited
	})
	var pids []byte
	require.Eventually(t, func() bool {
		var err error
		pids, err = os.ReadFile(pidfile)
		return err == nil
	}, 10*time.Second, 10*time.Millisecond)
	for _, f := range strings.Fields(string(pids)) {
		pid, err := strconv.Atoi(f)
		require.NoError(t, err)
		p, err := os.FindProcess(pid)
		require.NoError(t, err)
		procs = append(procs, p)
	}
	// Until env has exec'd its sleep, the unmarked child still holds the
	// marker.
	require.Eventually(t, func() bool { return len(marked(t, marker)) == 3 }, 10*time.Second, 10*time.Millisecond)
	return procs
}

// gone reports whether p has died (a zombie counts) within a few seconds.
func gone(p *os.Process) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if !testkit.Alive(p.Pid) {
			return true
		}
	}
	return false
}

// marked lists the live processes whose environment holds marker.
func marked(t *testing.T, marker string) []string {
	t.Helper()
	files, err := filepath.Glob("/proc/[0-9]*/environ")
	require.NoError(t, err)
	var pids []string
	for _, f := range files {
		env, err := os.ReadFile(f)
		if err != nil || !bytes.Contains(env, []byte("\x00"+marker+"\x00")) && !bytes.HasPrefix(env, []byte(marker+"\x00")) {
			continue
		}
		pid := filepath.Base(filepath.Dir(f))
		if n, _ := strconv.Atoi(pid); testkit.Alive(n) {
			pids = append(pids, pid)
		}
	}
	return pids
}
