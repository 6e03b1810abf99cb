package vm

import (
	"errors"

	"github.com/podvm/podvm/internal/driver"
)

// Sentinel errors, checked with [errors.Is]. Backend errors wrap one of
// them and, where there is one, the native error (an *exec.Result's
// stderr for the CLI, the libpod error for the API).
var (
	// ErrInvalidConfig: the Config was refused before Podman was called.
	ErrInvalidConfig = driver.ErrInvalidConfig
	// ErrNotCreated: the VM was used before Create succeeded.
	ErrNotCreated = errors.New("vm: sandbox not created")
	// ErrAlreadyCreated: Create was called on a VM that exists.
	ErrAlreadyCreated = errors.New("vm: sandbox already created")
	// ErrRemoved: the VM was used after Remove.
	ErrRemoved = errors.New("vm: sandbox removed")
	// ErrSuspended: the sandbox is suspended ([Suspend]); [Resume]
	// brings it back.
	ErrSuspended = errors.New("vm: sandbox suspended")
	// ErrNoSuchContainer: Podman does not know the sandbox's container
	// (removed behind the VM's back, or never made).
	ErrNoSuchContainer = driver.ErrNoSuchContainer
	// ErrContainerNotRunning: the container exists but has stopped.
	ErrContainerNotRunning = driver.ErrContainerNotRunning
	// ErrImageNotFound: the image is not present and the pull policy does
	// not allow fetching it, or no registry has it.
	ErrImageNotFound = driver.ErrImageNotFound
	// ErrNameInUse: another container already has the configured Name.
	ErrNameInUse = driver.ErrNameInUse
	// ErrUnavailable: the engine (the Podman service or binary, the
	// cluster) cannot be reached.
	ErrUnavailable = driver.ErrUnavailable
	// ErrPodman: the engine (Podman, or Kubernetes' API server and
	// kubelet) failed in a way no other sentinel describes. Its name is
	// the first engine's.
	ErrPodman = driver.ErrEngine
	// ErrNotSupported: the backend or server cannot do this at all.
	ErrNotSupported = driver.ErrNotSupported
)
