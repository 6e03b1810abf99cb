package vm_test

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// Ask, before anything is made, whether the sandbox's engine can
// checkpoint it; where it cannot, the error says why.
func ExampleCheckpointSupport() {
	ctx := context.Background()
	v, err := vm.New(ctx, vm.Config{Image: "localhost/podvm-test:latest", Checkpointable: true})
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
	v, err := vm.New(ctx, vm.Config{Image: "localhost/podvm-test:latest", Checkpointable: true})
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

// Warm a process once, checkpoint the sandbox, and fork it: each copy is
// a sandbox of its own whose process goes on from the checkpoint, with
// what it had in memory.
func ExampleRestore() {
	ctx := context.Background()
	v, err := vm.New(ctx, vm.Config{Image: "localhost/podvm-test:latest", Checkpointable: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer v.Remove(context.Background())
	if err := v.Create(ctx); err != nil {
		fmt.Println(err)
		return
	}
	// A process that takes long to be useful: here, a counter.
	if _, err := vm.Start(ctx, v, exec.Command{Name: "sh", Args: []string{"-c", "n=0; while read l; do n=$((n+1)); echo $n; done"}}); err != nil {
		fmt.Println(err)
		return
	}
	cp, err := vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{})
	if err != nil {
		fmt.Println(err) // vm.ErrNotSupported, naming why, where it cannot
		return
	}
	defer vm.RemoveCheckpoint(context.Background(), cp.Path) // it holds the sandbox's memory
	for range 3 {
		c, err := vm.Restore(ctx, cp, vm.RestoreOptions{})
		if err != nil {
			fmt.Println(err)
			return
		}
		defer c.Remove(context.Background())
		p := vm.Processes(c)[0] // the counter, on a handle of the copy's
		_, _ = p.Stdin().Write([]byte("next\n"))
	}
}

// Fork a warm sandbox faster than the engine restores: a pool restores
// copies of the checkpoint ahead of time, and a Get hands out one whose
// warm process is there already.
func ExampleNewRestorePool() {
	ctx := context.Background()
	cp, err := vm.OpenCheckpoint(os.Getenv("WARM_CHECKPOINT")) // taken earlier: its ID or its path
	if err != nil {
		fmt.Println(err)
		return
	}
	pool, err := vm.NewRestorePool(cp, vm.RestoreOptions{}, nil, vm.WithPoolSize(2))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close(context.Background()) // removes the copies not handed out
	for range 3 {
		c, err := pool.Get(ctx)
		if err != nil {
			fmt.Println(err) // the restore's error: vm.ErrNotSupported, vm.ErrCheckpointNotFound…
			return
		}
		defer c.Remove(context.Background())
		p := vm.Processes(c)[0] // the warm process, on a handle of the copy's
		_, _ = p.Stdin().Write([]byte("next\n"))
	}
}
