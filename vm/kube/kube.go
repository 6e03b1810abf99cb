// Package kube runs podvm's sandboxes on Kubernetes: one Pod per sandbox,
// the same [vm.VM] contract as the Podman backends, the same agent as
// PID 1. Importing it registers [vm.BackendKube] for [vm.New], [vm.Reap]
// and [vm.NewPool]'s default constructor; it is a package of its own so
// that client-go is linked only into programs that use it.
//
// The cluster is found as kubectl finds it: $KUBECONFIG, else
// ~/.kube/config, else the in-cluster service account; the namespace is
// the context's unless [WithNamespace] names one. No registry is needed
// for podvm itself: the agent reaches the pod through the attach of the
// sandbox's one container, whose PID 1, a shell of the sandbox's own
// image (which must have /bin/sh, sleep, dd and tar, and cat for the
// exec path; busybox will do, and Create fails with [vm.ErrNotSupported]
// naming what an image lacks), reads the agent's tar stream to the byte,
// extracts it into a volume of its own and runs it.
//
// # What a Config becomes
//
//   - Image: the container's image; Pull: imagePullPolicy (PullMissing
//     IfNotPresent, PullNever Never, PullAlways Always). ImageArchive is
//     refused: an archive cannot reach the nodes through the API server.
//   - Memory, CPUs: the container's limits (requests default to them).
//   - Pids: refused when set: Kubernetes limits processes per node
//     (kubelet's podPidsLimit), not per pod. Zero, podvm's default of
//     [vm.DefaultPids], is then the node's limit, whatever it is, and so
//     is [vm.NoPidsLimit]: the node's limit is the host's own.
//   - Mounts: refused: a hostPath is a directory of whichever node the pod
//     lands on, not of the caller. Use CopyIn.
//   - User: runAsUser and runAsGroup; numeric only ("uid" or "uid:gid").
//   - ReadOnlyRootfs: readOnlyRootFilesystem, with memory-backed emptyDirs
//     on /tmp, /var/tmp and /run, as Podman's --read-only. The agent's
//     directory, /.podvm, is an emptyDir of 128 MiB at most, writable
//     whatever ReadOnlyRootfs says: the container's PID 1 installs the
//     agent there.
//   - Network: "none" (the default) is the pod network behind a deny-all
//     NetworkPolicy (no egress; no ingress but TCP port 7337, where the
//     agent admits the caller alone, unless [WithAttachOnly]), which only
//     a network plugin that enforces policies honours: Create refuses it
//     unless the caller
//     says the cluster enforces them ([WithNetworkPolicy]) or accepts in
//     writing that it may not ([WithUnenforcedNetworkPolicy]). "pod" or
//     "bridge" is the pod network, "host" the node's; others are refused.
//   - Name: the pod's name (a DNS subdomain), else one generated from
//     "podvm-". Labels: the pod's, with podvm's own; both must be valid
//     Kubernetes labels. Env, Workdir: the container's.
//   - Always: capabilities dropped but [vm.DefaultCapabilities],
//     allowPrivilegeEscalation false, the runtime's default seccomp
//     profile, no service account token, no service links,
//     restartPolicy Never, and activeDeadlineSeconds ([WithLifetime]).
//
// Refusals match [vm.ErrNotSupported] (or [vm.ErrInvalidConfig]) and are
// made before anything is sent to the cluster.
//
// # The direct channel
//
// Where the caller reaches the pod network (it runs in the cluster or on
// a node), calls go to the agent over TCP connections to the pod's IP,
// port 7337, secured by a key that only the attach stream carried, not
// through the API server; elsewhere, or with [WithAttachOnly], they take
// the attach stream. docs/kubernetes.md says how, and what a broken
// connection does.
//
// # The exec path
//
// With [vm.Config.PodmanExec], commands run as Kubernetes exec sessions
// under a small sh script, and the copies are tar in an exec session.
// No name is read as an option by tar, cd or exec. A copy in refuses,
// with [vm.ErrUnsafeArchive], to extract through a symlink that code in
// the sandbox planted under its destination, and a directory entry
// replaces a symlink in its place, as the agent's copies do: the archive
// is spooled to a temporary file of the host, removed before the call
// returns, so that the script can look at those paths before tar runs. A
// link planted while tar runs is still followed, within the sandbox.
//
// # Nothing outlives its owner for long
//
// The agent's stdin is the attach the VM holds (stdinOnce): when the
// process that made the sandbox dies, its connection ends, the agent
// sees its stdin close, kills everything and exits, and the pod ends
// (the exec path's cat does the same). The pod object is left, ended,
// for [vm.Reap], which removes an ended pod (phase Succeeded or Failed)
// whoever made it, from whatever machine it runs on; and whatever
// happens to connections, the kubelet kills a pod older than its
// activeDeadlineSeconds, [DefaultLifetime] unless [WithLifetime] says.
package kube

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/podvm/podvm/internal/driver"
	ikube "github.com/podvm/podvm/internal/kube"
	"github.com/podvm/podvm/vm"
)

