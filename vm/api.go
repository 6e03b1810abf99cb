package vm

import (
	"context"
	"fmt"

	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/podman"
)

// APIVM is a [VM] that speaks the Podman REST API over the service's
// socket: Create creates the container and starts it attached to podvm's
// agent, Run is a message to the agent on that stream (or, with
// [Config.PodmanExec], an exec session streamed on a connection of its
// own), the copies use the archive endpoints and Remove force-removes the
// container. Its errors wrap the
// service's answer as an [*APIError]. Create one with [NewAPIVM]; it is
// safe for concurrent use.
//
// Remove closes the idle connections it kept to a unix:// or tcp://
// service (one never removed lets them go after 30 s unused); over
// ssh:// the bindings keep their SSH connection open.
type APIVM struct{ sandbox }

var _ VM = (*APIVM)(nil)

// NewAPIVM returns a VM for cfg, not yet created, on the Podman service at
// uri: unix:///path/podman.sock, tcp://host:port or
// ssh://user@host[:port]/path/podman.sock. It validates cfg first and
// fails with an error matching [ErrInvalidConfig], making no connection,
// when cfg is invalid or, for a unix:// service (on this machine), when a
// mount source does not exist. It then connects, pinging the service and
// reading its version, within ctx and the ping timeout ([WithPingTimeout],
// default [DefaultPingTimeout], [DefaultSSHPingTimeout] over ssh://; the
// only option it uses): a service that
// cannot be reached, or does not answer in time, is [ErrUnavailable],
// with an error naming uri.
func NewAPIVM(ctx context.Context, uri string, cfg Config, opts ...Option) (*APIVM, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if uri == "" {
		return nil, fmt.Errorf("%w: empty service URI", ErrInvalidConfig)
	}
	if podman.IsLocal(uri) {
		if err := cfg.checkMountSources(); err != nil {
			return nil, err
		}
	}
	c, err := newOptions(opts).ping(ctx, uri)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	v := new(APIVM)
	if err := v.init(podman.NewAPI(c), cfg); err != nil {
		return nil, err
	}
	return v, nil
}

// APIError is a request to the Podman service that failed: [APIVM]'s
// errors wrap one, next to the sentinel it was mapped to, so that
// [errors.As] reaches what the service answered (its HTTP status, libpod's
// cause and message) or, when no answer came, the transport's error.
type APIError = libpod.Error
