package vmtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/testkit"
	"github.com/podvm/podvm/vm"
)

// serviceCases check that a service in the sandbox is reached from the
// caller's process through the agent, with the sandbox's default
// Network "none". A path without the agent refuses them (live/refused
// checks that), so the suite skips them there.
func serviceCases(h Harness) []testCase {
	return []testCase{
		{Name: "service/dial", Promise: "a server in a sandbox with no network answers the caller through Dial, once WaitListening says it listens",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				addr := httpd(ctx, t, v, "dial")
				dial := func(ctx context.Context, network, address string) (net.Conn, error) {
					return vm.Dial(ctx, v, network, address)
				}
				client := &http.Client{Transport: &http.Transport{DialContext: dial}}
				body := get(ctx, t, client, "http://"+addr+"/index.html")
				if body != "served dial\n" {
					t.Errorf("got %q; want the page", body)
				}
				_, refused := vm.Dial(ctx, v, "tcp", "127.0.0.1:1")
				if !errors.Is(refused, syscall.ECONNREFUSED) {
					t.Errorf("dial of a closed port: %v; want ECONNREFUSED", refused)
				}
				if _, err := vm.Dial(ctx, v, "udp", addr); err == nil {
					t.Error("a udp dial was accepted")
				}
				return []observation{outcome("page", body), outcome("refused", errors.Is(refused, syscall.ECONNREFUSED))}
			}},
		{Name: "service/forward", Promise: "a forward on the caller's loopback carries each connection to the sandbox's server until it is closed",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				addr := httpd(ctx, t, v, "forward")
				f, err := vm.Forward(ctx, v, "tcp", addr)
				if err != nil {
					t.Fatalf("Forward: %v", err)
				}
				defer f.Close()
				client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
				for i := range 3 {
					if body := get(ctx, t, client, "http://"+f.Addr().String()+"/index.html"); body != "served forward\n" {
						t.Errorf("request %d: %q; want the page", i, body)
					}
				}
				if err := f.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				if !testkit.Freed(f.Addr().String(), time.Second) { // closed by then; a second against a brief bind by someone else
					t.Error("the forward still listens after Close")
				}
				return []observation{outcome("forward", "served")}
			}},
		{Name: "service/limit", Promise: "of 1,000 dials at once, a sandbox holds vm.MaxConnections connections and refuses the rest with ErrLimit, saying so, until one ends",
			Deadline: 2 * time.Minute,
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				// A Go server, whose listen backlog takes every connection
				// at once (busybox's servers listen with a backlog of a
				// few, and a loaded machine's dropped SYNs outwait a dial).
				const sock = "/tmp/limit.sock"
				copyHelper(ctx, t, v, unixEchoBinary(t), "/tmp/unixecho")
				start(ctx, t, v, exec.Command{Name: "/tmp/unixecho", Args: []string{sock}})
				waitListening(ctx, t, v, "unix", sock)
				var conns []net.Conn
				defer func() {
					for _, c := range conns {
						c.Close()
					}
				}()
				var mu sync.Mutex
				var past error // one refusal
				var wg sync.WaitGroup
				for range 1000 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						c, err := vm.Dial(ctx, v, "unix", sock)
						mu.Lock()
						defer mu.Unlock()
						switch {
						case err == nil:
							conns = append(conns, c)
						case errors.Is(err, vm.ErrLimit) && strings.Contains(err.Error(), "vm.MaxConnections"):
							past = err
						default:
							t.Errorf("a dial: %v; want a connection, or ErrLimit naming vm.MaxConnections", err)
						}
					}()
				}
				wg.Wait()
				// The connection waitListening made holds its place until
				// its close has reached the agent and come back: on a
				// loaded machine, after the burst. Then one more fits.
				if len(conns) < vm.MaxConnections-1 || len(conns) > vm.MaxConnections || past == nil {
					t.Fatalf("of 1000 dials at once, %d connected (want vm.MaxConnections, %d), the last refusal: %v", len(conns), vm.MaxConnections, past)
				}
				redial := func(what string) net.Conn {
					deadline := time.Now().Add(10 * time.Second)
					for {
						c, err := vm.Dial(ctx, v, "unix", sock)
						if err == nil {
							return c
						}
						if !errors.Is(err, vm.ErrLimit) || time.Now().After(deadline) {
							t.Fatalf("a dial %s: %v", what, err)
						}
						time.Sleep(10 * time.Millisecond) // the close reaches the agent and back
					}
				}
				if len(conns) < vm.MaxConnections {
					conns = append(conns, redial("once waitListening's connection closed"))
				}
				if _, err := vm.Dial(ctx, v, "unix", sock); !errors.Is(err, vm.ErrLimit) {
					t.Fatalf("a dial with vm.MaxConnections open: %v; want ErrLimit", err)
				}
				conns[0].Close()
				conns[0] = redial("after one closed")
				return []observation{observe("past the limit", nil, past)}
			}},
		{Name: "service/silent", Promise: "a service that accepts and never answers holds a read only until its deadline; Close returns at once",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				const addr = "127.0.0.1:18081"
				// nc accepts one connection and, its stdin never ending,
				// says nothing.
				srv := start(ctx, t, v, exec.Command{Name: "nc", Args: []string{"-l", "-p", "18081"}})
				defer srv.Kill()
				wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				d, ok := v.(vm.ServiceDialer)
				if !ok {
					t.Fatalf("%T started a process but dials nothing", v)
				}
				c, err := d.DialListening(wctx, "tcp", addr) // one dial: nc takes one connection
				if err != nil {
					t.Fatalf("DialListening: %v", err)
				}
				_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
				began := time.Now()
				_, err = c.Read(make([]byte, 1))
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Errorf("a read from a silent service: %v; want the deadline's error", err)
				}
				if d := time.Since(began); d > 10*time.Second {
					t.Errorf("the read returned after %v", d)
				}
				began = time.Now()
				if err := c.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				if d := time.Since(began); d > 5*time.Second {
					t.Errorf("Close took %v", d)
				}
				return []observation{outcome("silent", "deadline")}
			}},
		{Name: "service/removed", Promise: "Remove closes the sandbox's connections, its forwards and the connections they carry",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				addr := httpd(ctx, t, v, "removed")
				c, f := dialAndForward(ctx, t, v, addr)
				carried := carriedConn(ctx, t, v)
				if err := v.Remove(ctx); err != nil {
					t.Fatalf("Remove: %v", err)
				}
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				// EOF when the service's end closed first, as its process
				// died; else the channel's end, named.
				if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, vm.ErrRemoved) {
					t.Errorf("a read on a connection of the removed sandbox: %v; want EOF or ErrRemoved", err)
				}
				endsWithin(t, carried, 10*time.Second, "a forward's client connection, after Remove")
				if !testkit.Freed(f.Addr().String(), time.Second) {
					t.Error("the forward still listens after Remove")
				}
				_, err := vm.Dial(ctx, v, "tcp", addr)
				if !errors.Is(err, vm.ErrRemoved) {
					t.Errorf("Dial after Remove: %v; want ErrRemoved", err)
				}
				return []observation{observe("after remove", nil, err)}
			}},
		{Name: "service/reset", Promise: "a connection the service resets reads as a reset, not an end, through Dial and through a forward; one it closes reads as EOF",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				const addr = "127.0.0.1:18086"
				// The service reads the request's first line alone (sh reads
				// a socket a byte at a time), answers and exits: a socket
				// closed with bytes unread is reset.
				start(ctx, t, v, exec.Command{Name: "nc", Args: []string{"-ll", "-p", "18086", "-e", "sh", "-c", "read -r l; sleep 0.2; echo partial"}})
				waitListening(ctx, t, v, "tcp", addr)
				dialed, err := vm.Dial(ctx, v, "tcp", addr)
				if err != nil {
					t.Fatalf("Dial: %v", err)
				}
				defer dialed.Close()
				var obs []observation
				for _, c := range []struct {
					via  string
					conn net.Conn
				}{{"dialed", dialed}, {"forwarded", viaForward(ctx, t, v, "tcp", addr)}} {
					if _, err := io.WriteString(c.conn, "read\nnever read\n"); err != nil {
						t.Fatalf("%s: writing the request: %v", c.via, err)
					}
					_ = c.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
					got, err := io.ReadAll(c.conn)
					if !errors.Is(err, syscall.ECONNRESET) {
						t.Errorf("%s: read %q, then %v; want a reset (ECONNRESET), never EOF", c.via, got, err)
					}
					obs = append(obs, outcome(c.via, "reset: ", errors.Is(err, syscall.ECONNRESET)))
				}
				// The same service, its request read first: an orderly end.
				dialed, err = vm.Dial(ctx, v, "tcp", addr)
				if err != nil {
					t.Fatalf("Dial: %v", err)
				}
				defer dialed.Close()
				if got := halfClose(t, dialed, "read\n"); got != "partial\n" {
					t.Errorf("a connection the service closed: %q; want partial", got)
				}
				// A forward to where nothing listens made no connection:
				// its client is closed, not reset.
				refused := viaForward(ctx, t, v, "tcp", "127.0.0.1:1")
				_ = refused.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := refused.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
					t.Errorf("a forward's client where nothing listens read %v; want EOF", err)
				}
				return obs
			}},
		{Name: "service/half-close", Promise: "a client's half-close reaches the service, through Dial and through a forward, and its answer still comes",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				const addr = "127.0.0.1:18082"
				// Each connection's answer comes only after its request's
				// EOF: without a half-close there is none.
				start(ctx, t, v, exec.Command{Name: "nc", Args: []string{"-ll", "-p", "18082", "-e", "sh", "-c", `echo "got $(wc -c | tr -d ' ') bytes"`}})
				waitListening(ctx, t, v, "tcp", addr)
				dialed, forwarded := servedBoth(ctx, t, v, "tcp", addr, "request\n", "a longer request\n")
				if dialed != "got 8 bytes\n" || forwarded != "got 17 bytes\n" {
					t.Errorf("answers %q and %q; want got 8 bytes and got 17 bytes", dialed, forwarded)
				}
				return []observation{outcome("dialed", dialed), outcome("forwarded", forwarded)}
			}},
		{Name: "service/unaccepted", Promise: "a service that never accepts holds a dial only as long as its context; a forward's Close ends its dial in flight; nothing stays connected",
			Deadline: 2 * time.Minute,
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				const port = "18083"
				p := start(ctx, t, v, exec.Command{Name: "nc", Args: []string{"-l", "-p", port}})
				waitSockets(ctx, t, v, "nc to listen", func(ss string) bool { return strings.Contains(ss, ":"+port+" ") })
				// Stopped, it never accepts: its backlog fills, then the
				// kernel leaves further connects unanswered.
				if err := p.Signal(syscall.SIGSTOP); err != nil {
					t.Fatalf("stopping nc: %v", err)
				}
				// Signal returns once the signal is sent: a dial before nc
				// stopped would be its one connection, and its listener gone.
				for deadline := time.Now().Add(30 * time.Second); ; {
					if runOK(ctx, v, "grep", "-q", "^State:.T", "/proc/"+strconv.Itoa(p.PID())+"/status") == nil {
						break
					}
					if time.Now().After(deadline) {
						t.Fatal("nc did not stop within 30 s")
					}
					time.Sleep(20 * time.Millisecond)
				}
				var conns []net.Conn
				defer func() {
					for _, c := range conns {
						c.Close()
					}
				}()
				var past error
				for range 16 {
					dctx, cancel := context.WithTimeout(ctx, time.Second)
					c, err := vm.Dial(dctx, v, "tcp", "127.0.0.1:"+port)
					cancel()
					if err != nil {
						past = err
						break
					}
					conns = append(conns, c)
				}
				if !errors.Is(past, context.DeadlineExceeded) {
					t.Fatalf("dials past a full backlog: %v; want the context's deadline", past)
				}
				f, err := vm.Forward(ctx, v, "tcp", "127.0.0.1:"+port)
				if err != nil {
					t.Fatalf("Forward: %v", err)
				}
				fc, err := net.DialTimeout("tcp", f.Addr().String(), 10*time.Second)
				if err != nil {
					t.Fatalf("connecting to the forward: %v", err)
				}
				defer fc.Close()
				waitSockets(ctx, t, v, "the forward's dial to be in flight", func(ss string) bool {
					for _, line := range strings.Split(ss, "\n") {
						if strings.Contains(line, ":"+port+" ") && strings.Contains(line, "SYN_SENT") {
							return true
						}
					}
					return false
				})
				began := time.Now()
				if err := f.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
				if d := time.Since(began); d > 10*time.Second {
					t.Errorf("the forward's Close took %v with a dial in flight", d)
				}
				_ = fc.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := fc.Read(make([]byte, 1)); errors.Is(err, os.ErrDeadlineExceeded) {
					t.Error("the forward's client connection is still open after Close")
				}
				for _, c := range conns {
					c.Close()
				}
				// The sandbox's ends of the connections that were made, and
				// of those still connecting, are gone.
				waitSockets(ctx, t, v, "no connection to the service", func(ss string) bool {
					for _, line := range strings.Split(ss, "\n") {
						f := strings.Fields(line)
						if len(f) >= 6 && strings.HasSuffix(f[4], ":"+port) && (f[5] == "ESTABLISHED" || f[5] == "SYN_SENT") {
							return false
						}
					}
					return true
				})
				return []observation{observe("past the backlog", nil, past)}
			}},
		{Name: "service/client-gone", Promise: "a forward's client that leaves, even in an orderly way, ends the service's side of its connection when the service never stops sending",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				const addr = "127.0.0.1:18085"
				// A tick every 100 ms: the client closes with nothing
				// unread, an orderly end that reads as its EOF, not a reset.
				start(ctx, t, v, exec.Command{Name: "nc", Args: []string{"-ll", "-p", "18085", "-e", "sh", "-c", "while echo tick; do sleep 0.1; done"}})
				waitListening(ctx, t, v, "tcp", addr)
				c := viaForward(ctx, t, v, "tcp", addr)
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "tick\n" {
					t.Fatalf("reading the stream: %q, %v", line, err)
				}
				c.Close()
				waitSockets(ctx, t, v, "the service's connection to end", func(ss string) bool {
					for _, line := range strings.Split(ss, "\n") {
						if strings.Contains(line, ":18085 ") && strings.Contains(line, "ESTABLISHED") {
							return false
						}
					}
					return true
				})
				return []observation{outcome("ended", true)}
			}},
		{Name: "service/unix", Promise: "a service on a unix socket is reached through Dial and a forward, half-close included; a missing socket is ENOENT",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				const sock = "/tmp/upper.sock"
				copyHelper(ctx, t, v, unixEchoBinary(t), "/tmp/unixecho")
				start(ctx, t, v, exec.Command{Name: "/tmp/unixecho", Args: []string{sock}})
				waitListening(ctx, t, v, "unix", sock)
				dialed, forwarded := servedBoth(ctx, t, v, "unix", sock, "over a unix socket\n", "and forwarded\n")
				if dialed != "OVER A UNIX SOCKET\n" || forwarded != "AND FORWARDED\n" {
					t.Errorf("answers %q and %q; want them upper-cased", dialed, forwarded)
				}
				_, missing := vm.Dial(ctx, v, "unix", "/tmp/no-such.sock")
				if !errors.Is(missing, syscall.ENOENT) {
					t.Errorf("a dial of a missing socket: %v; want ENOENT", missing)
				}
				return []observation{outcome("dialed", dialed), outcome("forwarded", forwarded), outcome("missing", errors.Is(missing, syscall.ENOENT))}
			}},
		{Name: "service/warm-forward", Promise: "a forward WithWarmConnection has a connection made before its client; one the service closed meanwhile is not used",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				const addr = "127.0.0.1:18084"
				// Each connection's shell logs its pid, then greets with it.
				start(ctx, t, v, exec.Command{Name: "nc", Args: []string{"-ll", "-p", "18084", "-e", "sh", "-c", `echo $$ >>/tmp/conns; echo "hello from $$"; exec cat >/dev/null`}})
				waitListening(ctx, t, v, "tcp", addr) // its connection is logged too
				waitConns(ctx, t, v, 1)
				f, err := vm.Forward(ctx, v, "tcp", addr, vm.WithWarmConnection())
				if err != nil {
					t.Fatalf("Forward: %v", err)
				}
				defer f.Close()
				// The warm connection is made with no client.
				warm := waitConns(ctx, t, v, 2)[1]
				if err := runOK(ctx, v, "kill", warm); err != nil {
					t.Fatalf("ending the warm connection's shell: %v", err)
				}
				// Closed on both ends: the agent's, which it closes just
				// before it says so, is in neither of these states.
				waitSockets(ctx, t, v, "the warm connection to close", func(ss string) bool {
					for _, line := range strings.Split(ss, "\n") {
						if strings.Contains(line, ":18084 ") && (strings.Contains(line, "ESTABLISHED") || strings.Contains(line, "CLOSE_WAIT")) {
							return false
						}
					}
					return true
				})
				// Its word crosses the channel.
				time.Sleep(200 * time.Millisecond)
				greeting := greet(t, f.Addr().String())
				if greeting == "hello from "+warm+"\n" {
					t.Errorf("the client was greeted by the warm connection the service had closed (%s)", warm)
				}
				// Once that client has gone, the next connection is made
				// ahead of the next client, which gets it.
				conns := waitConns(ctx, t, v, 4)
				if greeting != "hello from "+conns[2]+"\n" {
					t.Errorf("the client was greeted with %q; want a fresh connection's greeting (%s)", greeting, conns[2])
				}
				if next := greet(t, f.Addr().String()); next != "hello from "+conns[3]+"\n" {
					t.Errorf("the next client was greeted with %q; want the warm connection's (%s)", next, conns[3])
				}
				return []observation{outcome("fresh", strings.HasPrefix(greeting, "hello from "))}
			}},
		{Name: "service/container-gone", Promise: "when the container goes away behind the VM's back with processes, connections and forwards live, its processes end with an error, its connections end and its forwards close with the connections they carry, promptly",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				addr := httpd(ctx, t, v, "gone")
				c, f := dialAndForward(ctx, t, v, addr)
				carried := carriedConn(ctx, t, v)
				held := start(ctx, t, v, exec.Command{Name: "sleep", Args: []string{"1000"}})
				if err := h.RemoveContainer(ctx, v.ID()); err != nil {
					t.Fatalf("removing the container: %v", err)
				}
				select {
				case <-held.Done():
					if _, err := held.Wait(ctx); err == nil {
						t.Error("a held process of the gone container: Wait gave no error")
					}
				case <-time.After(30 * time.Second):
					t.Error("a held process of the gone container still runs 30 s later")
				}
				endsWithin(t, carried, 30*time.Second, "a forward's client connection, after its container went away")
				_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
				// EOF when the service's end closed first; else what a Run
				// says of a gone container.
				_, err := c.Read(make([]byte, 1))
				switch {
				case errors.Is(err, os.ErrDeadlineExceeded):
					t.Error("a connection of the gone container still reads 30 s later")
				case !errors.Is(err, io.EOF) && !errors.Is(err, vm.ErrNoSuchContainer) && !errors.Is(err, vm.ErrContainerNotRunning) && !errors.Is(err, vm.ErrUnavailable):
					t.Errorf("a connection of the gone container read %v; want EOF or what a Run says (ErrNoSuchContainer, ErrContainerNotRunning, ErrUnavailable)", err)
				}
				if !testkit.Freed(f.Addr().String(), 30*time.Second) {
					t.Fatal("the forward still listens 30 s after its container went away")
				}
				began := time.Now()
				if _, err = vm.Dial(ctx, v, "tcp", addr); err == nil {
					t.Error("Dial into a gone container: no error")
				}
				if d := time.Since(began); d > 10*time.Second {
					t.Errorf("Dial into a gone container took %v", d)
				}
				return nil
			}},
	}
}

