package vm

import (
	"os"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/podman"
)

// CLIVM is a [VM] that drives the podman command through an
// [exec.Executor]: Create is `podman create` then one `podman start -a -i`
// that stays attached to podvm's agent, Run is a message to the agent on
// that stream (with [Config.PodmanExec]: `podman run -d` and one `podman
// exec` per Run), the copies are `podman cp` and Remove is `podman rm -f
// -t 0`. Its errors
// wrap what podman printed as a [*CLIError]. Create one with [NewCLIVM];
// it is safe for concurrent use.
//
// Through the agent, a remote connection ([WithURL], or CONTAINER_HOST in
// the executor's environment) works as well as the local podman. With
// PodmanExec prefer the local podman: podman-remote's exec now and then
// loses the output of a short command under load and reports its exit
// status alone (containers/podman#25855).
type CLIVM struct{ sandbox }

var _ VM = (*CLIVM)(nil)

// NewCLIVM returns a VM for cfg, not yet created, whose podman commands
// run through x (nil: an [exec.CommandExecutor] that contains podman by
// its process group alone, since conmon must outlive it). It calls no
// podman: it fails with an error matching [ErrInvalidConfig] when cfg is
// invalid or, when the Podman host is this machine (no URL, or a unix://
// one), when a mount source does not exist. Of the options it uses
// [WithPodman] (the binary) and [WithURL] (podman's --url).
func NewCLIVM(cfg Config, x exec.Executor, opts ...Option) (*CLIVM, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := newOptions(opts)
	d, err := podman.NewCLI(x, o.podman, o.url, os.Getenv("CONTAINER_HOST"))
	if err != nil {
		return nil, err
	}
	v := new(CLIVM)
	if err := v.init(d, cfg); err != nil {
		return nil, err
	}
	return v, nil
}

// CLIError is a podman invocation that failed: [CLIVM]'s errors wrap one,
// next to the sentinel it was mapped to, so that [errors.As] reaches what
// podman said: its subcommand (Op: "run", "exec", "cp", "rm"), its exit
// status (ExitCode) and its standard error as captured (Stderr). Its
// Error is "podman OP exited CODE: " and podman's error lines.
type CLIError = podman.CLIError
