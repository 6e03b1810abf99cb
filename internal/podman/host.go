package podman

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/libpod"
)

// Host is what a Podman service can enforce for its containers, as its
// info reports it.
type Host struct {
	Rootless      bool
	CgroupVersion string   // "v1" or "v2"
	Controllers   []string // the cgroup controllers its containers can use
}

// Enforce checks that h can enforce the limits spec asks for. Rootful
// Podman enforces every limit with the container's cgroup. Rootless
// Podman can use only the controllers delegated to the user (none on
// cgroup v1) and ignores the other limits with a mere warning: there a
// pids (the default of zero included), memory or CPU limit is refused
// with an error matching [driver.ErrNotSupported] that names the limit
// and why. A Pids of -1 (no limit) is always honoured: see [asked].
//
// Why not enforce the pids limit otherwise: RLIMIT_NPROC counts a user's
// processes per user namespace, and rootless containers share one (with
// the service), so the limit would be shared by every sandbox of the
// user; a namespace per sandbox (Podman's --userns=auto) deadlocks
// Podman 4.3's storage under concurrent creates and removals
// (podman#16062, seen here).
func (h Host) Enforce(spec driver.Spec) error {
	switch {
	case spec.Pids >= 0 && !h.can("pids"):
		return h.refuse("pids", "pids")
	case spec.Memory > 0 && !h.can("memory"):
		return h.refuse("memory", "memory")
	case spec.CPUs > 0 && !h.can("cpu"):
		return h.refuse("CPU", "cpu")
	}
	return nil
}

// can reports whether h's containers can use the cgroup controller.
func (h Host) can(controller string) bool {
	return !h.Rootless || slices.Contains(h.Controllers, controller)
}

// asked returns spec as this package's create calls take it, with its
// pids limit resolved and 0 meaning no --pids-limit at all: zero is
// [driver.DefaultPids], and -1 (no limit) asks for nothing on a service
// known to enforce no pids limit (rootless without the controller), where
// Podman would only warn about it.
func asked(service string, spec driver.Spec) driver.Spec {
	switch {
	case spec.Pids == 0:
		spec.Pids = driver.DefaultPids
	case spec.Pids < 0:
		if h, ok := hosts.Load(service); ok && !h.(Host).can("pids") {
			spec.Pids = 0
		}
	}
	return spec
}

// info asks the service what it enforces, with its GET /info.
func (a API) info(ctx context.Context) (Host, error) {
	info, err := a.c.Info(ctx)
	if err != nil {
		return Host{}, apiError("info", a.c.URI(), err)
	}
	return hostOf(info), nil
}

// info asks the service what it enforces, with `podman info`.
func (d CLI) info(ctx context.Context) (Host, error) {
	res, err := d.run(ctx, "info", d.host, exec.Command{Args: []string{"info", "--format", "json"}})
	if err != nil {
		return Host{}, err
	}
	var info libpod.Info
	if err := json.Unmarshal([]byte(res.Stdout), &info); err != nil {
		return Host{}, fmt.Errorf("%w: podman info: %v", driver.ErrEngine, err)
	}
	return hostOf(info), nil
}

func hostOf(info libpod.Info) Host {
	return Host{Rootless: info.Host.Security.Rootless, CgroupVersion: info.Host.CgroupVersion, Controllers: info.Host.CgroupControllers}
}

func (h Host) refuse(limit, controller string) error {
	return &driver.LimitError{Limit: limit, Controller: controller, Cgroup: h.CgroupVersion, Engine: "rootless Podman"}
}

// hosts holds what each service enforces, by service ([driver.Driver.Local]'s
// name), learnt once per process, and forgotten when the service could not
// be reached (it may come back as another kind).
var hosts sync.Map

// limits implements [driver.Limiter.Limits] for a driver of service,
// asking it with ask once per process.
func limits(ctx context.Context, service string, ask func(context.Context) (Host, error), spec driver.Spec) error {
	h, ok := hosts.Load(service)
	if !ok {
		host, err := ask(ctx)
		if err != nil {
			return err
		}
		h, _ = hosts.LoadOrStore(service, host)
	}
	return h.(Host).Enforce(spec)
}

// forget drops what is known of service once err says it could not be
// reached, and returns err.
func forget(service string, err error) error {
	if errors.Is(err, driver.ErrUnavailable) {
		hosts.Delete(service)
	}
	return err
}

// Limits implements [driver.Limiter].
func (a API) Limits(ctx context.Context, spec driver.Spec) error {
	_, service := a.Local()
	return limits(ctx, service, a.info, spec)
}

// Limits implements [driver.Limiter].
func (d CLI) Limits(ctx context.Context, spec driver.Spec) error {
	_, service := d.Local()
	return limits(ctx, service, d.info, spec)
}

var (
	_ driver.Limiter = API{}
	_ driver.Limiter = CLI{}
)