// DefaultLifetime is how long a pod may run unless [WithLifetime] says:
// its activeDeadlineSeconds.
const DefaultLifetime = 24 * time.Hour

// Option configures [New] and [Backend].
type Option func(*options)

type options struct {
	kubeconfig, context, namespace, runtimeClass string
	lifetime                                     time.Duration
	policy                                       policyMode
	attachOnly                                   bool
}

type policyMode int

const (
	policyRefuse     policyMode = iota // Network "none" is refused
	policyEnforced                     // the caller says policies are enforced
	policyUnenforced                   // the caller accepts they may not be
)

// WithKubeconfig reads the cluster's configuration from the file path
// instead of $KUBECONFIG or ~/.kube/config.
func WithKubeconfig(path string) Option { return func(o *options) { o.kubeconfig = path } }

// WithContext uses the kubeconfig's context name instead of its current
// one.
func WithContext(name string) Option { return func(o *options) { o.context = name } }

// WithNamespace makes the pods in namespace instead of the context's.
func WithNamespace(namespace string) Option { return func(o *options) { o.namespace = namespace } }

// WithRuntimeClass runs the pods under RuntimeClass name (gVisor's,
// Kata's: a stronger boundary than runc's namespaces).
func WithRuntimeClass(name string) Option { return func(o *options) { o.runtimeClass = name } }

// WithLifetime sets the pods' activeDeadlineSeconds (default
// [DefaultLifetime]): the kubelet kills a pod that has run longer, used or
// not, so the pods of a caller that crashed die without anyone calling
// Reap. Kubernetes can shorten a deadline but never extend it.
func WithLifetime(d time.Duration) Option { return func(o *options) { o.lifetime = d } }

// WithNetworkPolicy declares that the cluster's network plugin enforces
// NetworkPolicy: Network "none" becomes a deny-all policy on the pod, and
// means no traffic in or out. Create then also waits for the pod's status
// to name its IP before anything of the caller's runs there: plugins that
// find pods by that IP (kube-router, kube-network-policies) enforce
// nothing for a pod before, and the kubelet reports it up to a second
// after the container runs. The wait narrows that window to the plugin's
// own lag; see "What holds" in docs/kubernetes.md.
func WithNetworkPolicy() Option { return func(o *options) { o.policy = policyEnforced } }

// WithUnenforcedNetworkPolicy accepts, in writing, that Network "none"
// may not hold: the pod gets its deny-all policy, but on a cluster whose
// network plugin does not enforce policies (the plain CNI bridge, say)
// it still reaches the pod network and whatever that reaches.
func WithUnenforcedNetworkPolicy() Option { return func(o *options) { o.policy = policyUnenforced } }