// carriedConn starts an echo service in v (`nc -e cat` on loopback),
// forwards it, and returns a client connection of the forward that has
// carried a line both ways and stays open; the test's cleanup closes it.
func carriedConn(ctx context.Context, t *testing.T, v vm.VM) net.Conn {
	t.Helper()
	const addr = "127.0.0.1:18089"
	start(ctx, t, v, exec.Command{Name: "nc", Args: []string{"-ll", "-p", "18089", "-e", "cat"}})
	waitListening(ctx, t, v, "tcp", addr)
	c := viaForward(ctx, t, v, "tcp", addr)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "alive\n"); err != nil {
		t.Fatalf("writing to the forward: %v", err)
	}
	if line, err := bufio.NewReader(c).ReadString('\n'); line != "alive\n" {
		t.Fatalf("the forward's echo: %q, %v", line, err)
	}
	_ = c.SetDeadline(time.Time{})
	return c
}

// endsWithin fails t unless a read on c ends (EOF, or an error) within d:
// the connection was closed, not left open.
func endsWithin(t *testing.T, c net.Conn, d time.Duration, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	if _, err := c.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("%s: still open %v later (read: %v)", what, d, err)
	}
}

// httpd starts busybox's httpd in v on loopback, serving a page that
// says "served " and what, and returns its address once it listens.
func httpd(ctx context.Context, t *testing.T, v vm.VM, what string) string {
	t.Helper()
	const addr = "127.0.0.1:18080"
	res, err := v.Run(ctx, sh(`mkdir -p /tmp/www && echo "served $1" >/tmp/www/index.html`, what))
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("writing the page: %+v, %v", res, err)
	}
	p, err := vm.Start(ctx, v, exec.Command{Name: "httpd", Args: []string{"-f", "-p", addr, "-h", "/tmp/www"}})
	skipIfNotSupported(t, err)
	if err != nil {
		t.Fatalf("starting httpd: %v", err)
	}
	t.Cleanup(func() { _ = p.Kill() })
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := vm.WaitListening(wctx, v, "tcp", addr); err != nil {
		_ = p.Kill()
		res, werr := p.Wait(ctx)
		t.Fatalf("httpd never listened: %v (it reported %+v, %v)", err, res, werr)
	}
	return addr
}

