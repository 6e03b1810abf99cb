package vm

import (
	"cmp"
	"fmt"
	"os"
	"strings"

	"github.com/podvm/podvm/exec"
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
// run through x (nil means [exec.NewCommandExecutor]()). It calls no
// podman: it fails with an error matching [ErrInvalidConfig] when cfg is
// invalid or, when the Podman host is this machine (no URL, or a unix://
// one), when a mount source does not exist. Of the options it uses
// [WithPodman] (the binary) and [WithURL] (podman's --url).
func NewCLIVM(cfg Config, x exec.Executor, opts ...Option) (*CLIVM, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	d, err := newCLIDriver(x, newOptions(opts))
	if err != nil {
		return nil, err
	}
	v := new(CLIVM)
	if err := v.init(d, cfg); err != nil {
		return nil, err
	}
	return v, nil
}

// newCLIDriver is the CLI driver the options describe.
func newCLIDriver(x exec.Executor, o options) (cliDriver, error) {
	if x == nil {
		x = podmanExecutor()
	}
	d := cliDriver{x: x, podman: o.podman, host: cmp.Or(o.url, os.Getenv("CONTAINER_HOST"))}
	if o.url != "" {
		d.global = []string{"--url", o.url}
	}
	switch {
	case d.podman == "" || strings.IndexByte(d.podman, 0) >= 0:
		return d, fmt.Errorf("%w: podman path %q", ErrInvalidConfig, d.podman)
	case o.url != "" && strings.HasPrefix(o.url, "-"):
		return d, fmt.Errorf("%w: podman URL %q", ErrInvalidConfig, o.url)
	}
	return d, nil
}

// podmanExecutor is the executor CLIVM runs podman through by default.
// Podman is not the untrusted command: it starts conmon, which must
// outlive it, so a run is contained by its process group alone (conmon
// leaves it), never killed as a cgroup or a subreaper's tree.
func podmanExecutor(opts ...exec.Option) exec.Executor {
	return exec.NewCommandExecutor(append(opts, exec.WithContainment(exec.ContainProcessGroup))...)
}

// isLocal reports whether a Podman service URI (or none) is on this
// machine, where mount sources can be checked.
func isLocal(uri string) bool { return uri == "" || strings.HasPrefix(uri, "unix://") }
