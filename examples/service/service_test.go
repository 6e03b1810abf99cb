// Package service is the integration-test case of podvm's live
// sandboxes: a test that runs the service it needs (here busybox's httpd,
// standing in for a database or an API) in a sandbox with no network,
// waits until it listens, and talks to it from the test's own process,
// through an http.Client whose dials the sandbox's agent makes, and
// through a forward on loopback for clients that take an address.
//
// Run it with the project's Podman service up:
//
//	eval "$(scripts/podman-up.sh)"
//	go test ./examples/service/
package service_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/vmtest"
)

func image() string {
	if i := os.Getenv("PODVM_TEST_IMAGE"); i != "" {
		return i
	}
	return "localhost/podvm-test:latest"
}

func TestServiceInASandbox(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// The default Network is "none": the sandbox reaches nothing, and
	// nothing but this process, through the agent, reaches it.
	box := vmtest.Sandbox(t, vm.Config{Image: image()})

	if _, err := box.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", "mkdir -p /srv && echo pong >/srv/ping"}}); err != nil {
		t.Fatal(err)
	}
	srv, err := vm.Start(ctx, box, exec.Command{Name: "httpd", Args: []string{"-f", "-p", "127.0.0.1:8080", "-h", "/srv"}})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Kill()
	if err := vm.WaitListening(ctx, box, "tcp", "127.0.0.1:8080"); err != nil {
		t.Fatal(err)
	}

	// In-process: the sandbox is the transport's dialer.
	client := &http.Client{Transport: &http.Transport{DialContext: box.(vm.ServiceDialer).DialContext}}
	if got := get(ctx, t, client, "http://127.0.0.1:8080/ping"); got != "pong\n" {
		t.Errorf("in-process: %q", got)
	}

	// For another process or a library that takes an address: a forward.
	fwd, err := vm.Forward(ctx, box, "tcp", "127.0.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	defer fwd.Close()
	if got := get(ctx, t, http.DefaultClient, "http://"+fwd.Addr().String()+"/ping"); got != "pong\n" {
		t.Errorf("forwarded: %q", got)
	}
}

func get(ctx context.Context, t *testing.T, c *http.Client, url string) string {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
