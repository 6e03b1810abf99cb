package vm_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// Compile untrusted code with no network, a minute and 1 MiB of output.
func ExampleNew() {
	ctx := context.Background()
	box, err := vm.New(ctx, vm.Config{
		Image:   "localhost/podvm-test:latest",
		Mounts:  []vm.Mount{{Source: "/srv/seed", Target: "/src", ReadOnly: true}},
		Workdir: "/src",
	}, vm.WithLogger(slog.Default()))
	if err != nil {
		fmt.Println(err) // errors.Is(err, vm.ErrUnavailable): no Podman; it lists what it tried
		return
	}
	if err := box.Create(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer box.Remove(context.Background())

	res, err := box.Run(ctx, exec.Command{Name: "make", Timeout: time.Minute, MaxOutputBytes: 1 << 20})
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		fmt.Println("timed out; everything it started in the sandbox was killed")
	case err != nil:
		fmt.Println(err)
	case res.ExitCode != 0:
		fmt.Print(res.StderrTail(20))
	}
}

// Remove what crashed runs left behind, and anything older than a day.
func ExampleReap() {
	removed, err := vm.Reap(context.Background(), 24*time.Hour)
	fmt.Println(len(removed), err)
}

// The CLI backend through any executor: here a policy that allows podman
// only, so the library cannot be made to run anything else on the host.
func ExampleNewCLIVM() {
	host := exec.Restrict(exec.NewCommandExecutor(), exec.Policy{Grants: []string{"exec:podman"}})
	box, err := vm.NewCLIVM(vm.Config{Image: "localhost/podvm-test:latest"}, host, vm.WithURL("unix:///run/podman/podman.sock"))
	fmt.Println(box != nil, err)
	// Output: true <nil>
}
