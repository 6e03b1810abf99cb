package vm

import (
	"errors"

	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/podman"
)

// Sentinel errors, checked with [errors.Is]. Backend errors wrap one of
// them and, where there is one, the native error (an *exec.Result's
// stderr for the CLI, the libpod error for the API).
var (
	// ErrInvalidConfig: the Config was refused before Podman was called.
	ErrInvalidConfig = podman.ErrInvalidConfig
	// ErrNotCreated: the VM was used before Create succeeded.
	ErrNotCreated = errors.New("vm: sandbox not created")
	// ErrAlreadyCreated: Create was called on a VM that exists.
	ErrAlreadyCreated = errors.New("vm: sandbox already created")
	// ErrRemoved: the VM was used after Remove.
	ErrRemoved = errors.New("vm: sandbox removed")
	// ErrNoSuchContainer: Podman does not know the sandbox's container
	// (removed behind the VM's back, or never made).
	ErrNoSuchContainer = podman.ErrNoSuchContainer
	// ErrContainerNotRunning: the container exists but has stopped.
	ErrContainerNotRunning = podman.ErrContainerNotRunning
	// ErrImageNotFound: the image is not present and the pull policy does
	// not allow fetching it, or no registry has it.
	ErrImageNotFound = podman.ErrImageNotFound
	// ErrNameInUse: another container already has the configured Name.
	ErrNameInUse = podman.ErrNameInUse
	// ErrUnavailable: the Podman service or binary cannot be reached.
	ErrUnavailable = podman.ErrUnavailable
	// ErrPodman: Podman failed in a way no other sentinel describes.
	ErrPodman = podman.ErrPodman
	// ErrNotSupported: the backend or server cannot do this at all.
	ErrNotSupported = podman.ErrNotSupported
)

// CLIError is a podman invocation that failed: [CLIVM]'s errors wrap one,
// next to the sentinel it was mapped to, so that [errors.As] reaches what
// podman said: its subcommand (Op: "run", "exec", "cp", "rm"), its exit
// status (ExitCode) and its standard error as captured (Stderr). Its
// Error is "podman OP exited CODE: " and podman's error lines.
type CLIError = podman.CLIError

// APIError is a request to the Podman service that failed: [APIVM]'s
// errors wrap one, next to the sentinel it was mapped to, so that
// [errors.As] reaches what the service answered (its HTTP status, libpod's
// cause and message) or, when no answer came, the transport's error.
type APIError = libpod.Error
