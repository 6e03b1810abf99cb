package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// A backend is one of podvm's ways of making a sandbox.
type backend struct {
	name string // as shown in the tables: "podvm APIVM"
	new  func(ctx context.Context, host string, cfg vm.Config) (vm.VM, error)
}

// backends are podvm's, in table order, both against the same service:
// the API one with its own connection per VM, the CLI one running
// `podman --url URL`; each through podvm's agent (the default) and
// through Podman exec sessions (Config.PodmanExec).
var backends = []backend{
	{name: nameAPIVM, new: apiVM(false)},
	{name: nameCLIVM, new: cliVM(false)},
	{name: nameAPIVMExec, new: apiVM(true)},
	{name: nameCLIVMExec, new: cliVM(true)},
}

func apiVM(podmanExec bool) func(context.Context, string, vm.Config) (vm.VM, error) {
	return func(ctx context.Context, host string, cfg vm.Config) (vm.VM, error) {
		cfg.PodmanExec = podmanExec
		return vm.NewAPIVM(ctx, host, cfg)
	}
}

func cliVM(podmanExec bool) func(context.Context, string, vm.Config) (vm.VM, error) {
	return func(_ context.Context, host string, cfg vm.Config) (vm.VM, error) {
		cfg.PodmanExec = podmanExec
		return vm.NewCLIVM(cfg, nil, vm.WithURL(host)) // its default executor
	}
}

// roundTripCommand is roundTripArgv as an exec.Command.
var roundTripCommand = exec.Command{Name: roundTripArgv[0], Args: roundTripArgv[1:]}

// vmRoundTrip runs the round trip with v.Run; the output is in the
// Result's capture.
func vmRoundTrip(v vm.VM) op {
	return func(ctx context.Context) error {
		res, err := v.Run(ctx, roundTripCommand)
		if err != nil {
			return err
		}
		return checkRoundTrip(res.Stdout, res.Stderr, res.ExitCode)
	}
}

// hostRoundTrip runs the round trip on the host through x: what the
// command costs with no sandbox at all.
func hostRoundTrip(x exec.Executor) op {
	return func(ctx context.Context) error {
		res, err := x.Run(ctx, roundTripCommand)
		if err != nil {
			return err
		}
		return checkRoundTrip(res.Stdout, res.Stderr, res.ExitCode)
	}
}

// vmRun runs argv with v.Run and fails unless it exits 0.
func vmRun(v vm.VM, argv []string) op {
	cmd := exec.Command{Name: argv[0], Args: argv[1:]}
	return func(ctx context.Context) error {
		res, err := v.Run(ctx, cmd)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("%s exited %d: %s", argv[0], res.ExitCode, res.Stderr)
		}
		return err
	}
}

// vmStream streams n bytes through v.Run into its capped capture
// (exec.DefaultMaxOutputBytes), with no live writer.
func vmStream(v vm.VM, n int64) op {
	argv := streamArgv(n)
	cmd := exec.Command{Name: argv[0], Args: argv[1:]}
	return func(ctx context.Context) error {
		res, err := v.Run(ctx, cmd)
		switch {
		case err != nil:
			return err
		case res.ExitCode != 0 || res.StdoutBytes != n:
			return fmt.Errorf("streamed %d bytes, exit %d, want %d bytes, exit 0: %s", res.StdoutBytes, res.ExitCode, n, res.Stderr)
		}
		return nil
	}
}

// vmLifecycle makes a VM, creates it, runs the round trip and removes it.
func vmLifecycle(b backend, host string, cfg vm.Config) op {
	return vmLifecycleRun(b, host, cfg, vmRoundTrip)
}

// vmLifecycleRun makes a VM, creates it, runs run's op in it and removes
// it.
func vmLifecycleRun(b backend, host string, cfg vm.Config, run func(vm.VM) op) op {
	return func(ctx context.Context) error {
		v, err := b.new(ctx, host, cfg)
		if err != nil {
			return err
		}
		err = v.Create(ctx)
		if err == nil {
			err = run(v)(ctx)
		}
		rctx, cancel := removeContext(ctx)
		defer cancel()
		return errors.Join(err, v.Remove(rctx))
	}
}
