package podman

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/libpod"
)

// Host is what a Podman service can enforce for its containers, as its
// info reports it.
type Host struct {
	Rootless      bool
	CgroupVersion string   // "v1" or "v2"
	Controllers   []string // the cgroup controllers its containers can use
}

// Hoster is implemented by a driver that can tell what its service
// enforces: both Podman drivers. A driver that is not enforces, or
// refuses, every limit itself.
type Hoster interface {
	Host(ctx context.Context) (Host, error)
}

// Enforce checks that h can enforce the limits spec asks for. Rootful
// Podman enforces every limit with the container's cgroup. Rootless
// Podman can use only the controllers delegated to the user (none on
// cgroup v1) and ignores the other limits with a mere warning: there a
// pids, memory or CPU limit is refused with an error matching
// [ErrNotSupported] that names the limit and why, and a Pids of -1 (no
// limit) asks for nothing, which Podman would only warn about.
//
// Why not enforce the pids limit otherwise: RLIMIT_NPROC counts a user's
// processes per user namespace, and rootless containers share one (with
// the service), so the limit would be shared by every sandbox of the
// user; a namespace per sandbox (Podman's --userns=auto) deadlocks
// Podman 4.3's storage under concurrent creates and removals
// (podman#16062, seen here).
func (h Host) Enforce(spec *Spec) error {
	if !h.Rootless {
		return nil
	}
	can := func(controller string) bool { return slices.Contains(h.Controllers, controller) }
	switch {
	case spec.Pids > 0 && !can("pids"):
		return &LimitError{Limit: "pids", Controller: "pids", Cgroup: h.CgroupVersion}
	case spec.Memory > 0 && !can("memory"):
		return &LimitError{Limit: "memory", Controller: "memory", Cgroup: h.CgroupVersion}
	case spec.CPUs > 0 && !can("cpu"):
		return &LimitError{Limit: "CPU", Controller: "cpu", Cgroup: h.CgroupVersion}
	case spec.Pids < 0 && !can("pids"):
		spec.Pids = 0
	}
	return nil
}

// LimitError is a limit rootless Podman cannot enforce: it matches
// [ErrNotSupported].
type LimitError struct {
	Limit      string // "pids", "memory", "CPU"
	Controller string // the cgroup controller it needs
	Cgroup     string // the host's cgroup version, "v1" or "v2"
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%v: a %s limit: rootless Podman on cgroup %s cannot enforce it (the %s controller is not delegated to the user; Podman would ignore the limit with a mere warning)",
		ErrNotSupported, e.Limit, e.Cgroup, e.Controller)
}

func (e *LimitError) Unwrap() error { return ErrNotSupported }

// Host implements [Hoster] with the service's GET /info.
func (a API) Host(ctx context.Context) (Host, error) {
	info, err := a.c.Info(ctx)
	if err != nil {
		return Host{}, apiError("info", a.c.URI(), err)
	}
	return hostOf(info), nil
}

// Host implements [Hoster] with `podman info`.
func (d CLI) Host(ctx context.Context) (Host, error) {
	res, err := d.run(ctx, "info", d.host, exec.Command{Args: []string{"info", "--format", "json"}})
	if err != nil {
		return Host{}, err
	}
	var info libpod.Info
	if err := json.Unmarshal([]byte(res.Stdout), &info); err != nil {
		return Host{}, fmt.Errorf("%w: podman info: %v", ErrPodman, err)
	}
	return hostOf(info), nil
}

func hostOf(info libpod.Info) Host {
	return Host{Rootless: info.Host.Security.Rootless, CgroupVersion: info.Host.CgroupVersion, Controllers: info.Host.CgroupControllers}
}
