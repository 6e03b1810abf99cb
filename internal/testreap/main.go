// Command testreap removes what processes that ended left on the Podman
// service of $CONTAINER_HOST: sandboxes, snapshots and agent channel
// directories, by [vm.Reap]'s rules (a live owner's are never touched).
// make test runs it before go test, so that a test binary killed by its
// timeout fails no later run, while a run's own leaks still fail it
// (scripts/check-leaks.sh, after go test).
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/podvm/podvm/vm"
)

func main() {
	host := os.Getenv("CONTAINER_HOST")
	if host == "" {
		return // no service: nothing of ours can be there
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	removed, err := vm.Reap(ctx, 0, vm.WithURL(host), vm.WithSnapshots())
	if len(removed) > 0 {
		fmt.Fprintf(os.Stderr, "testreap: removed %d sandboxes and snapshots that ended processes left on %s\n", len(removed), host)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testreap: %v\n", err)
		os.Exit(1)
	}
}
