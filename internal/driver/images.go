package driver

import (
	"context"
	"errors"
	"time"
)

// This file is an optional capability of a [Driver], as database/sql/driver
// declares its own: snapshots, a commit of a container and the images it
// makes. Package vm checks a driver for it; one without it answers
// ErrNotSupported.

// ErrImageInUse: an image could not be removed because a container uses
// it. Package vm reports it as its ErrSnapshotInUse.
var ErrImageInUse = errors.New("vm: image in use by a container")

// Imager is what a [Driver] that can snapshot a container offers: a
// commit, and the images it makes, listed, inspected and removed.
type Imager interface {
	// Commit makes an image named repo:tag of container id's filesystem,
	// without pausing it, with changes (Dockerfile instructions, no
	// commas) applied to its config, and returns the image's ID.
	Commit(ctx context.Context, id, repo, tag string, changes []string) (string, error)
	// ImageDetails describes image ref, or fails with [ErrImageNotFound].
	// Another image that goes away meanwhile does not fail it (see
	// [Imager.Images]).
	ImageDetails(ctx context.Context, ref string) (Image, error)
	// Images lists the images carrying label ("key=value"). An image
	// removed while the engine lists does not fail the list.
	Images(ctx context.Context, label string) ([]Image, error)
	// RemoveImage removes image ref without force: one name of an image
	// with several is untagged; an image a container uses is refused with
	// [ErrImageInUse]; one already gone is [ErrImageNotFound].
	RemoveImage(ctx context.Context, ref string) error
}

// Image is an image as [Imager] describes it.
type Image struct {
	ID    string
	Names []string // its names ("localhost/name:tag"); none for a dangling image
	// History is every name it has had, those it lost too (Podman's
	// NamesHistory); none while a commit has yet to name it.
	History []string
	Labels  map[string]string
	// Created is when it was made.
	Created time.Time
}
