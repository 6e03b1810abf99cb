package vmtest

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/podvm/podvm/vm"
)

// RequireEnv names the variable that turns Sandbox's skip into a failure:
// set it (to anything) in CI, where a missing Podman is a broken setup.
const RequireEnv = "PODVM_REQUIRE_PODMAN"

// Sandbox is for users' integration tests. It returns a created sandbox
// for cfg, found as [vm.New] finds Podman (opts are passed on), and
// removes it in t.Cleanup, also when the test fails or panics. When no
// Podman is usable it skips t with a message saying what was tried, or
// fails t when $PODVM_REQUIRE_PODMAN is set. Any other error fails t.
//
//	func TestBuild(t *testing.T) {
//		box := vmtest.Sandbox(t, vm.Config{Image: "docker.io/library/golang:1.25"})
//		res, err := box.Run(ctx, exec.Command{Name: "go", Args: []string{"version"}})
//		...
//	}
func Sandbox(t testing.TB, cfg vm.Config, opts ...vm.Option) vm.VM {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := vm.New(ctx, cfg, opts...)
	if err == nil {
		err = v.Create(ctx)
		t.Cleanup(func() {
			rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := v.Remove(rctx); err != nil {
				t.Errorf("vmtest: removing the sandbox: %v", err)
			}
		})
	}
	switch {
	case err == nil:
		return v
	case errors.Is(err, vm.ErrUnavailable) && os.Getenv(RequireEnv) == "":
		t.Skipf("vmtest: no Podman (set %s to fail instead): %v", RequireEnv, err)
	default:
		t.Fatalf("vmtest: sandbox: %v", err)
	}
	return nil
}
