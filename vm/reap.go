package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/libpod"
)

// Reap removes sandboxes that podvm made and nobody will remove: those
// whose creating process ran on this host and no longer exists (it
// crashed, or was killed before Remove), and, when olderThan is positive,
// those created more than olderThan ago, whoever made them. It finds
// Podman as [New] does and returns the IDs it removed. Containers without
// podvm's [LabelManaged] label are never touched. A process ID reused by
// an unrelated process keeps its sandboxes alive until the age rule takes
// them. When some removals fail, Reap removes the others and returns the
// failures joined. [WithLabel] narrows it to some sandboxes.
func Reap(ctx context.Context, olderThan time.Duration, opts ...Option) ([]string, error) {
	o := newOptions(opts)
	var p reapTarget
	c, tried, err := o.connect(ctx)
	switch {
	case c != nil:
		p = apiTarget{c}
		defer c.CloseIdleConnections()
	case err != nil:
		return nil, err
	default:
		v, err := o.cli(Config{Image: "reap"}, len(tried) > 0)
		if err != nil {
			return nil, fmt.Errorf("%w: tried %v; %v", ErrUnavailable, tried, err)
		}
		p = cliTarget{v}
	}
	boxes, err := p.managed(ctx)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	now := time.Now()
	var removed []string
	var errs []error
	for _, b := range boxes {
		why := reapReason(b.labels, host, now, olderThan)
		if why == "" || !hasLabels(b.labels, o.labels) {
			continue
		}
		if err := p.remove(ctx, b.id); err != nil && !errors.Is(err, ErrNoSuchContainer) {
			errs = append(errs, err)
			continue
		}
		o.log.Info("podvm: reaped sandbox", "id", b.id, "reason", why)
		removed = append(removed, b.id)
	}
	return removed, errors.Join(errs...)
}

// reapReason says why a sandbox with these labels is to be reaped, or ""
// when it is not.
func reapReason(labels map[string]string, host string, now time.Time, olderThan time.Duration) string {
	if labels[LabelManaged] != "true" {
		return ""
	}
	if pid, err := strconv.Atoi(labels[LabelOwnerPID]); err == nil && pid > 0 && labels[LabelOwnerHost] == host && !processAlive(pid) {
		return fmt.Sprintf("owner process %d is gone", pid)
	}
	if created, err := strconv.ParseInt(labels[LabelCreated], 10, 64); err == nil && olderThan > 0 {
		if age := now.Sub(time.Unix(created, 0)); age > olderThan {
			return fmt.Sprintf("created %v ago", age.Round(time.Second))
		}
	}
	return ""
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

// processAlive reports whether a process with this ID exists.
func processAlive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	err = p.Signal(syscall.Signal(0))
	return err == nil || errors.Is(err, syscall.EPERM)
}

// sandbox is a container with podvm's label, as Reap sees it.
type sandbox struct {
	id     string
	labels map[string]string
}

// reapTarget lists and removes sandboxes through one backend.
type reapTarget interface {
	managed(ctx context.Context) ([]sandbox, error)
	remove(ctx context.Context, id string) error
}

type apiTarget struct{ c *libpod.Client }

func (a apiTarget) managed(ctx context.Context) ([]sandbox, error) {
	ids, err := a.c.ContainerList(ctx, LabelManaged+"=true")
	if err != nil {
		return nil, apiError("container list", "", err)
	}
	var boxes []sandbox
	for _, id := range ids {
		info, err := a.c.ContainerInspect(ctx, id)
		if err != nil {
			continue // removed meanwhile
		}
		boxes = append(boxes, sandbox{id, info.Config.Labels})
	}
	return boxes, nil
}

func (a apiTarget) remove(ctx context.Context, id string) error {
	if err := a.c.ContainerRemove(ctx, id); err != nil {
		return apiError("container remove", id, err)
	}
	return nil
}

type cliTarget struct{ v *CLIVM }

func (t cliTarget) managed(ctx context.Context) ([]sandbox, error) {
	res, err := t.v.run(ctx, exec.Command{Args: []string{"ps", "-a", "--filter", "label=" + LabelManaged + "=true", "--format", "json"}, MaxOutputBytes: 64 << 20})
	if err != nil {
		return nil, err
	}
	if res.ExitCode != 0 {
		return nil, cliError("ps", "", res)
	}
	var list []struct {
		ID     string            `json:"Id"`
		Labels map[string]string `json:"Labels"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &list); err != nil {
		return nil, fmt.Errorf("%w: podman ps: %v", ErrPodman, err)
	}
	boxes := make([]sandbox, len(list))
	for i, c := range list {
		boxes[i] = sandbox{c.ID, c.Labels}
	}
	return boxes, nil
}

func (t cliTarget) remove(ctx context.Context, id string) error {
	res, err := t.v.run(ctx, exec.Command{Args: []string{"rm", "-f", "-t", "0", id}})
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return cliError("rm", id, res)
	}
	return nil
}
