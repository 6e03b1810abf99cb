package vm

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/podvm/podvm/internal/driver"
)

// This file is snapshots: a sandbox's container committed as an image
// that fresh sandboxes start from (the commit itself is
// internal/podman/snapshot.go). What a snapshot holds is documented on
// [Snapshot].

// Labels of a snapshot image, besides [LabelOwner], [LabelOwnerPID],
// [LabelOwnerHost] and [LabelCreated] (the time it was taken).
const (
	LabelSnapshot       = "io.podvm.snapshot"        // "true"
	LabelSnapshotSource = "io.podvm.snapshot.source" // ID of the sandbox's container
)

// The errors of snapshots, checked with [errors.Is], besides the VM's own
// ([ErrNotCreated], [ErrRemoved], [ErrNoSuchContainer], [ErrUnavailable],
// [ErrPodman], ...).
var (
	// ErrInvalidSnapshot: the [SnapshotOptions] or the reference given
	// to [RemoveSnapshot] were refused before Podman was called: a name
	// that is not an image reference, or that Podman would take for an
	// image ID (see [SnapshotOptions.Name]), a label Podman would not
	// carry verbatim.
	ErrInvalidSnapshot = errors.New("vm: invalid snapshot")
	// ErrImageExists: [SnapshotOptions.Name] names an image that podvm
	// did not make, and Replace is not set.
	ErrImageExists = errors.New("vm: image exists")
	// ErrNotSnapshot: [RemoveSnapshot] was given an image that is not a
	// podvm snapshot; it is left alone.
	ErrNotSnapshot = errors.New("vm: not a podvm snapshot")
	// ErrSnapshotInUse: a sandbox (a container, running or not) uses the
	// snapshot; remove it first.
	ErrSnapshotInUse = driver.ErrImageInUse
)

// SnapshotOptions are what [TakeSnapshot] takes. The zero value is a
// snapshot named by podvm.
type SnapshotOptions struct {
	// Name is the image reference to give the snapshot, name[:tag]
	// (lowercase; ":latest" when no tag; "localhost/" is added when it
	// names no registry, as Podman does); "" lets podvm choose
	// "localhost/podvm-snapshot:" and a random tag. A name that a podvm
	// snapshot has already moves to the new one; the old one is removed
	// unless a sandbox uses it (then a [RemoveSnapshot] of the name once
	// the sandbox is gone, or [Reap] with [WithSnapshots] once its owner
	// is, takes it). Snapshots taken at once under one name, by one
	// process or several, leave one image under it, the one Podman named
	// last; the others go as an old one does.
	//
	// A name without a registry whose repository is hex digits alone
	// ("abc", "cafe:v1", an image's 64-digit ID) or "sha256" is refused
	// with [ErrInvalidSnapshot]: Podman resolves such a reference as an
	// image ID, or a prefix of one (a single digit will do), so the
	// snapshot could not be named by it. "localhost/abc" is not refused.
	Name string
	// Replace lets Name be taken from an image that podvm did not make:
	// that image keeps its ID and its other names, and is never removed.
	// Without it, such a name is [ErrImageExists].
	Replace bool
	// Labels are added to the snapshot's labels (podvm's own cannot be
	// overridden). Podman carries a value verbatim only when it has no
	// comma, quote, backslash or blank: others are [ErrInvalidSnapshot].
	Labels map[string]string
}

