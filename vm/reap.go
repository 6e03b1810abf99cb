package vm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/podvm/podvm/internal/driver"
)

// Reap removes sandboxes that podvm made and nobody will remove, and
// returns their IDs. It finds Podman (or the backend [WithBackend]
// names) as [New] does. It never touches a container without podvm's
// [LabelManaged] label, and removes one that has it when, in this order:
//
//   - it has ended, whoever made it: it can never run again (a pod of
//     [BackendKube] whose phase is Succeeded or Failed; a stopped Podman
//     container can be started again, so it never has ended);
//   - its owner, the process that made it, is gone (below);
//   - olderThan is positive and it was created more than olderThan ago,
//     whoever made it.
//
// Its owner is judged by [LabelOwner] when that is well formed. Of
// another SPACE (another machine, boot, or PID or time namespace: a CI
// container of the same hostname), the owner is not Reap's to judge.
// Of this process's SPACE, it is gone when no process has its PID, or
// when the process that has it started at another time (the PID was
// reused); where /proc does not let Reap read the process (hidepid), it
// is taken to be alive. Without a well-formed LabelOwner (a sandbox of an
// older podvm), the owner is gone when [LabelOwnerHost] is this machine's
// hostname and no process has [LabelOwnerPID]: a PID reused by another
// process keeps such a sandbox until the age rule takes it. Where /proc
// cannot name the process that calls Reap (not Linux), it judges no
// owner by LabelOwner.
//
// When some removals fail, Reap removes the others and returns the
// failures joined. [WithLabel] narrows it to some sandboxes. [WithLogger]
// receives each removal with its reason. [WithSnapshots] makes it
// remove snapshots too (see there): their image IDs follow the
// containers' in the list; [WithCheckpoints], checkpoints (see there),
// whose IDs come first. Reap also removes the agent channel
// directories (sockets, no data) that dead processes of this machine
// left.
func Reap(ctx context.Context, olderThan time.Duration, opts ...Option) ([]string, error) {
	o := newOptions(opts)
	var removed []string
	var errs []error
	if o.checkpoints { // files of the caller's: Podman is not needed
		removed, errs = reapCheckpoints(ctx, o, newOwnerCheck(), removed, errs)
	}
	d, err := o.driver(ctx)
	if err != nil {
		return removed, errors.Join(append(errs, err)...)
	}
	defer d.Close()
	boxes, err := d.List(ctx, LabelManaged+"=true")
	if err != nil {
		return removed, errors.Join(append(errs, err)...)
	}
	chk := newOwnerCheck()
	now := time.Now()
	for _, b := range boxes {
		if !hasLabels(b.Labels, o.labels) {
			continue
		}
		why := reapReason(b, chk, now, olderThan)
		if why == "" {
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
		removed, errs = reapSnapshots(ctx, d, o, chk, removed, errs)
	}
	if n := reapChannelDirs(); n > 0 {
		o.log.Info("podvm: removed the agent channel directories of dead processes", "count", n)
	}
	return removed, errors.Join(errs...)
}

// reapReason says why sandbox b is to be reaped, or "" when it is not.
func reapReason(b driver.Container, chk ownerCheck, now time.Time, olderThan time.Duration) string {
	if b.Labels[LabelManaged] != "true" {
		return ""
	}
	if b.Ended {
		return "it has ended"
	}
	if why := chk.gone(b.Labels); why != "" {
		return why
	}
	if created, err := strconv.ParseInt(b.Labels[LabelCreated], 10, 64); err == nil && olderThan > 0 {
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
