package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
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
// [WithSnapshots] makes it remove snapshots too (see there): their image
// IDs follow the containers' in the list. Reap also removes the agent
// channel directories (sockets, no data) that dead processes of this
// machine left.
func Reap(ctx context.Context, olderThan time.Duration, opts ...Option) ([]string, error) {
	o := newOptions(opts)
	d, err := o.driver(ctx)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	boxes, err := d.List(ctx, LabelManaged+"=true")
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	now := time.Now()
	var removed []string
	var errs []error
	for _, b := range boxes {
		why := reapReason(b.Labels, host, now, olderThan)
		if why == "" || !hasLabels(b.Labels, o.labels) {
			continue
		}
		if err := d.Remove(ctx, b.ID); err != nil {
			errs = append(errs, err)
			continue
		}
		o.log.Info("podvm: reaped sandbox", "id", b.ID, "reason", why)
		removed = append(removed, b.ID)
	}
	if o.snapshots {
		removed, errs = reapSnapshots(ctx, d, o, host, removed, errs)
	}
	if n := reapChannelDirs(); n > 0 {
		o.log.Info("podvm: removed the agent channel directories of dead processes", "count", n)
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