// Snapshot is an image [TakeSnapshot] made, as it returns it and
// [ListSnapshots] lists it. [TakeSnapshot] makes an image of a created sandbox's
// filesystem, which [Config.Image] then names for fresh sandboxes (a
// [Pool]'s too), so that what every sandbox needs (modules fetched, a
// build cache warmed, a toolchain installed) is prepared once. Podman
// commits the sandbox's container without pausing it.
//
// A snapshot holds the container's writable layer on top of its image:
// every file the sandbox wrote to its own filesystem. It does not hold
// what is not in that layer: the contents of bind mounts ([Config.Mounts]:
// their mount points stay, empty), the tmpfs mounts (/tmp, /var/tmp and
// /run under [Config.ReadOnlyRootfs], whose root filesystem holds nothing
// the sandbox wrote), running processes, nor the agent's channel (the
// container's stdio). podvm's agent, at /.podvm, is not in it when it was
// bind-mounted (the service is on this machine: the snapshot has an empty
// /.podvm); when the service is remote the agent was copied into the
// container's layer, so the snapshot holds it (about 2.4 MB), and a
// sandbox made from it gets the agent copied over it again, so that a
// snapshot taken by one podvm works with another. The image's config is
// the sandbox's, as Podman commits it: its Env, Workdir and User, and its
// labels (podvm's, see below, and the sandbox's [Config.Labels]), become
// the image's, and so the defaults of the sandboxes made from it; its
// entrypoint is podvm's, so the image is for podvm's sandboxes. A secret
// the preparation needs (a token to fetch modules) belongs in the Run's
// [github.com/podvm/podvm/exec.Command] Env, which no snapshot holds, not
// in Config.Env, which every snapshot and every sandbox made from it would
// carry.
//
// A file being written while the snapshot is taken may be captured
// part-written: let the writers finish (a Run that returned has) before
// taking it. A Run in flight goes on undisturbed.
//
// Every snapshot carries the labels [LabelSnapshot] ("true"),
// [LabelSnapshotSource] (the sandbox's container ID), [LabelOwner],
// [LabelOwnerPID], [LabelOwnerHost] and [LabelCreated] of the process
// that took it, and [LabelManaged] set to "", so that a container made
// from it outside podvm is never taken for a podvm sandbox.
// [ListSnapshots] lists them, [RemoveSnapshot] removes one, and [Reap]
// with [WithSnapshots] removes those whose owner is gone.
type Snapshot struct {
	// Image is the reference to set as [Config.Image]: the name it was
	// taken under, in full ("localhost/name:tag"), or, as listed, its
	// first name; its ID when it has no name any more.
	Image string
	// ID is the image's ID.
	ID string
	// Names are all its names, as listed; none when another snapshot
	// took its name.
	Names []string
	// Source is the ID of the container of the sandbox it was taken from.
	Source string
	// Created is when it was taken, to the second.
	Created time.Time
	// OwnerPID and OwnerHost are the process that took it and its host.
	OwnerPID  int
	OwnerHost string
	// Labels are its labels: as [ListSnapshots] lists it, all of them;
	// as [TakeSnapshot] returns it, those it gave it (podvm's and
	// [SnapshotOptions.Labels]), without those the image has from the
	// sandbox (its [Config.Labels]), which would cost Podman one more
	// call.
	Labels map[string]string
}

// Snapshotter is implemented by a [VM] that can snapshot its sandbox:
// [APIVM] and [CLIVM]. [TakeSnapshot] and [RemoveSnapshot] check their
// arguments, then call it; a VM that is not a Snapshotter, or a method
// that returns an error matching [ErrNotSupported], cannot snapshot.
// Each method keeps the promises, errors included, of the function of
// the same name.
type Snapshotter interface {
	Snapshot(ctx context.Context, opts SnapshotOptions) (*Snapshot, error)
	RemoveSnapshot(ctx context.Context, ref string) error
}

var (
	_ Snapshotter = (*APIVM)(nil)
	_ Snapshotter = (*CLIVM)(nil)
)

// TakeSnapshot makes an image of the filesystem of v, a created sandbox
// ([Snapshot] says what it holds and what not), and returns it; v keeps
// running, and Runs in flight are not disturbed. Errors: v not created
// [ErrNotCreated], removed [ErrRemoved] (also when Remove comes while
// the snapshot is taken), its container gone [ErrNoSuchContainer]; an
// invalid name or label [ErrInvalidSnapshot]; a name of an image that
// podvm did not make [ErrImageExists] (see [SnapshotOptions.Replace]); a
// VM that cannot [ErrNotSupported]; Podman's failure to commit (its
// storage full, say) [ErrPodman]. When it fails, it removes whatever
// part of the snapshot Podman made (found by a label of its own) before
// it returns; one that Podman completes after ctx ended carries the
// labels [Reap] with [WithSnapshots] looks for.
func TakeSnapshot(ctx context.Context, v VM, opts SnapshotOptions) (*Snapshot, error) {
	if _, _, err := opts.reference(); err != nil {
		return nil, err
	}
	s, ok := capability[Snapshotter](v)
	if !ok {
		return nil, fmt.Errorf("%w: snapshot: %T cannot take snapshots", ErrNotSupported, v)
	}
	return s.Snapshot(ctx, opts)
}

