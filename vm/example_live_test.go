package vm_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// Hold a process: feed its stdin a piece at a time, read its output as
// it comes (a reader that left can come back from any offset the buffer
// still holds), signal it, and wait for it as for a Run.
func ExampleStart() {
	ctx := context.Background()
	box, err := vm.New(ctx, vm.Config{Image: "localhost/podvm-test:latest"})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := box.Create(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer box.Remove(context.Background())

	p, err := vm.Start(ctx, box, exec.Command{Name: "sh", Args: []string{"-c", "while read -r l; do echo got $l; done"}})
	if err != nil {
		fmt.Println(err) // the start errors of Run: exec.ErrNotFound, say
		return
	}
	io.WriteString(p.Stdin(), "one\n")
	line, _ := bufio.NewReader(p.Stdout().Reader(0)).ReadString('\n')
	fmt.Print(line) // got one
	p.Signal(syscall.SIGTERM)
	res, err := p.Wait(ctx)
	fmt.Println(res.ExitCode, err) // 143 <nil>
}

// Reach a server in a sandbox with no network: a forward gives clients
// that take an address (a DSN, a browser) a port on the caller's
// loopback; the connections go through podvm's agent.
func ExampleForward() {
	ctx := context.Background()
	box, err := vm.New(ctx, vm.Config{Image: "docker.io/library/postgres:17"}) // Network "none"
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := box.Create(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer box.Remove(context.Background())
	srv, err := vm.Start(ctx, box, exec.Command{Name: "docker-entrypoint.sh", Args: []string{"postgres"},
		Env: []string{"POSTGRES_PASSWORD=test"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Kill()
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := vm.WaitListening(wait, box, "tcp", "127.0.0.1:5432"); err != nil {
		fmt.Println(err)
		return
	}
	fwd, err := vm.Forward(ctx, box, "tcp", "127.0.0.1:5432", vm.WithWarmConnection())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer fwd.Close() // Remove would close it too
	dsn := "postgres://postgres:test@" + fwd.Addr().String() + "/postgres?sslmode=disable"
	db, err := sql.Open("pgx", dsn) // any driver, registered by its import
	if err == nil {
		defer db.Close()
	}
}

// Dial, for a client in the caller's process: an http.Transport's dial
// hook, say, so that nothing listens on the caller's side at all.
func ExampleDial() {
	ctx := context.Background()
	box, err := vm.New(ctx, vm.Config{Image: "localhost/podvm-test:latest"})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := box.Create(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer box.Remove(context.Background())
	if _, err := vm.Start(ctx, box, exec.Command{Name: "httpd", Args: []string{"-f", "-p", "127.0.0.1:8080"}}); err != nil {
		fmt.Println(err)
		return
	}
	if err := vm.WaitListening(ctx, box, "tcp", "127.0.0.1:8080"); err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, address string) (net.Conn, error) {
			return vm.Dial(ctx, box, network, address)
		},
	}}
	resp, err := client.Get("http://127.0.0.1:8080/")
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println(resp.Status)
}
