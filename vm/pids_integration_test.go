package vm_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/agent"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
)

// fillPids holds every free pid of the sandbox until its stdin ends: a
// subshell forks sleeps until a fork fails (ash then exits, freeing its
// own pid), and the shell takes that last pid with one more sleep. It
// first waits a little for the agent's spare shim, started as this run
// took the idle one, to be up. Once full it forks no more: echo and read
// are builtins.
const fillPids = `sleep 0.5
(while :; do sleep 1000 & done) 2>/dev/null
sleep 1000 &
echo full
read x`

// At a full pids limit, what the agent and its shims do needs no new
// thread (the Go runtime dies when it cannot make one it wants): while a
// run holds every pid, concurrent Runs that cannot start, runs that end
// or are killed, and file calls each return a result or an error of
// their own, never a lost run or a lost agent; once the pids are free
// again the sandbox runs commands as before.
func TestFullPidsLimitSparesTheAgent(t *testing.T) {
	env := podmantest.Need(t)
	if env.PidsUnenforced {
		t.Skip("the service enforces no pids limit")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v := newAPI(ctx, t, env, vm.Config{Pids: 96})
	// died: an error that says the agent or a shim died.
	died := func(err error) bool {
		return errors.Is(err, agent.ErrLost) || errors.Is(err, vm.ErrUnavailable) ||
			errors.Is(err, vm.ErrContainerNotRunning) || errors.Is(err, vm.ErrNoSuchContainer)
	}
	for round := range 8 {
		var errs sync.Map // what → error, of every call made at the limit
		var wg sync.WaitGroup
		call := func(what string, f func() error) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs.Store(what, f())
			}()
		}
		// Runs blocked in their shims before the sandbox fills: at the
		// limit two end and one is killed, and each must be reported.
		var ends []*io.PipeWriter
		kctx, kill := context.WithCancel(ctx)
		for i := range 3 {
			pr, pw := io.Pipe()
			rctx := ctx
			if i == 0 {
				rctx = kctx
			} else {
				ends = append(ends, pw)
			}
			up := &signalWriter{want: "up\n", seen: make(chan struct{})}
			call(fmt.Sprintf("blocked run %d", i), func() error {
				_, err := v.Run(rctx, exec.Command{Name: "sh", Args: []string{"-c", "echo up; read x"}, Stdin: pr, Stdout: up})
				return err
			})
			select {
			case <-up.seen:
			case <-ctx.Done():
				t.Fatalf("round %d: blocked run %d did not start", round, i)
			}
		}
		fillIn, fillW := io.Pipe()
		full := &signalWriter{want: "full\n", seen: make(chan struct{})}
		filled := make(chan error, 1)
		go func() {
			_, err := v.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", fillPids}, Stdin: fillIn, Stdout: full})
			filled <- err
		}()
		select {
		case <-full.seen:
		case err := <-filled:
			t.Fatalf("round %d: the run filling the pids ended before they were full: %v", round, err)
		case <-ctx.Done():
			t.Fatalf("round %d: the pids never filled", round)
		}
		// At the limit: the blocked runs end or are killed, new Runs and
		// file calls come in, all at once.
		kill()
		for _, w := range ends {
			w.Close()
		}
		for i := range 8 {
			call(fmt.Sprintf("run %d", i), func() error {
				_, err := v.Run(ctx, exec.Command{Name: "echo", Args: []string{"hi"}})
				return err
			})
		}
		call("WriteFile", func() error { return vm.WriteFile(ctx, v, "/tmp/f", []byte("x"), 0o644) })
		call("ReadFile", func() error { _, err := vm.ReadFile(ctx, v, "/etc/passwd", 1<<20); return err })
		call("ReadDir", func() error { _, err := vm.ReadDir(ctx, v, "/etc"); return err })
		wg.Wait()
		var lost []string
		refused := 0
		errs.Range(func(k, e any) bool {
			err, _ := e.(error)
			t.Logf("round %d: %s: %v", round, k, err)
			if died(err) {
				lost = append(lost, fmt.Sprintf("%s: %v", k, err))
			}
			if err != nil && strings.Contains(err.Error(), "resource temporarily unavailable") {
				refused++
			}
			return true
		})
		// The filling run ends with its stdin; its leftovers are killed.
		fillW.Close()
		if err := <-filled; died(err) {
			lost = append(lost, fmt.Sprintf("the filling run: %v", err))
		}
		require.Empty(t, lost, "round %d: calls at the full pids limit lost their shim or the agent", round)
		require.NotZero(t, refused, "round %d: no call was refused a pid: the limit was not reached", round)
		res, err := v.Run(ctx, exec.Command{Name: "echo", Args: []string{"alive"}})
		require.NoError(t, err, "round %d: after the pids are freed", round)
		require.Equal(t, "alive\n", res.Stdout)
	}
}

// signalWriter closes seen once what it was written contains want.
type signalWriter struct {
	want string
	seen chan struct{}
	mu   sync.Mutex
	buf  strings.Builder
	once sync.Once
}

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}
