// Package driver is the seam between podvm's sandbox (package vm, which
// writes the contract once) and the engines that run sandboxes: the
// [Driver] interface, what it takes ([Spec], [Process]) and gives
// ([Container]), and the errors its calls match. It belongs to no engine:
// internal/podman implements it twice (the REST API, the CLI) and
// internal/kube once (a Pod per sandbox).
package driver

import (
	"context"
	"errors"
	"io"
)

// Driver is what differs between engines: what package vm needs of one
// to keep its contract (the lifecycle, Run, the kill of a stopped run, the
// copies), written once over a Driver. Every method is bounded by its
// ctx. Errors match the sentinel the engine's answer means, or
// [ErrUnavailable] when the engine could not be reached, and wrap the
// native error (the engine's own); a context's error is wrapped as is.
// What only some engines can do is an optional interface a Driver may
// also implement, as database/sql/driver declares its own: [Limiter],
// [Imager], [Addresser].
type Driver interface {
	// Image returns the architecture (a GOARCH) of image ref, or an error
	// matching [ErrImageNotFound] when it is not present.
	Image(ctx context.Context, ref string) (arch string, err error)
	// Fetch makes image present: it loads the image archive file archive
	// when set, else pulls image.
	Fetch(ctx context.Context, image, archive string) error
	// Local reports whether the containers run on this machine, where a
	// bind mount reaches the caller's files, and names the service (a
	// unix socket can still lead to another filesystem).
	Local() (bool, string)
	// Create creates a container as spec says and returns its ID: started,
	// PID 1 being Podman's init, unless spec.Agent is set, which leaves it
	// created. When it fails, something may have been made: the caller
	// removes it by label.
	Create(ctx context.Context, spec Spec) (string, error)
	// Attach attaches to the stdio of created container id, then starts
	// it: reading the stream yields its stdout, writing feeds its stdin.
	// Closing it detaches.
	Attach(ctx context.Context, id string) (io.ReadWriteCloser, error)
	// Start starts created container id, attaching nothing.
	Start(ctx context.Context, id string) error
	// Exec runs p in container id as a Podman exec session and returns
	// its exit status once the output is drained and the session ended.
	// started reports that the session began (the command may have run).
	// When ctx ends first it returns promptly, leaving what runs to the
	// caller's kill, or, when p.Stop is set and the driver would drop
	// output still on its way if it cut the session then, calls p.Stop
	// and lets the session drain, a short while at most, before it
	// returns. The engine's own failure to start the command (not found,
	// not executable, a missing working directory) is an error, started
	// false, matching exec.ErrNotFound, exec.ErrPermission or
	// exec.ErrDirNotFound (or the sentinel of the engine's own trouble):
	// the driver tells it from the command's own exit, which is returned
	// as it is.
	Exec(ctx context.Context, id string, p Process) (code int, started bool, err error)
	// CopyIn extracts the tar stream r into directory dir of container
	// id. dir is a name, never a pattern, whatever bytes it holds
	// (paths.go); a missing dir matches fs.ErrNotExist.
	CopyIn(ctx context.Context, id, dir string, r io.Reader) error
	// CopyOut writes path of container id to w as a tar stream. path is
	// a name, never a pattern (paths.go); where Podman cannot be made to
	// name it alone the error matches [ErrNotSupported], and another
	// file's data is never sent. Podman's archive leaves sockets out
	// without a word (buildah's copier, copierHandlerGet: "copier:
	// skipping socket", logged by the service only): a tree holding one
	// arrives without it, and the driver cannot tell.
	CopyOut(ctx context.Context, id, path string, w io.Writer) error
	// Remove force-removes container id; one already gone is no error,
	// and one that exits by itself meanwhile is removed still.
	Remove(ctx context.Context, id string) error
	// List returns the containers carrying label ("key=value").
	List(ctx context.Context, label string) ([]Container, error)
	// Close releases what the driver keeps open between calls.
	Close()
}

// Addresser is a Driver whose containers have network addresses of
// their own that the caller may reach directly (a pod's IP, which the
// caller reaches when it runs in the cluster or on a node, or the pod
// network is routed to it). package vm then dials the sandbox's agent
// there (its peers, package agent), and uses the channel [Driver.Attach]
// made only while no such connection answers. A container's own
// address, as its agent finds it on its interfaces, is one the caller
// may dial as well, while Address has none yet: package vm does when the
// agent finds exactly one.
type Addresser interface {
	// Address returns the IP address of running container id, or ""
	// when it has none yet; an error when its containers offer none to
	// dial (a pod on its node's network).
	Address(ctx context.Context, id string) (string, error)
}