// get fetches url with client and returns its body.
func get(ctx context.Context, t *testing.T, client *http.Client, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %q, %v", url, resp.Status, b, err)
	}
	return string(b)
}

// waitListening waits, 30 s at most, until something listens at address
// in v.
func waitListening(ctx context.Context, t *testing.T, v vm.VM, network, address string) {
	t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := vm.WaitListening(wctx, v, network, address); err != nil {
		skipIfNotSupported(t, err)
		t.Fatalf("nothing listened at %s %s: %v", network, address, err)
	}
}

// halfClose writes request to c, half-closes it and returns the whole
// answer, 10 s at most.
func halfClose(t *testing.T, c net.Conn, request string) string {
	t.Helper()
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatalf("writing the request: %v", err)
	}
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		t.Fatalf("a %T has no CloseWrite", c)
	}
	if err := cw.CloseWrite(); err != nil {
		t.Fatalf("CloseWrite: %v", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading the answer after a half-close: %v (read %q)", err, b)
	}
	return string(b)
}

// greet connects to address, reads its first line and closes.
func greet(t *testing.T, address string) string {
	t.Helper()
	c, err := net.DialTimeout("tcp", address, 10*time.Second)
	if err != nil {
		t.Fatalf("connecting to %s: %v", address, err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the greeting of %s: %v (read %q)", address, err, line)
	}
	return line
}

// waitConns waits, 30 s at most, until /tmp/conns in v lists n
// connections' pids, and returns them.
func waitConns(ctx context.Context, t *testing.T, v vm.VM, n int) []string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := v.Run(ctx, exec.Command{Name: "cat", Args: []string{"/tmp/conns"}})
		if err == nil {
			if pids := strings.Fields(res.Stdout); len(pids) >= n {
				return pids
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 30 s for %d connections: %+v, %v", n, res, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitSockets waits, 30 s at most, for the sandbox's TCP sockets, as
// netstat -tan lists them, to satisfy ok.
func waitSockets(ctx context.Context, t *testing.T, v vm.VM, what string, ok func(sockets string) bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := v.Run(ctx, exec.Command{Name: "netstat", Args: []string{"-tan"}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("netstat: %+v, %v", res, err)
		}
		if ok(res.Stdout) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waited 30 s for %s:\n%s", what, res.Stdout)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runOK runs name with args in v and fails unless it exits 0.
func runOK(ctx context.Context, v vm.VM, name string, args ...string) error {
	res, err := v.Run(ctx, exec.Command{Name: name, Args: args})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("%s exited %d: %s", name, res.ExitCode, res.Stderr)
	}
	return err
}

// viaForward makes a forward to address in v and returns a client's
// connection through it; both are closed when the test ends.
func viaForward(ctx context.Context, t *testing.T, v vm.VM, network, address string) net.Conn {
	t.Helper()
	f, err := vm.Forward(ctx, v, network, address)
	if err != nil {
		t.Fatalf("Forward: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	c, err := net.DialTimeout("tcp", f.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatalf("connecting to the forward: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// servedBoth sends each request to the service at address in v, the
// first through Dial, the second through a forward, each followed by a
// half-close, and returns the answers.
func servedBoth(ctx context.Context, t *testing.T, v vm.VM, network, address, dialRequest, forwardRequest string) (dialed, forwarded string) {
	t.Helper()
	c, err := vm.Dial(ctx, v, network, address)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	defer c.Close()
	return halfClose(t, c, dialRequest), halfClose(t, viaForward(ctx, t, v, network, address), forwardRequest)
}

// dialAndForward returns a connection to the TCP service at address in
// v and a forward to it, both closed when the test ends.
func dialAndForward(ctx context.Context, t *testing.T, v vm.VM, address string) (net.Conn, *vm.Forwarder) {
	t.Helper()
	c, err := vm.Dial(ctx, v, "tcp", address)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	f, err := vm.Forward(ctx, v, "tcp", address)
	if err != nil {
		t.Fatalf("Forward: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return c, f
}
