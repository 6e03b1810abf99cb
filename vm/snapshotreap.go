package vm

import (
	"context"
	"errors"
	"fmt"

	"github.com/podvm/podvm/internal/driver"
)

// This file is how snapshots are removed by label and reaped with their
// owners.

// removeByLabel removes every image carrying label, by each of its
// names, then by ID.
func removeByLabel(ctx context.Context, im driver.Imager, label string) error {
	imgs, err := im.Images(ctx, label)
	if err != nil {
		return err
	}
	var errs []error
	for _, img := range imgs {
		errs = append(errs, removeImage(ctx, im, img))
	}
	return errors.Join(errs...)
}

// removeImage removes img by each of its names, then by its ID: without
// force, Podman refuses to remove by ID an image with several names.
func removeImage(ctx context.Context, im driver.Imager, img driver.Image) error {
	for _, n := range img.Names {
		if err := im.RemoveImage(ctx, n); err != nil && !errors.Is(err, ErrImageNotFound) {
			return err
		}
	}
	if err := im.RemoveImage(ctx, img.ID); err != nil && !errors.Is(err, ErrImageNotFound) {
		return err
	}
	return nil
}

// WithSnapshots makes [Reap] remove, after the sandboxes, the snapshots
// ([TakeSnapshot]) whose owner, the process that took them, is gone,
// whatever their age, and none other: never an image without podvm's
// [LabelSnapshot], never one whose owner lives or is not Reap's to judge.
// The owner is judged as a sandbox's is (see [Reap]). A snapshot that a
// container still uses is left, and logged. [WithLabel] narrows it to
// snapshots carrying a label too.
func WithSnapshots() Option { return func(o *options) { o.snapshots = true } }

// reapSnapshots removes the snapshots whose owner chk finds gone,
// adding their IDs to removed and its failures to errs.
func reapSnapshots(ctx context.Context, d driver.Driver, o options, chk ownerCheck, removed []string, errs []error) ([]string, []error) {
	im, ok := d.(driver.Imager)
	if !ok {
		return removed, append(errs, fmt.Errorf("%w: reap snapshots", ErrNotSupported))
	}
	snaps, err := listSnapshots(ctx, im)
	if err != nil {
		return removed, append(errs, err)
	}
	for _, s := range snaps {
		if !hasLabels(s.Labels, o.labels) {
			continue
		}
		why := chk.gone(s.Labels)
		if why == "" {
			continue
		}
		err := removeImage(ctx, im, driver.Image{ID: s.ID, Names: s.Names})
		switch {
		case errors.Is(err, ErrSnapshotInUse):
			o.log.Info("podvm: snapshot of a gone owner still in use; left", "id", s.ID, "names", s.Names)
			continue
		case err != nil:
			errs = append(errs, err)
			continue
		}
		o.log.Info("podvm: reaped snapshot", "id", s.ID, "names", s.Names, "reason", why)
		removed = append(removed, s.ID)
	}
	return removed, errs
}
