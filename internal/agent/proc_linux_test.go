package agent

import (
	"context"
	"io"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/testkit"
)

// A started run is held: its pid is known at once, its stdin is fed a
// piece at a time, and Wait returns what Run would.
func TestStartHeld(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := context.Background()
	inR, inW := io.Pipe()
	var out testkit.LockedBuffer
	p, err := a.Start(ctx, Request{Argv: []string{"/bin/busybox", "sh", "-c", `echo pid $$; while read -r l; do echo "got $l"; done; exit 7`}}, inR, &out, io.Discard)
	require.NoError(t, err)
	require.Greater(t, p.PID(), 1)
	require.Eventually(t, func() bool { return out.String() != "" }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, "pid "+strconv.Itoa(p.PID())+"\n", out.String(), "the pid is the command's, in the sandbox")
	for _, l := range []string{"one", "two"} {
		_, err := io.WriteString(inW, l+"\n")
		require.NoError(t, err)
		want := "got " + l + "\n"
		require.Eventually(t, func() bool { return strings.HasSuffix(out.String(), want) }, 10*time.Second, 5*time.Millisecond)
	}
	select {
	case <-p.Done():
		t.Fatal("the run ended while its stdin was open")
	default:
	}
	wctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = p.Wait(wctx)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "a Wait that gives up leaves the run alone")
	require.NoError(t, inW.Close())
	ex, err := p.Wait(ctx)
	require.NoError(t, err)
	assert.Equal(t, 7, ex.Code)
	assert.True(t, ex.Reported)
	<-p.Done()
	ex2, err := p.Wait(ctx)
	require.NoError(t, err)
	assert.Equal(t, ex, ex2, "Wait again: the same end")
}

// Start fails as Run does when the command cannot start.
func TestStartFailures(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := context.Background()
	_, err := a.Start(ctx, Request{Argv: []string{"no-such-command"}}, nil, nil, nil)
	assert.ErrorIs(t, err, exec.ErrNotFound)
	_, err = a.Start(ctx, Request{Argv: []string{"/bin/busybox", "true"}, Dir: "/no/such/dir"}, nil, nil, nil)
	assert.ErrorIs(t, err, exec.ErrDirNotFound)
	_, err = a.Start(ctx, Request{Argv: []string{"/bin/busybox", "true"}, User: "nobody-at-all"}, nil, nil, nil)
	assert.ErrorIs(t, err, ErrUnknownUser)
	_, err = a.Start(ctx, Request{}, nil, nil, nil)
	assert.ErrorIs(t, err, exec.ErrInvalidCommand)

	// A command that exits at once is still a started run.
	p, err := a.Start(ctx, Request{Argv: []string{"/bin/busybox", "true"}}, nil, nil, nil)
	require.NoError(t, err)
	ex, err := p.Wait(ctx)
	require.NoError(t, err)
	assert.Equal(t, 0, ex.Code)
}

// Signal reaches the command's process group; Kill ends the whole run.
func TestSignalKill(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := context.Background()
	var out testkit.LockedBuffer
	p, err := a.Start(ctx, Request{Argv: []string{"/bin/busybox", "sh", "-c", `trap 'echo term; exit 3' TERM; echo ready; while :; do sleep 0.05; done`}}, nil, &out, io.Discard)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return out.String() == "ready\n" }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, p.Signal(syscall.SIGTERM))
	ex, err := p.Wait(ctx)
	require.NoError(t, err)
	assert.Equal(t, 3, ex.Code, "the trap ran")
	assert.Equal(t, "ready\nterm\n", out.String())
	assert.NoError(t, p.Signal(syscall.SIGTERM), "a signal after the end is dropped")
	assert.Error(t, p.Signal(0))
	assert.Error(t, p.Signal(65))

	marker := "podvm-proc-kill-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	var ready testkit.LockedBuffer
	p, err = a.Start(ctx, Request{Argv: []string{"/bin/busybox", "sh", "-c",
		`setsid /bin/busybox sh -c '/bin/busybox sleep 1000; :' escapee "$1" & echo started; exec /bin/busybox sleep 1000`, "sh", marker}}, nil, &ready, nil)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return ready.String() != "" && len(alive(marker)) >= 1 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, p.Kill())
	ex, err = p.Wait(ctx)
	require.NoError(t, err)
	assert.True(t, ex.Killed)
	assert.Empty(t, alive(marker), "Kill reaches what left the group")
}

// When the channel ends, every handle says so at once.
func TestStartChannelEnds(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := context.Background()
	p, err := a.Start(ctx, Request{Argv: []string{"/bin/busybox", "sleep", "1000"}}, nil, nil, nil)
	require.NoError(t, err)
	require.NoError(t, a.Close())
	select {
	case <-p.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("Done not closed after the channel ended")
	}
	_, err = p.Wait(ctx)
	assert.ErrorIs(t, err, ErrChannelClosed)
	assert.ErrorIs(t, p.Signal(syscall.SIGTERM), ErrChannelClosed)
	assert.ErrorIs(t, p.Kill(), ErrChannelClosed)
	_, err = a.Start(ctx, Request{Argv: []string{"/bin/busybox", "true"}}, nil, nil, nil)
	assert.ErrorIs(t, err, ErrChannelClosed)
}

// A start that its context cuts short is killed.
func TestStartCancelled(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := a.Start(ctx, Request{Argv: []string{"/bin/busybox", "true"}}, nil, nil, nil)
	assert.ErrorIs(t, err, context.Canceled)
}

// A terminal: the shell's prompt shows, ^C interrupts its foreground
// job, stty sees the size, and a resize.
func TestTerminal(t *testing.T) {
	t.Parallel()
	a := startAgent(t)
	ctx := context.Background()
	inR, inW := io.Pipe()
	var out testkit.LockedBuffer
	p, err := a.Start(ctx, Request{Argv: []string{"/bin/busybox", "sh", "-i"}, Env: []string{"PS1=podvm$ "}, TTY: true, Rows: 30, Cols: 100}, inR, &out, nil)
	require.NoError(t, err)
	waitOut := func(want string) {
		t.Helper()
		require.Eventually(t, func() bool { return strings.Contains(out.String(), want) }, 10*time.Second, 5*time.Millisecond, "want %q in %q", want, out.String())
	}
	waitOut("podvm$ ")
	_, _ = io.WriteString(inW, "stty size\n")
	waitOut("30 100")
	require.NoError(t, p.Resize(40, 120))
	_, _ = io.WriteString(inW, "stty size\n")
	waitOut("40 120")
	marker := strconv.Itoa(1_000_000 + int(time.Now().UnixNano()%8_000_000))
	_, _ = io.WriteString(inW, "/bin/busybox sleep "+marker+"\n")
	require.Eventually(t, func() bool { return len(alive(marker)) > 0 }, 10*time.Second, 5*time.Millisecond)
	time.Sleep(50 * time.Millisecond)  // the shell gives it the terminal
	_, _ = io.WriteString(inW, "\x03") // ^C
	require.Eventually(t, func() bool { return len(alive(marker)) == 0 }, 10*time.Second, 5*time.Millisecond, "^C left the job running")
	_, _ = io.WriteString(inW, "echo after-$?\n")
	waitOut("after-130")
	_, _ = io.WriteString(inW, "exit 5\n")
	ex, err := p.Wait(ctx)
	require.NoError(t, err)
	assert.Equal(t, 5, ex.Code)
	assert.Contains(t, out.String(), "\r\n", "the terminal's line discipline at work")
}
