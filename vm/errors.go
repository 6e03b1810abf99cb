package vm

import "errors"

// Sentinel errors, checked with [errors.Is]. Backend errors wrap one of
// them and, where there is one, the native error (an *exec.Result's
// stderr for the CLI, the libpod error for the API).
var (
	// ErrInvalidConfig: the Config was refused before Podman was called.
	ErrInvalidConfig = errors.New("vm: invalid config")
	// ErrNotCreated: the VM was used before Create succeeded.
	ErrNotCreated = errors.New("vm: sandbox not created")
	// ErrAlreadyCreated: Create was called on a VM that exists.
	ErrAlreadyCreated = errors.New("vm: sandbox already created")
	// ErrRemoved: the VM was used after Remove.
	ErrRemoved = errors.New("vm: sandbox removed")
	// ErrNoSuchContainer: Podman does not know the sandbox's container
	// (removed behind the VM's back, or never made).
	ErrNoSuchContainer = errors.New("vm: no such container")
	// ErrContainerNotRunning: the container exists but has stopped.
	ErrContainerNotRunning = errors.New("vm: container is not running")
	// ErrImageNotFound: the image is not present and the pull policy does
	// not allow fetching it, or no registry has it.
	ErrImageNotFound = errors.New("vm: image not found")
	// ErrNameInUse: another container already has the configured Name.
	ErrNameInUse = errors.New("vm: container name already in use")
	// ErrUnavailable: the Podman service or binary cannot be reached.
	ErrUnavailable = errors.New("vm: podman unavailable")
	// ErrPodman: Podman failed in a way no other sentinel describes.
	ErrPodman = errors.New("vm: podman failed")
	// ErrNotSupported: the backend or server cannot do this at all.
	ErrNotSupported = errors.New("vm: not supported")
)
