package vmtest

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// serviceCases check that a service in the sandbox is reached from the
// caller's process through the agent, with the sandbox's default
// Network "none": on a path without the agent, Dial fails with
// vm.ErrNotSupported and the cases skip.
func serviceCases() []testCase {
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
				if c, err := net.DialTimeout("tcp", f.Addr().String(), 5*time.Second); err == nil {
					c.Close()
					t.Error("the forward still listens after Close")
				}
				return []observation{outcome("forward", "served")}
			}},
		{Name: "service/limit", Promise: "a sandbox holds vm.MaxConnections connections; one more is refused with ErrLimit until one ends",
			Deadline: 2 * time.Minute,
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				addr := httpd(ctx, t, v, "limit")
				var conns []net.Conn
				defer func() {
					for _, c := range conns {
						c.Close()
					}
				}()
				for range vm.MaxConnections {
					c, err := vm.Dial(ctx, v, "tcp", addr)
					if err != nil {
						t.Fatalf("connection %d: %v", len(conns), err)
					}
					conns = append(conns, c)
				}
				_, past := vm.Dial(ctx, v, "tcp", addr)
				if !errors.Is(past, vm.ErrLimit) {
					t.Fatalf("a dial past the limit: %v; want ErrLimit", past)
				}
				conns[0].Close()
				deadline := time.Now().Add(10 * time.Second)
				for {
					c, err := vm.Dial(ctx, v, "tcp", addr)
					if err == nil {
						conns[0] = c
						break
					}
					if !errors.Is(err, vm.ErrLimit) || time.Now().After(deadline) {
						t.Fatalf("a dial after one closed: %v", err)
					}
					time.Sleep(10 * time.Millisecond) // the close reaches the agent and back
				}
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
		{Name: "service/removed", Promise: "Remove closes the sandbox's connections and forwards",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				addr := httpd(ctx, t, v, "removed")
				c, err := vm.Dial(ctx, v, "tcp", addr)
				if err != nil {
					t.Fatalf("Dial: %v", err)
				}
				defer c.Close()
				f, err := vm.Forward(ctx, v, "tcp", addr)
				if err != nil {
					t.Fatalf("Forward: %v", err)
				}
				if err := v.Remove(ctx); err != nil {
					t.Fatalf("Remove: %v", err)
				}
				_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
				if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
					t.Errorf("a read on a connection of the removed sandbox: %v; want EOF", err)
				}
				if l, err := net.DialTimeout("tcp", f.Addr().String(), 5*time.Second); err == nil {
					l.Close()
					t.Error("the forward still listens after Remove")
				}
				_, err = vm.Dial(ctx, v, "tcp", addr)
				if !errors.Is(err, vm.ErrRemoved) {
					t.Errorf("Dial after Remove: %v; want ErrRemoved", err)
				}
				return []observation{observe("after remove", nil, err)}
			}},
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
