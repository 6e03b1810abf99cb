package vm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/podman"
)

// New returns a VM for cfg, not yet created, on the first Podman it finds:
//
//  1. the service named by [WithURL], if given: only that;
//  2. otherwise $CONTAINER_HOST, $XDG_RUNTIME_DIR/podman/podman.sock
//     (rootless) and /run/podman/podman.sock (rootful), each pinged within
//     the ping timeout: the first that answers gets an [APIVM];
//  3. when none answers, a [CLIVM] running the podman binary on PATH.
//
// [WithBackend] restricts the choice to one backend; [BackendKube], once
// registered by importing vm/kube, is a Pod on the cluster kubectl would
// use. When nothing is usable the error matches [ErrUnavailable] and
// lists everything tried; when ctx ends while New looks for a service,
// the error is ctx's (context.Canceled or DeadlineExceeded), and no CLI
// is chosen in its place.
// The choice and its reason go to the [WithLogger] logger. A config error
// matches [ErrInvalidConfig] and is reported before any probe.
func New(ctx context.Context, cfg Config, opts ...Option) (VM, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	o := newOptions(opts)
	if open, ok := driver.Lookup(string(o.backend)); ok {
		s := new(sandbox)
		s.prepare(cfg)
		spec := s.spec // the opener's to check, not to keep
		d, err := open(ctx, &spec)
		if err != nil {
			return nil, err
		}
		o.log.Info("podvm: using the registered backend", "backend", o.backend)
		if err := s.use(d); err != nil {
			return nil, err
		}
		return s, nil
	}
	if podman.IsLocal(cmp.Or(o.url, os.Getenv("CONTAINER_HOST"))) {
		// Every candidate is on this machine: a missing mount source is
		// a bad config, refused before any probe.
		if err := cfg.checkMountSources(); err != nil {
			return nil, err
		}
	}
	d, err := o.driver(ctx)
	if err != nil {
		return nil, err
	}
	var v interface {
		VM
		init(driver.Driver, Config) error
	} = new(CLIVM)
	if _, ok := d.(podman.API); ok {
		v = new(APIVM)
	}
	if err := v.init(d, cfg); err != nil {
		return nil, err
	}
	return v, nil
}

// driver finds Podman as [New] describes, and logs its choice. When
// nothing is usable the error matches [ErrUnavailable] and lists what was
// tried, or [ErrInvalidConfig] for an option that cannot work.
func (o options) driver(ctx context.Context) (driver.Driver, error) {
	if open, ok := driver.Lookup(string(o.backend)); ok {
		return open(ctx, nil)
	}
	c, tried, err := o.connect(ctx)
	switch {
	case c != nil:
		o.log.Info("podvm: using the API backend", "uri", c.URI(), "server", c.Version().String())
		return podman.NewAPI(c), nil
	case err != nil:
		return nil, err
	}
	d, err := o.cliDriver(len(tried) > 0)
	switch {
	case err == nil:
		why := "requested"
		if len(tried) > 0 {
			why = "no socket answered: " + strings.Join(tried, "; ")
		}
		o.log.Info("podvm: using the CLI backend", "podman", o.podman, "reason", why)
		return d, nil
	case errors.Is(err, ErrInvalidConfig):
		return nil, err
	}
	return nil, fmt.Errorf("%w: tried %s", ErrUnavailable, strings.Join(append(tried, err.Error()), "; "))
}

// connect finds a service for the API backend. It returns the client, or
// what it tried and why each failed; err is set only when trying further
// (the CLI) is pointless.
func (o options) connect(ctx context.Context) (c *libpod.Client, tried []string, err error) {
	if o.backend == BackendCLI {
		return nil, nil, nil
	}
	if o.backend == BackendKube {
		return nil, nil, fmt.Errorf("%w: backend %q is registered by importing github.com/podvm/podvm/vm/kube", ErrInvalidConfig, o.backend)
	}
	if o.backend != BackendAPI && o.backend != BackendAuto {
		return nil, nil, fmt.Errorf("%w: unknown backend %q", ErrInvalidConfig, o.backend)
	}
	candidates := o.sockets()
	for _, uri := range candidates {
		c, err := o.ping(ctx, uri)
		if err == nil {
			return c, nil, nil
		}
		o.log.Debug("podvm: no service", "uri", uri, "err", err)
		tried = append(tried, err.Error())
		if ctx.Err() != nil {
			break // the others would fail alike
		}
	}
	if len(candidates) == 0 {
		tried = append(tried, "no socket: CONTAINER_HOST unset, none at $XDG_RUNTIME_DIR/podman/podman.sock or /run/podman/podman.sock")
	}
	if err := ctx.Err(); err != nil { // what ended the search, not the services
		return nil, nil, fmt.Errorf("vm: looking for a Podman service: %w (tried %s)", err, strings.Join(tried, "; "))
	}
	if o.backend == BackendAPI || o.url != "" { // the CLI would go to the same place
		return nil, nil, fmt.Errorf("%w: tried %s", ErrUnavailable, strings.Join(tried, "; "))
	}
	return nil, tried, nil
}

// sockets lists the services to probe, in order.
func (o options) sockets() []string {
	if o.url != "" {
		return []string{o.url}
	}
	var uris []string
	if h := os.Getenv("CONTAINER_HOST"); h != "" {
		uris = append(uris, h)
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		uris = append(uris, "unix://"+filepath.Join(d, "podman", "podman.sock"))
	}
	return append(uris, "unix:///run/podman/podman.sock")
}

// ping connects to uri within the ping timeout ([WithPingTimeout]). A
// unix socket that does not exist fails at once, without a dial.
func (o options) ping(ctx context.Context, uri string) (*libpod.Client, error) {
	if path, ok := strings.CutPrefix(uri, "unix://"); ok {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("%s: no socket: %w", uri, err)
		}
	}
	timeout := o.pingTimeout
	switch {
	case timeout != 0:
	case strings.HasPrefix(uri, "ssh://"):
		timeout = DefaultSSHPingTimeout
	default:
		timeout = DefaultPingTimeout
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := libpod.Connect(pctx, uri)
	if err != nil {
		if pctx.Err() != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("%s: no answer within %v", uri, timeout)
		}
		return nil, fmt.Errorf("%s: %w", uri, err)
	}
	return c, nil
}

// cliDriver is the CLI driver the options describe, running the podman
// binary on PATH unless [WithExecutor] gave an executor. fallback: a
// socket was tried and did not answer, so the environment must not send
// podman to it.
func (o options) cliDriver(fallback bool) (podman.CLI, error) {
	host := os.Getenv("CONTAINER_HOST")
	if o.x != nil {
		return podman.NewCLI(o.x, o.podman, o.url, host)
	}
	if _, err := osexec.LookPath(o.podman); err != nil {
		return podman.CLI{}, fmt.Errorf("no podman binary: %v", err)
	}
	env := os.Environ()
	if fallback && o.url == "" {
		env = slices.DeleteFunc(env, func(kv string) bool {
			k, _, _ := strings.Cut(kv, "=")
			return k == "CONTAINER_HOST" || k == "CONTAINER_CONNECTION"
		})
		host = "" // podman no longer sees CONTAINER_HOST
	}
	return podman.NewCLI(podman.NewExecutor(exec.WithBaseEnv(env)), o.podman, o.url, host)
}