// Spec is a sandbox for [Driver.Create], the one form in which a driver
// sees the caller's config (vm maps its Config here, once, defaults
// applied): its labels and what its PID 1 is. A driver honours every
// field or refuses it, when opened ([Opener]) and again in Create, with
// an error matching [ErrNotSupported] or [ErrInvalidConfig].
type Spec struct {
	Name           string            // the container's name; "" lets the engine choose
	Image          string            // present already, when Create is called
	Pull           string            // when the image is fetched: [PullMissing], [PullNever] or [PullAlways]
	ImageArchive   string            // a file of the caller's machine the image is loaded from, or ""
	Labels         map[string]string // on the container
	Env            []string          // KEY=VALUE, on top of the image's
	Workdir, User  string            // "" for the image's
	Network        string            // a mode ("none", "host", "container:NAME") or a network's name
	Memory         int64             // bytes, swap included; 0: no limit
	CPUs           float64           // 0: no limit
	Pids           int64             // the pids limit; 0: [DefaultPids]; -1: none
	ReadOnlyRootfs bool              // with writable tmpfs on /tmp, /var/tmp and /run
	Capabilities   []string          // the only ones kept; all others are dropped
	Mounts         []Mount           // bind mounts
	// Agent, when set, is the program in the container that is its PID 1
	// (as the container's user, stdin open, stdio not logged), and the
	// container is left created for [Driver.Attach] to start. Otherwise
	// PID 1 is Podman's init in pause mode ([initEntrypoint]).
	Agent string
	// AgentArgs are the agent's arguments.
	AgentArgs []string
}

// DefaultPids is the pids limit of a [Spec] whose Pids is zero: room for
// a parallel build, not for a fork bomb.
const DefaultPids = 1024

// When an image is fetched ([Spec.Pull]).
const (
	PullMissing = "missing" // only when it is not present
	PullNever   = "never"   // never: its absence is [ErrImageNotFound]
	PullAlways  = "always"  // before every create
)

// Mount is a bind mount of Source, on the Podman host, at Target.
type Mount struct {
	Source, Target string
	ReadOnly       bool
}

// Process is one command for [Driver.Exec], as Podman's exec takes it.
type Process struct {
	Argv    []string
	Env     []string // the command's env; the container's is the base
	Workdir string   // "" for the container's
	User    string   // "" for the container's
	Stdin   io.Reader
	Stdout  io.Writer
	Stderr  io.Writer
	// Stop, when set, kills what the command started in the container
	// (the caller's kill, done once however often it is called): see
	// [Driver.Exec].
	Stop func()
}

// Container is a sandbox as [Driver.List] finds it: its ID, labels,
// whether it has ended, and its state. The JSON names are Podman's, as both `podman ps
// --format json` and its REST API spell them.
type Container struct {
	ID     string            `json:"Id"`
	Labels map[string]string `json:"Labels"`
	// Ended reports that the sandbox can never run again, whoever holds
	// it: nothing is lost by removing it. The kube driver sets it for a
	// pod whose phase is Succeeded or Failed (its restartPolicy is
	// Never). The Podman drivers never do: a stopped container can be
	// started again.
	Ended bool `json:"-"`
	// State is the engine's word for the container's state ("running",
	// "exited", "created", ...), "" where the driver does not say.
	State string `json:"State"`
}

// The errors a driver's calls match, with errors.Is. Package vm exports
// them under the same names (ErrEngine as vm.ErrPodman), documented
// there; their text keeps vm's prefix, since they are vm's errors.
var (
	ErrInvalidConfig       = errors.New("vm: invalid config")
	ErrNoSuchContainer     = errors.New("vm: no such container")
	ErrContainerNotRunning = errors.New("vm: container is not running")
	ErrImageNotFound       = errors.New("vm: image not found")
	ErrNameInUse           = errors.New("vm: container name already in use")
	ErrUnavailable         = errors.New("vm: engine unavailable")
	ErrEngine              = errors.New("vm: engine failed")
	ErrNotSupported        = errors.New("vm: not supported")
)

// ErrNotReached is wrapped, beside [ErrUnavailable], by a call that never
// reached the engine (no podman binary): nothing can have been made.
var ErrNotReached = errors.New("the engine was not reached")
