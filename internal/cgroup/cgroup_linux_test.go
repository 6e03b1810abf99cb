package cgroup

import (
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// parent returns the process's own cgroup v2 as a parent for run
// cgroups, or skips where there is none.
func parent(t *testing.T) *Parent {
	t.Helper()
	p, err := Find("")
	if errors.Is(err, ErrUnavailable) {
		t.Skipf("no writable cgroup v2 here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// startIn starts `sleep 1000` inside run cgroup r.
func startIn(t *testing.T, r *Run) *osexec.Cmd {
	t.Helper()
	c := osexec.Command("sleep", "1000")
	c.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: r.FD()}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill() }) // when the code under test did not
	return c
}

// waitStatus waits for c, at most ten seconds, and returns how it ended.
func waitStatus(t *testing.T, c *osexec.Cmd) syscall.WaitStatus {
	t.Helper()
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	select {
	case <-done:
		return c.ProcessState.Sys().(syscall.WaitStatus)
	case <-time.After(10 * time.Second):
		c.Process.Kill()
		<-done
		t.Fatal("the process in the run cgroup was not killed")
		return 0
	}
}

func gone(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s is still there (%v)", dir, err)
	}
}

func TestFindRefusesWhatIsNotCgroupV2(t *testing.T) {
	_, err := Find(t.TempDir())
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Find(a plain directory) = %v, want ErrUnavailable", err)
	}
}

// Finish kills what is still in the cgroup, counts its CPU time, and
// removes it, with a cgroup the run made inside it.
func TestFinishKillsAndRemoves(t *testing.T) {
	p := parent(t)
	r, err := p.New(Limits{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Remove() }) // when Finish did not
	c := startIn(t, r)
	if err := os.Mkdir(filepath.Join(r.dir, "nested"), 0o755); err != nil {
		t.Fatal(err)
	}
	user, system, _, err := r.Finish()
	if err != nil {
		t.Fatal(err)
	}
	if user < 0 || system < 0 {
		t.Errorf("usage %v %v", user, system)
	}
	if ws := waitStatus(t, c); ws.Signal() != syscall.SIGKILL {
		t.Errorf("the process in the cgroup ended with %v, want SIGKILL", ws)
	}
	gone(t, r.dir)
}

// A limit whose controller the parent does not give is refused, not
// ignored.
func TestNewRefusesUnenforceableLimits(t *testing.T) {
	p := parent(t)
	memory, pids := p.Controllers()
	for _, c := range []struct {
		l  Limits
		on bool
	}{{Limits{MemoryBytes: 64 << 20}, memory}, {Limits{Pids: 10}, pids}} {
		r, err := p.New(c.l)
		if c.on {
			if err != nil {
				t.Errorf("New(%+v): %v", c.l, err)
				continue
			}
			r.Remove()
		} else if err == nil {
			r.Remove()
			t.Errorf("New(%+v) without its controller: no error", c.l)
		}
	}
}

// runIn makes a run cgroup named "podvm-"+name under p by hand, as
// another process would have, with `sleep 1000` in it.
func runIn(t *testing.T, p *Parent, name string) (*Run, *osexec.Cmd) {
	t.Helper()
	r := &Run{dir: filepath.Join(p.dir, "podvm-"+name), fd: -1, cpu: -1, peak: -1}
	if err := os.Mkdir(r.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Remove() }) // when the sweep did not
	var err error
	if r.fd, err = unix.Open(r.dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		t.Fatal(err)
	}
	c := startIn(t, r)
	r.close()
	return r, c
}

// isolated returns a parent of its own under the process's cgroup, so
// that no other test process's sweep touches what a test makes by hand.
func isolated(t *testing.T) *Parent {
	t.Helper()
	dir := filepath.Join(parent(t).dir, "podvm-test-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(dir) })
	p, err := Find(dir)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Find kills and removes the run cgroups of a process image that is gone
// (dead, or replaced by exec: same pid, another token), and leaves alone
// those of live processes, those named in another PID namespace (whose
// pids mean nothing here), and this image's own.
func TestFindSweepsDeadCallers(t *testing.T) {
	p := isolated(t)
	dead := osexec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	me := strings.Split(instance(), "-")
	ns, pid := me[0], strconv.Itoa(dead.Process.Pid)
	if ns == "0" {
		t.Skip("no PID namespace to name runs in: nothing is swept")
	}
	orphan, c := runIn(t, p, ns+"-"+pid+"-0badcafe-1")
	replaced, rc := runIn(t, p, ns+"-"+me[1]+"-0badcafe-2")
	foreign, _ := runIn(t, p, ns+"1-"+pid+"-0badcafe-3")
	live, _ := runIn(t, p, ns+"-"+strconv.Itoa(os.Getppid())+"-0badcafe-4")
	mine, err := p.New(Limits{})
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Remove()

	start := time.Now()
	if _, err := Find(p.dir); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, c)
	waitStatus(t, rc)
	t.Logf("swept in %v", time.Since(start))
	gone(t, orphan.dir)
	gone(t, replaced.dir)
	if _, err := os.Stat(mine.dir); err != nil {
		t.Errorf("this image's own run cgroup was swept: %v", err)
	}
	for _, r := range []*Run{foreign, live} {
		if _, err := os.Stat(r.dir); err != nil || !r.populated() {
			t.Errorf("%s was swept (%v)", r.dir, err)
		}
	}
}
