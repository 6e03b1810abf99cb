package server

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// These tests reap any child of the test process, as a shim does: none
// of them is parallel, and no other test of the package starts one.

// startGroup starts argv in a process group of its own, as a shim starts
// a command, and returns its pid.
func startGroup(t *testing.T, argv ...string) int {
	t.Helper()
	pid, err := syscall.ForkExec(argv[0], argv, &syscall.ProcAttr{Sys: &syscall.SysProcAttr{Setpgid: true}})
	require.NoError(t, err)
	return pid
}

// A signal reaches the running command at once while the reaper is
// blocked waiting for it; once the command is reaped there is none.
func TestRunningSignalDoesNotWaitForTheCommand(t *testing.T) {
	pid := startGroup(t, "/bin/sleep", "60")
	var r running
	r.set(pid)
	type result struct {
		pid int
		ws  unix.WaitStatus
		err error
	}
	reaped := make(chan result, 1)
	go func() {
		var res result
		res.pid, res.err = r.wait(&res.ws, nil)
		reaped <- res
	}()
	time.Sleep(100 * time.Millisecond) // for the reaper to block in wait
	signalled := make(chan error, 1)
	go func() { signalled <- r.signal(unix.SIGTERM) }()
	select {
	case err := <-signalled:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		_ = unix.Kill(-pid, unix.SIGKILL) // frees the reaper, then the signal
		t.Fatal("the signal waited for the running command")
	}
	var res result
	select {
	case res = <-reaped:
	case <-time.After(10 * time.Second):
		_ = unix.Kill(-pid, unix.SIGKILL)
		t.Fatal("the signal did not end the command")
	}
	require.NoError(t, res.err)
	assert.Equal(t, pid, res.pid)
	assert.True(t, res.ws.Signaled() && res.ws.Signal() == unix.SIGTERM, "status %#x", res.ws)
	assert.ErrorIs(t, r.signal(unix.SIGTERM), errNotRunning, "the command has been reaped")
}

// A signal sent while the command is being reaped finds it, a zombie at
// worst, or finds none: never its freed pid. Signal 0 sends nothing and
// fails with ESRCH on a pid that has no process; had the pid been taken
// by a new group in between, that group would have been signalled.
func TestRunningNeverSignalsAFreedPid(t *testing.T) {
	for range 300 {
		pid := startGroup(t, "/bin/true")
		var r running
		r.set(pid)
		stop := make(chan struct{})
		bad := make(chan error, 1)
		go func() {
			for {
				select {
				case <-stop:
					bad <- nil
					return
				default:
				}
				if err := r.signal(0); err != nil && !errors.Is(err, errNotRunning) {
					bad <- err
					return
				}
			}
		}()
		var ws unix.WaitStatus
		got, err := r.wait(&ws, nil)
		close(stop)
		require.NoError(t, err)
		require.Equal(t, pid, got)
		require.NoError(t, <-bad, "a signal for pid %d after it was reaped", pid)
	}
}
