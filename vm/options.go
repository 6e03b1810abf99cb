package vm

import (
	"log/slog"
	"time"

	"github.com/podvm/podvm/exec"
)

// Backend names a [VM] implementation for [New].
type Backend string

// Backends. The zero value is BackendAuto.
const (
	BackendAuto Backend = ""    // the first socket that answers, else the CLI
	BackendAPI  Backend = "api" // APIVM only
	BackendCLI  Backend = "cli" // CLIVM only
	// BackendKube is a Pod per sandbox on the Kubernetes cluster kubectl
	// would use, in its context's namespace. It is there once package
	// github.com/podvm/podvm/vm/kube is imported (which brings client-go
	// with it), and is never chosen by BackendAuto; its constructor
	// there, kube.New, takes the options New does not have.
	BackendKube Backend = "kube"
)

// DefaultPingTimeout bounds each socket probe of [New] and [Reap].
const DefaultPingTimeout = 2 * time.Second

// DefaultSSHPingTimeout bounds, in place of [DefaultPingTimeout], the
// probe of an ssh:// service: reaching it takes two SSH key exchanges
// (podvm's host key check, then Podman's connection) before the ping.
const DefaultSSHPingTimeout = 15 * time.Second

// Option configures [New], [Reap] and [ListSnapshots].
type Option func(*options)

type options struct {
	backend     Backend
	url         string
	podman      string
	x           exec.Executor
	log         *slog.Logger
	pingTimeout time.Duration
	labels      map[string]string // Reap: required labels
	snapshots   bool              // Reap: snapshots of dead owners too
	checkpoints bool              // Reap: checkpoints of dead owners too
	// checkpointDir: where checkpoints are looked for; "" the default.
	checkpointDir string
}

// WithBackend restricts New to one backend; the default tries the API and
// falls back to the CLI.
func WithBackend(b Backend) Option { return func(o *options) { o.backend = b } }

// WithURL names the Podman service (unix://, tcp://, ssh://) instead of
// discovering one. The API backend connects to it; the CLI backend passes
// it to podman as --url. Nothing else is tried.
func WithURL(uri string) Option { return func(o *options) { o.url = uri } }

// WithPodman sets the podman binary the CLI backend runs (default
// "podman", looked up in PATH).
func WithPodman(path string) Option { return func(o *options) { o.podman = path } }

// WithExecutor sets the executor through which the CLI backend runs
// podman. The default is a host [exec.CommandExecutor] contained by
// process group only (podman's conmon must outlive the podman process
// that started it), whose environment is the process's, without
// CONTAINER_HOST and CONTAINER_CONNECTION when New falls back from a
// socket that did not answer (they would send podman to that same
// socket). An executor of your own should not kill what podman leaves
// behind either.
func WithExecutor(x exec.Executor) Option { return func(o *options) { o.x = x } }

// WithLogger receives the choice of backend of New and Reap, with the
// reasons for it, and Reap's removals. The default discards them.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithLabel restricts [Reap] to sandboxes (and, with [WithSnapshots],
// snapshots) that also carry label key=value (one of [Config.Labels] or
// [SnapshotOptions.Labels]), and [ListSnapshots] to such snapshots;
// repeat it to require several.
func WithLabel(key, value string) Option {
	return func(o *options) {
		if o.labels == nil {
			o.labels = map[string]string{}
		}
		o.labels[key] = value
	}
}

// WithPingTimeout bounds each socket probe (default, or 0:
// [DefaultPingTimeout], [DefaultSSHPingTimeout] for an ssh:// service).
func WithPingTimeout(d time.Duration) Option { return func(o *options) { o.pingTimeout = d } }

func newOptions(opts []Option) options {
	o := options{podman: "podman", log: slog.New(slog.DiscardHandler)}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}