// RemoveSnapshot removes the snapshot image ref, with the Podman v uses,
// in any state of v (uncreated or removed too). ref is its full ID
// ([Snapshot.ID], 64 hex digits) or a name, checked as
// [SnapshotOptions.Name] is and completed as it is ("x" is
// "localhost/x:latest"); anything else is [ErrInvalidSnapshot] before
// Podman is called. A name of a snapshot that has others is untagged;
// the image goes with its last name. Given a name, it also removes the
// snapshots that lost that name to another and that no sandbox uses any
// more, whatever becomes of the name's own image. It refuses an image
// that podvm's labels do not mark as a snapshot with [ErrNotSnapshot],
// and one a container uses with [ErrSnapshotInUse] (remove its
// sandboxes first); a snapshot already gone is [ErrImageNotFound]; a VM
// that cannot [ErrNotSupported].
func RemoveSnapshot(ctx context.Context, v VM, ref string) error {
	if _, _, err := removeRef(ref); err != nil {
		return err
	}
	s, ok := capability[Snapshotter](v)
	if !ok {
		return fmt.Errorf("%w: remove snapshot: %T cannot take snapshots", ErrNotSupported, v)
	}
	return s.RemoveSnapshot(ctx, ref)
}

// ListSnapshots lists the podvm snapshots of the Podman the options
// choose, found as [New] finds it, oldest first. [WithLabel] narrows the
// list to those that carry a label. Snapshots removed while it lists do
// not fail it (Podman's list does then; it is asked again): they are
// listed or not.
func ListSnapshots(ctx context.Context, opts ...Option) ([]Snapshot, error) {
	o := newOptions(opts)
	d, err := o.driver(ctx)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	im, ok := d.(driver.Imager)
	if !ok {
		return nil, fmt.Errorf("%w: list snapshots", ErrNotSupported)
	}
	list, err := listSnapshots(ctx, im)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(list, func(s Snapshot) bool { return !hasLabels(s.Labels, o.labels) }), nil
}

// Snapshot implements [Snapshotter]; see [TakeSnapshot].
func (s *sandbox) Snapshot(ctx context.Context, opts SnapshotOptions) (*Snapshot, error) {
	repo, tag, err := opts.reference()
	if err != nil {
		return nil, err
	}
	st, err := s.container()
	if err != nil {
		return nil, err
	}
	im, ok := s.d.(driver.Imager)
	if !ok {
		return nil, fmt.Errorf("%w: snapshot: the backend cannot commit a container", ErrNotSupported)
	}
	snap, err := takeSnapshot(ctx, im, st.id, repo, tag, opts)
	if err != nil && s.state().removed {
		return nil, fmt.Errorf("%w: snapshot of %.12s: %w", ErrRemoved, st.id, err)
	}
	return snap, err
}

// RemoveSnapshot implements [Snapshotter]; see [RemoveSnapshot].
func (s *sandbox) RemoveSnapshot(ctx context.Context, ref string) error {
	if _, _, err := removeRef(ref); err != nil {
		return err
	}
	im, ok := s.d.(driver.Imager)
	if !ok {
		return fmt.Errorf("%w: remove snapshot: the backend cannot commit a container", ErrNotSupported)
	}
	return removeSnapshot(ctx, im, ref)
}

// removeSnapshot removes snapshot ref, naming the sandboxes' trouble in
// the error.
func removeSnapshot(ctx context.Context, im driver.Imager, ref string) error {
	full, name, err := removeRef(ref)
	if err != nil {
		return err
	}
	if name {
		// Whatever becomes of the name's image: the snapshots that lost
		// the name earlier, while a sandbox used them, go once unused.
		defer removeLostName(ctx, im, full, "")
	}
	img, err := im.ImageDetails(ctx, full)
	if err != nil {
		return err
	}
	if img.Labels[LabelSnapshot] != "true" {
		return fmt.Errorf("%w: remove snapshot %s: image %.12s has no %s=true label; podvm leaves it alone", ErrNotSnapshot, ref, img.ID, LabelSnapshot)
	}
	err = im.RemoveImage(ctx, full)
	if errors.Is(err, ErrSnapshotInUse) {
		return fmt.Errorf("%w: remove snapshot %s: a sandbox made from it still exists; remove it first: %w", ErrSnapshotInUse, ref, err)
	}
	return err
}

