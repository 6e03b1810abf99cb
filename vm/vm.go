package vm

import (
	"context"
	"io"

	"github.com/podvm/podvm/exec"
)

// VM is a throw-away sandbox that runs commands. Its lifecycle:
//
//  1. A constructor ([NewCLIVM], [NewAPIVM], [New]) validates the [Config];
//     nothing exists in Podman yet.
//  2. Create makes and starts the sandbox.
//  3. Run, CopyIn and CopyOut use it, from any number of goroutines.
//  4. Remove deletes it, with everything that runs in it.
//
// A VM is an [exec.Executor]: commands keep the exec contract (argv only,
// exit status as data, capped capture, timeouts that kill the command and
// its children inside the sandbox).
type VM interface {
	// Create creates and starts the sandbox, pulling the image as the
	// config's [PullPolicy] says. It fails with [ErrAlreadyCreated] when
	// called twice. When it fails or is cancelled midway, whatever it made
	// is removed before it returns, and Remove is still safe to call.
	Create(ctx context.Context) error

	// Run runs cmd inside the sandbox and waits for it, keeping the
	// [exec.Executor] contract. Command.Env is added to the config's Env
	// (the command wins); the host's environment never enters. An empty
	// Command.Dir means the config's Workdir. When the timeout or ctx ends
	// the run, the command and every process it started inside the sandbox
	// are killed before Run returns. Run before Create fails with
	// [ErrNotCreated], after Remove with [ErrRemoved]; a Run that Remove
	// cuts short returns what it captured and an error matching
	// [ErrRemoved]. Concurrent calls are safe and each gets its own Result.
	Run(ctx context.Context, cmd exec.Command) (*exec.Result, error)

	// CopyIn extracts the tar stream r into directory dir of the sandbox,
	// which must exist. Entries that would land outside dir are refused.
	CopyIn(ctx context.Context, dir string, r io.Reader) error

	// CopyOut writes path (a file or a directory, recursively) of the
	// sandbox to w as a tar stream whose entries are named relative to
	// path's parent, as `tar -C parent -c base` would.
	CopyOut(ctx context.Context, path string, w io.Writer) error

	// Remove stops and deletes the sandbox and everything running in it.
	// It is idempotent: it succeeds when the sandbox is already gone, was
	// never created, or Create failed or was cancelled. After Remove, Run
	// and the copies fail with [ErrRemoved].
	Remove(ctx context.Context) error

	// ID is the container's ID once Create succeeded, "" before.
	ID() string
}

// Every VM is an exec.Executor.
var _ exec.Executor = VM(nil)

//go:generate go tool mockgen -destination vmmock/vmmock.go -package vmmock -typed . VM