// WithAttachOnly makes every call of the sandboxes take the API
// server's attach stream, never a direct connection to the pod's agent
// (see "The direct channel" in docs/kubernetes.md): for a caller that
// knows it does not reach the pod network, which then tries no
// connection to find it out, or one whose rules forbid connections to
// pods. Network "none"'s policy then lets nothing in.
func WithAttachOnly() Option { return func(o *options) { o.attachOnly = true } }

func newOptions(opts []Option) options {
	o := options{lifetime: DefaultLifetime}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

func init() { driver.Register(string(vm.BackendKube), opener(options{lifetime: DefaultLifetime})) }

// New returns a VM for cfg, not yet created, as a Pod on the cluster the
// options (or kubectl's defaults) name: it is [vm.New] with the backend
// [Backend] returns for the options. It fails with an error matching
// [vm.ErrInvalidConfig] or [vm.ErrNotSupported] for a config the backend
// cannot honour (see the package's documentation), before any request,
// and with [vm.ErrUnavailable] when there is no cluster configuration.
// It makes no request itself: an unreachable API server shows in Create.
func New(ctx context.Context, cfg vm.Config, opts ...Option) (vm.VM, error) {
	return vm.New(ctx, cfg, vm.WithBackend(Backend(opts...)))
}

var backends sync.Map // options → the name registered for them

// Backend returns the name of the Kubernetes backend the options
// describe, registered for [vm.WithBackend]: [vm.New] then makes its
// sandboxes there and [vm.Reap] reaps there. Backend() with no option is
// [vm.BackendKube].
func Backend(opts ...Option) vm.Backend {
	o := newOptions(opts)
	if name, ok := backends.Load(o); ok {
		return name.(vm.Backend)
	}
	if o == (options{lifetime: DefaultLifetime}) {
		return vm.BackendKube
	}
	name := vm.Backend(fmt.Sprintf("kube:%q:%q:%q:%q:%v:%d:%v", o.kubeconfig, o.context, o.namespace, o.runtimeClass, o.lifetime, o.policy, o.attachOnly))
	if prev, loaded := backends.LoadOrStore(o, name); loaded {
		return prev.(vm.Backend)
	}
	driver.Register(string(name), opener(o))
	return name
}

// opener is the driver.Opener of the options: it refuses a spec the
// options cannot honour (ikube.Check), then connects.
func opener(o options) driver.Opener {
	return func(ctx context.Context, spec *driver.Spec) (driver.Driver, error) {
		iopts := ikube.Options{RuntimeClass: o.runtimeClass, Lifetime: o.lifetime, DenyAll: o.policy != policyRefuse, AttachOnly: o.attachOnly,
			Enforced: o.policy == policyEnforced}
		if spec != nil {
			if err := ikube.Check(*spec, iopts); err != nil {
				return nil, err
			}
		}
		if o.lifetime <= 0 {
			return nil, fmt.Errorf("%w: kube: lifetime %v: want a positive duration", vm.ErrInvalidConfig, o.lifetime)
		}
		cl, ns, err := connect(o)
		if err != nil {
			return nil, err
		}
		iopts.Namespace = ns
		return ikube.New(cl, iopts), nil
	}
}

type clientKey struct{ kubeconfig, context string }

type client struct {
	c  *ikube.Client
	ns string
}

var clients sync.Map // clientKey → client

// connect returns the client of o's cluster, made once per process and
// configuration: client-go's connections are shared by every sandbox.
func connect(o options) (*ikube.Client, string, error) {
	k := clientKey{o.kubeconfig, o.context}
	if c, ok := clients.Load(k); ok {
		cl := c.(client)
		return cl.c, namespace(o, cl.ns), nil
	}
	c, ns, err := ikube.Connect(o.kubeconfig, o.context, "")
	if err != nil {
		return nil, "", err
	}
	actual, _ := clients.LoadOrStore(k, client{c, ns})
	cl := actual.(client)
	return cl.c, namespace(o, cl.ns), nil
}

func namespace(o options, dflt string) string {
	if o.namespace != "" {
		return o.namespace
	}
	return dflt
}
