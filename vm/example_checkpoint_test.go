package vm_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/podvm/podvm/vm"
)

// Ask, before anything is made, whether the sandbox's engine can
// checkpoint it; where it cannot, the error says why.
func ExampleCheckpointSupport() {
	ctx := context.Background()
	v, err := vm.New(ctx, vm.Config{Image: "localhost/podvm-test:latest"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer v.Remove(context.Background())
	switch err := vm.CheckpointSupport(ctx, v); {
	case errors.Is(err, vm.ErrNotSupported):
		fmt.Println("no checkpoints here:", err) // rootless Podman, no CRIU, Kubernetes…
	case err != nil:
		fmt.Println(err) // the service did not answer
	default:
		fmt.Println("this engine can checkpoint sandboxes like v")
	}
}

// Free a sandbox's memory while it waits, and bring it back as it was:
// its processes, their handles and its files.
func ExampleSuspend() {
	ctx := context.Background()
	v, err := vm.New(ctx, vm.Config{Image: "localhost/podvm-test:latest"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer v.Remove(context.Background())
	if err := v.Create(ctx); err != nil {
		fmt.Println(err)
		return
	}
	if err := vm.Suspend(ctx, v); err != nil {
		fmt.Println(err) // vm.ErrNotSupported, naming why, where it cannot
		return
	}
	// … later …
	if err := vm.Resume(ctx, v); err != nil {
		fmt.Println(err)
	}
}
