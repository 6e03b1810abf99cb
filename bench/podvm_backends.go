package main

import (
	"context"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// podvm's two backends, both against the same service: the API one with
// its own connection per VM, the CLI one running `podman --url URL`.
func init() {
	backends = append(backends,
		backend{name: nameAPIVM, new: func(ctx context.Context, host string, cfg vm.Config) (vm.VM, error) {
			return vm.NewAPIVM(ctx, host, cfg)
		}},
		backend{name: nameCLIVM, new: func(_ context.Context, host string, cfg vm.Config) (vm.VM, error) {
			return vm.NewCLIVM(cfg, exec.NewCommandExecutor(), vm.WithURL(host))
		}},
	)
}
