package vm_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/vmtest"
)

// Held processes, Dial connections and forwards, made and ended a
// hundred times each, then all live at once when the container is
// removed behind the VM's back, leave no goroutine and no file
// descriptor of this process behind (a forward's listener is one), once
// the VM is removed. Not parallel: it counts the process's goroutines
// and descriptors.
func TestLiveLeaksNothing(t *testing.T) {
	env := podmantest.Need(t)
	for name, h := range map[string]vmtest.Harness{"api": apiHarness(env, false), "cli": cliHarness(env, false)} {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			round := func(v vm.VM, f *vm.Forwarder) {
				p, err := vm.Start(ctx, v, exec.Command{Name: "echo", Args: []string{"held"}})
				require.NoError(t, err)
				res, err := p.Wait(ctx)
				require.NoError(t, err)
				require.Equal(t, "held\n", res.Stdout)
				c, err := vm.Dial(ctx, v, "tcp", "127.0.0.1:18090")
				require.NoError(t, err)
				echoed(t, c, "dialed")
				require.NoError(t, c.Close())
				c, err = net.Dial("tcp", f.Addr().String())
				require.NoError(t, err)
				echoed(t, c, "forwarded")
				require.NoError(t, c.Close())
			}
			// The echo service, started once per sandbox, and a forward to
			// it.
			serve := func(v vm.VM) {
				_, err := vm.Start(ctx, v, exec.Command{Name: "nc", Args: []string{"-ll", "-p", "18090", "-e", "cat"}})
				require.NoError(t, err)
				require.NoError(t, vm.WaitListening(ctx, v, "tcp", "127.0.0.1:18090"))
			}
			forward := func(v vm.VM) *vm.Forwarder {
				f, err := vm.Forward(ctx, v, "tcp", "127.0.0.1:18090")
				require.NoError(t, err)
				return f
			}
			// A sandbox made and used once, so that what the first of
			// its kind sets up for good is not counted.
			warm, err := h.NewVM(t, vm.Config{})
			require.NoError(t, err)
			t.Cleanup(func() { _ = warm.Remove(context.Background()) })
			require.NoError(t, warm.Create(ctx))
			serve(warm)
			round(warm, forward(warm))
			require.NoError(t, warm.Remove(ctx))

			fds, goroutines := openFDs(t), runtime.NumGoroutine()
			v, err := h.NewVM(t, vm.Config{})
			require.NoError(t, err)
			require.NoError(t, v.Create(ctx))
			defer v.Remove(context.Background())
			serve(v)
			f := forward(v)
			for range 100 {
				round(v, f)
			}
			require.NoError(t, f.Close())
			// Everything live at once, then the container goes.
			f = forward(v)
			held, err := vm.Start(ctx, v, exec.Command{Name: "sleep", Args: []string{"1000"}})
			require.NoError(t, err)
			dialed, err := vm.Dial(ctx, v, "tcp", "127.0.0.1:18090")
			require.NoError(t, err)
			echoed(t, dialed, "dialed")
			carried, err := net.Dial("tcp", f.Addr().String())
			require.NoError(t, err)
			echoed(t, carried, "carried")
			require.NoError(t, h.RemoveContainer(ctx, v.ID()))
			select {
			case <-held.Done():
			case <-time.After(30 * time.Second):
				t.Fatal("a held process still runs 30 s after its container went")
			}
			for _, c := range []net.Conn{dialed, carried} {
				require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
				_, err := c.Read(make([]byte, 1))
				assert.Error(t, err)
				assert.NotErrorIs(t, err, os.ErrDeadlineExceeded, "still open 30 s after its container went")
				c.Close()
			}
			require.NoError(t, f.Close())
			require.NoError(t, v.Remove(ctx))
			settle(t, func() bool { return runtime.NumGoroutine() <= goroutines+2 && openFDs(t) <= fds+2 },
				func() string {
					return fmt.Sprintf("goroutines %d -> %d, fds %d -> %d", goroutines, runtime.NumGoroutine(), fds, openFDs(t))
				})
		})
	}
}

// echoed writes line to c, an echo service's connection, and requires it
// back within 10 s.
func echoed(t *testing.T, c net.Conn, line string) {
	t.Helper()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err := io.WriteString(c, line+"\n")
	require.NoError(t, err)
	got, err := bufio.NewReader(c).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, line+"\n", got)
	require.NoError(t, c.SetDeadline(time.Time{}))
}
