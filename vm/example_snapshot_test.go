package vm_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// Prepare a sandbox once, snapshot it, and start fresh sandboxes from
// its state: here through a pool, whose sandboxes find the modules
// already fetched.
func ExampleTakeSnapshot() {
	ctx := context.Background()
	cfg := vm.Config{Image: "localhost/podvm-test:latest", Network: "bridge", Env: []string{"GOMODCACHE=/var/cache/gomod"}}
	prep, err := vm.New(ctx, cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := prep.Create(ctx); err != nil {
		fmt.Println(err)
		return
	}
	defer prep.Remove(context.Background())
	if _, err := prep.Run(ctx, exec.Command{Name: "go", Args: []string{"mod", "download"}, Dir: "/src"}); err != nil {
		fmt.Println(err)
		return
	}
	snap, err := vm.TakeSnapshot(ctx, prep, vm.SnapshotOptions{Name: "prepared:go1.25"})
	switch {
	case errors.Is(err, vm.ErrImageExists):
		fmt.Println("an image of yours has that name; set Replace to take it")
		return
	case err != nil:
		fmt.Println(err)
		return
	}
	// The sandboxes first, then the snapshot: removing it while one uses
	// it is vm.ErrSnapshotInUse.
	defer vm.RemoveSnapshot(context.Background(), prep, snap.Image)

	fresh := cfg
	fresh.Image, fresh.Network = snap.Image, "" // no network: the modules are in the image
	pool, err := vm.NewPool(fresh, nil, vm.WithPoolSize(4))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close(context.Background())
	box, err := pool.Get(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer box.Remove(context.Background())
	res, err := box.Run(ctx, exec.Command{Name: "go", Args: []string{"build", "./..."}, Dir: "/src", Timeout: time.Minute})
	fmt.Println(res, err)
}

// Remove what crashed runs left behind: their sandboxes, and the
// snapshots they took.
func ExampleWithSnapshots() {
	removed, err := vm.Reap(context.Background(), 0, vm.WithSnapshots())
	fmt.Println(len(removed), err)
}