// takeSnapshot commits container id as repo:tag.
func takeSnapshot(ctx context.Context, im driver.Imager, id, repo, tag string, opts SnapshotOptions) (*Snapshot, error) {
	ref := repo + ":" + tag
	if opts.Name != "" { // podvm's own names are random: none is taken
		old, err := im.ImageDetails(ctx, ref)
		switch {
		case errors.Is(err, ErrImageNotFound):
		case err != nil:
			return nil, err
		case old.Labels[LabelSnapshot] != "true" && !opts.Replace:
			return nil, fmt.Errorf("%w: snapshot as %s: image %.12s has that name and podvm did not make it; set SnapshotOptions.Replace to take the name", ErrImageExists, ref, old.ID)
		}
	}
	token := randomHex()
	labels := snapshotLabels(id, token, opts.Labels)
	changes := make([]string, 0, len(labels))
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		changes = append(changes, "LABEL "+k+"="+labels[k])
	}
	imgID, err := im.Commit(ctx, id, repo, tag, changes)
	if err != nil {
		// With a context of its own: ctx may be what ended the commit.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if rmErr := removeByLabel(cctx, im, labelToken+"="+token); rmErr != nil {
			err = errors.Join(err, fmt.Errorf("vm: removing what the failed snapshot made: %w", rmErr))
		}
		return nil, err
	}
	if opts.Name != "" {
		removeLostName(ctx, im, ref, imgID)
	}
	snap := snapshotOf(driver.Image{ID: imgID, Names: []string{ref}, Labels: labels})
	return &snap, nil
}

// removeLostName removes the snapshots that lost name (repo:tag) to
// another image and have no other name, except keep (the image just
// named) and those a sandbox uses, which a later call removes once
// unused (a RemoveSnapshot of name, or Reap, which finds them by their
// labels). Podman's history of an image's names tells which lost
// it: an image that a commit made and has yet to name has none, so a
// snapshot being taken under name at the same time, here or by another
// process, is left alone. Whichever of the snapshots taken at once
// under one name Podman names last keeps it; the others are removed by
// the call that took the name from them, which lists after naming its
// own. Another commit or removal on the same storage can make one
// removal fail (see driver.Imager.Commit): it tries three times.
func removeLostName(ctx context.Context, im driver.Imager, name, keep string) {
	imgs, err := im.Images(ctx, LabelSnapshot+"=true")
	if err != nil {
		return
	}
	for _, img := range imgs {
		if img.ID == keep || len(img.Names) > 0 || img.Labels[LabelSnapshot] != "true" || !slices.Contains(img.History, name) {
			continue
		}
		for try := 0; try < 3; try++ {
			err := im.RemoveImage(ctx, img.ID)
			if err == nil || errors.Is(err, ErrImageNotFound) || errors.Is(err, ErrSnapshotInUse) || !sleepCtx(ctx, 100*time.Millisecond) {
				break
			}
		}
	}
}

// snapshotLabels are the labels of a snapshot of container id.
func snapshotLabels(id, token string, user map[string]string) map[string]string {
	l := maps.Clone(user)
	if l == nil {
		l = map[string]string{}
	}
	l[LabelSnapshot] = "true"
	l[LabelSnapshotSource] = id
	l[LabelManaged] = ""
	setOwner(l)
	l[LabelCreated] = strconv.FormatInt(time.Now().Unix(), 10)
	l[labelToken] = token
	return l
}

// snapshotOf describes a snapshot image.
func snapshotOf(img driver.Image) Snapshot {
	s := Snapshot{ID: img.ID, Names: img.Names, Labels: img.Labels, Source: img.Labels[LabelSnapshotSource],
		OwnerHost: img.Labels[LabelOwnerHost], Image: img.ID}
	if len(img.Names) > 0 {
		s.Image = img.Names[0]
	}
	s.OwnerPID, _ = strconv.Atoi(img.Labels[LabelOwnerPID])
	if t, err := strconv.ParseInt(img.Labels[LabelCreated], 10, 64); err == nil {
		s.Created = time.Unix(t, 0)
	} else {
		s.Created = img.Created
	}
	return s
}

// listSnapshots lists the podvm snapshots, oldest first.
func listSnapshots(ctx context.Context, im driver.Imager) ([]Snapshot, error) {
	imgs, err := im.Images(ctx, LabelSnapshot+"=true")
	if err != nil {
		return nil, err
	}
	var out []Snapshot
	for _, img := range imgs {
		if img.Labels[LabelSnapshot] == "true" {
			out = append(out, snapshotOf(img))
		}
	}
	slices.SortFunc(out, func(a, b Snapshot) int { return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.ID, b.ID)) })
	return out, nil
}
