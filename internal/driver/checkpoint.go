package driver

import (
	"context"
	"io"
)

// This file is an optional capability of a [Driver]: checkpoints, a
// running container's processes and memory saved with CRIU and restored.
// Package vm checks a driver for it; one without it (Kubernetes: the
// kubelet can checkpoint a container, but nothing restores one) answers
// ErrNotSupported.

// Checkpointer is what a [Driver] whose engine checkpoints containers
// offers.
type Checkpointer interface {
	// CheckpointRefusal returns an error matching [ErrNotSupported] that
	// names why, when the engine says it cannot checkpoint (rootless
	// Podman: CRIU needs root), else nil. It asks the engine what it is,
	// and changes nothing.
	CheckpointRefusal(ctx context.Context) error
	// Suspend checkpoints running container id in place, with its
	// established TCP connections and file locks, and stops it: its
	// memory is freed, CRIU's images stay in the engine's storage until
	// [Checkpointer.Resume] or a removal. A failed dump leaves it
	// running. The engine's own words, CRIU's included, are in the error.
	Suspend(ctx context.Context, id string) error
	// Resume restores container id, suspended by Suspend, in place.
	Resume(ctx context.Context, id string) error
	// AttachRunning attaches to the stdio of running container id, as
	// [Driver.Attach] does, without starting it: after a Resume, the
	// stream of the agent that goes on there.
	AttachRunning(ctx context.Context, id string) (io.ReadWriteCloser, error)
	// Export checkpoints running container id with its established TCP
	// connections and file locks, leaving it running or, unless
	// leaveRunning, stopping it at the dump's end (its processes run no
	// further than the checkpoint's instant), and writes the archive
	// Podman exports (an uncompressed tar) to path, a file of the
	// caller's machine that must not exist yet; it is made mode 0600. A
	// failed dump leaves the container running, and path absent or
	// removed. The engine's own words are in the error.
	Export(ctx context.Context, id, path string, leaveRunning bool) error
	// Import makes and starts a container from the archive at path (one
	// Export wrote, its config.dump possibly rewritten by package ckpt),
	// with the ID, name and labels its config.dump holds, its established
	// TCP connections and file locks, and without the source's static IP
	// and MAC; it returns the new container's ID.
	Import(ctx context.Context, path string) (string, error)
}

// StreamImporter is what a [Checkpointer] whose engine takes an archive
// as it is read (the API's upload), with no file of the caller's, offers
// besides: an archive rewritten on its way in costs no second copy on
// disk.
type StreamImporter interface {
	// ImportStream is [Checkpointer.Import] of the archive read from r to
	// its end. An error reading r ends the upload, and the engine makes
	// nothing of what it got.
	ImportStream(ctx context.Context, r io.Reader) (string, error)
}
