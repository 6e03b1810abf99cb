// Package kube is podvm's Kubernetes driver: the [driver.Driver] that makes
// one Pod per sandbox through the API server, and reaches it through the
// pod's attach and exec subresources (client-go's remotecommand:
// WebSocket, SPDY where the server lacks it). Package vm's sandbox runs
// over it as over the Podman drivers; vm/kube is its public face.
//
// How a sandbox with podvm's agent comes up, with no registry:
//
//  1. Create makes the pod (pod.go): one container, Main, from the
//     sandbox's own image, with an emptyDir at the agent's directory. Its
//     PID 1 is a gate (a shell's read of one line) in front of the
//     agent's install: the line is the size of the agent's tar stream,
//     which dd then reads from stdin, to the byte, and tar extracts into
//     the volume; then it execs the agent on the same stdin and stdout.
//  2. CopyIn of the agent's tar stream to "/" keeps it for Attach.
//  3. Attach attaches to Main's stdin and stdout (not stderr: see
//     attach), opens the gate with the size and writes the tar stream:
//     the agent's handshake is then the first thing on the stream.
//
// Attach attaches as soon as the kubelet can, trying again every 100 ms
// while it says the container is not there yet, rather than waiting for
// the pod's status (which the kubelet reports a second or more late).
//
// Main's stdin is stdinOnce: when the attach ends — Remove, or the
// caller's process died and its connection with it — the agent's stdin
// closes, and it kills everything and exits. The pod's
// activeDeadlineSeconds bounds it anyway.
//
// For Network "none", Create makes a deny-all NetworkPolicy right after
// the pod, before anything of the caller's runs in it, owned by the pod
// from its creation: the garbage collector deletes it with the pod.
//
// Without the agent (the exec path), Main runs cat on the same kind of
// stdin, held by an attach of the driver's, and each command is an exec
// session wrapped in a small sh script (exec.go): the exec API takes argv
// alone, no environment, working directory or user.
//
// Remove ends PID 1 before it deletes the pod: it closes the stdin of the
// attach the driver holds on either path, waits (5 s at most, and while
// its ctx lasts) for that attach to end, which it does once Main's
// process has exited, and only then deletes the pod with grace period 0.
// Normally, then, the API object, and so its NetworkPolicy, goes only
// once the sandbox's PID 1 has exited; and it goes at once, as a
// graceful deletion's would not. Past the wait, or without an attach
// held (Reap, or another process's Remove), the pod is deleted at once,
// and its containers may run a moment longer than its policy.
package kube

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"runtime"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podvm/podvm/internal/agent"
	"github.com/podvm/podvm/internal/driver"
)

// Client is a connection to a cluster's API server.
type Client struct {
	CS   kubernetes.Interface
	REST *rest.Config
}

// Connect loads the client configuration as kubectl does: kubeconfig
// when set, else $KUBECONFIG, else ~/.kube/config, else the in-cluster
// service account; kubecontext picks a context ("" for the current
// one). It returns the client and the namespace: namespace when set, else
// the context's (or the in-cluster pod's), else "default". It makes no
// request.
func Connect(kubeconfig, kubecontext, namespace string) (*Client, string, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: kubecontext})
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("%w: kube: no cluster configuration (KUBECONFIG, ~/.kube/config or in-cluster): %w", driver.ErrUnavailable, err)
	}
	if namespace == "" {
		if namespace, _, err = cc.Namespace(); err != nil || namespace == "" {
			namespace = "default"
		}
	}
	// A sandbox costs a handful of requests; client-go's default of 5 per
	// second would make a pool of them crawl.
	rc.QPS, rc.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, "", fmt.Errorf("%w: kube: %w", driver.ErrInvalidConfig, err)
	}
	return &Client{CS: cs, REST: rc}, namespace, nil
}

// Driver is the [driver.Driver] of a Kubernetes namespace. It is safe for
// concurrent use.
type Driver struct {
	c *Client
	o Options

	mu   sync.Mutex
	arch string // the nodes' architecture, once Image found it
	// installs: pod → the agent's tar stream, for Attach to write; nil
	// while CopyIn is yet to give it.
	installs map[string][]byte
	held     map[string]*stream // pod → the attach holding Main's stdin (both paths)
	policed  map[string]bool    // pods with a deny-all policy whose gate waits for their IP (beforeGate)
}

var (
	_ driver.Driver       = (*Driver)(nil)
	_ driver.Checkpointer = (*Driver)(nil)
)

// New returns the driver that makes pods through c as o says.
func New(c *Client, o Options) *Driver {
	return &Driver{c: c, o: o, installs: map[string][]byte{}, held: map[string]*stream{}, policed: map[string]bool{}}
}

// Image returns the architecture of the cluster's nodes (the first Ready
// one's; the pods are then pinned to it by a node selector), or, when the
// caller may not list nodes, this program's. Whether the nodes have the
// image only shows when a pod starts: Attach or Create then fails with
// [driver.ErrImageNotFound].
func (d *Driver) Image(ctx context.Context, ref string) (string, error) {
	d.mu.Lock()
	arch := d.arch
	d.mu.Unlock()
	if arch != "" {
		return arch, nil
	}
	nodes, err := d.c.CS.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsForbidden(err):
		return runtime.GOARCH, nil
	case err != nil:
		return "", classify("list nodes", "", err)
	}
	for _, n := range nodes.Items {
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue && n.Status.NodeInfo.Architecture != "" {
				arch = n.Status.NodeInfo.Architecture
			}
		}
		if arch != "" {
			break
		}
	}
	if arch == "" {
		return "", fmt.Errorf("%w: kube: no node is Ready", driver.ErrUnavailable)
	}
	d.mu.Lock()
	d.arch = arch
	d.mu.Unlock()
	return arch, nil
}

// Fetch does nothing for an image: the kubelet pulls it as the pods'
// imagePullPolicy says. An image archive cannot reach the nodes' runtime
// through the API server: [driver.ErrNotSupported].
func (d *Driver) Fetch(ctx context.Context, image, archive string) error {
	if archive != "" {
		return fmt.Errorf("%w: kube: an image archive cannot be loaded into the nodes through the API server; import it into each node's runtime (ctr -n k8s.io images import) or push it to a registry the nodes can pull from", driver.ErrNotSupported)
	}
	return nil
}

// Local reports false: the pods run wherever the scheduler puts them. The
// service is named by the API server and the namespace.
func (d *Driver) Local() (bool, string) { return false, "kube:" + d.c.REST.Host + "/" + d.o.Namespace }

// labelSandbox names one pod for its NetworkPolicy's selector.
const labelSandbox = "io.podvm.kube.sandbox"

// Create makes the pod for spec (and, for Network "none", its deny-all
// NetworkPolicy, owned by the pod) and returns its name. With spec.Agent
// it returns at once: Main's gate waits for the agent's tar, which
// [Driver.CopyIn] keeps and [Driver.Attach] writes.
// Otherwise it attaches to Main's stdin once Main runs (lifeline), which
// holds the pod up until [Driver.Remove].
//
// The pod comes first, so that the policy can name its owner in the body
// that creates it: from then on the garbage collector deletes it with the
// pod, whoever deletes the pod and whatever happens to the caller; no
// policy is ever left without a pod. The pod runs nothing of the caller's
// before the policy exists, as nothing runs before Create returns (pod.go):
// on the agent's path Main waits behind the gate for Attach; on the exec path
// Main's cat reads a stdin nobody writes to, and a command runs only in
// an exec session ([Driver.Exec]). Where Options.Enforced, the gate stays
// shut until the pod's status names its IP, which plugins that find pods
// by it need (beforeGate).
func (d *Driver) Create(ctx context.Context, spec driver.Spec) (string, error) {
	d.mu.Lock()
	o := d.o
	o.Arch = d.arch
	d.mu.Unlock()
	p, err := pod(spec, o)
	if err != nil {
		return "", err
	}
	var key string
	if spec.Network == "none" {
		key = randomHex()
		p.Labels[labelSandbox] = key
	}
	made, err := d.c.CS.CoreV1().Pods(d.o.Namespace).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return "", classify("create pod", spec.Name, err)
	}
	id := made.Name
	if key != "" {
		var port int32
		if spec.Agent != "" && !d.o.AttachOnly {
			port = agent.PeerPort
		}
		np := denyAll(d.o.Namespace, labelSandbox, key, p.Labels, port)
		np.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: id, UID: made.UID}}
		if _, err := d.c.CS.NetworkingV1().NetworkPolicies(d.o.Namespace).Create(ctx, np, metav1.CreateOptions{}); err != nil {
			err = classify("create network policy for pod", id, err)
			// With a context of its own: ctx may be what ended the create.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			if derr := d.deletePod(dctx, id); derr != nil {
				err = errors.Join(err, derr)
			}
			return "", err
		}
		if d.o.Enforced {
			d.mu.Lock()
			d.policed[id] = true
			d.mu.Unlock()
		}
	}
	if spec.Agent != "" {
		d.mu.Lock()
		d.installs[id] = nil
		d.mu.Unlock()
		return id, nil
	}
	return id, d.retry(ctx, id, "attaching to the sandbox", func() (bool, error) {
		return d.lifeline(ctx, id)
	})
}

// cleanupTimeout bounds the deletion of a pod whose Create failed after
// it was made.
const cleanupTimeout = 30 * time.Second

// CopyIn extracts the tar stream r into dir of pod id. Before the pod
// runs the agent, into "/", it is the agent: kept for [Driver.Attach] to
// write behind the gate's line. After, it is tar in an exec session, as
// the container's user (exec.go).
func (d *Driver) CopyIn(ctx context.Context, id, dir string, r io.Reader) error {
	d.mu.Lock()
	given, ok := d.installs[id]
	waiting := ok && given == nil
	if waiting {
		delete(d.installs, id) // whatever this CopyIn is: only the first can install
	}
	d.mu.Unlock()
	install := waiting && dir == "/"
	if !install {
		return d.tarIn(ctx, id, dir, r)
	}
	tarball, err := io.ReadAll(io.LimitReader(r, maxInstall+1))
	switch {
	case err != nil:
		return fmt.Errorf("vm: kube: installing the agent: %w", err)
	case len(tarball) > maxInstall:
		return fmt.Errorf("%w: kube: installing the agent: over %d bytes", driver.ErrInvalidConfig, maxInstall)
	}
	if tarball, err = withoutDir(tarball, strings.TrimPrefix(agent.Dir, "/")); err != nil {
		return fmt.Errorf("%w: kube: installing the agent: %w", driver.ErrInvalidConfig, err)
	}
	d.mu.Lock()
	d.installs[id] = tarball
	d.mu.Unlock()
	return nil
}

// withoutDir returns the tar stream b without the entry of directory dir
// (named relative to the stream's root), in whole 512-byte blocks, as
// the gate's dd reads it. dir is the agent's volume, there already, root's
// and writable by all: as the sandbox's user, GNU tar fails to set its
// mode and times from the entry.
func withoutDir(b []byte, dir string) ([]byte, error) {
	var out bytes.Buffer
	tr, tw := tar.NewReader(bytes.NewReader(b)), tar.NewWriter(&out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeDir && path.Clean(h.Name) == dir {
			continue
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// maxInstall bounds what CopyIn keeps for Attach: the agent's tar stream.
const maxInstall = 64 << 20

// Start is never needed: the agent's channel is its stdio, attached.
func (d *Driver) Start(ctx context.Context, id string) error {
	return fmt.Errorf("%w: kube: starting a pod without attaching to it", driver.ErrNotSupported)
}

// Remove ends PID 1 of pod id, then deletes the pod; a pod already gone
// is no error.
//
// It closes the stdin of the attach the driver holds to Main (the
// agent's, or the exec path's lifeline): stdinOnce, the container's
// stdin closes, and the agent kills everything and exits, or cat exits
// (and the runtime kills what else runs in the container, whose PID
// namespace is the pod's). It then waits
// for that attach to end by itself, which it does only once Main's
// process has exited, for endWait (5 s) at most and while ctx lasts.
// Only then does it delete the pod, with grace period 0: the API object
// goes at once, and with it, through the garbage collector, the pod's
// NetworkPolicy. Deleted first, the pod's containers would still run for
// a moment while its policy may already be gone: a process left in it
// could use the network. A graceful deletion instead would keep the
// object 1 to 4 s after Remove, a container that looks leaked.
//
// In the normal case the wait is that of Main's exit reaching the
// caller through the kubelet and the API server (tens of milliseconds).
// Past endWait, when ctx ends, or without an attach held (another process
// made the pod, or Attach never succeeded), the pod is deleted at once,
// and its containers may outlive its policy by a moment. The deletion has
// a context of its own (cleanupTimeout), so that a ctx that ended during
// the wait still removes the pod.
func (d *Driver) Remove(ctx context.Context, id string) error {
	d.mu.Lock()
	held := d.held[id]
	delete(d.held, id)
	delete(d.installs, id)
	delete(d.policed, id)
	d.mu.Unlock()
	if held != nil {
		held.end(ctx, endWait)
	}
	// With a context of its own: the pod must go even when ctx ended
	// during the wait.
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	return d.deletePod(dctx, id)
}

// endWait bounds the wait for an attach to end by itself once its stdin
// is closed: [Driver.Remove]'s for Main's exit, and [attached.Close]'s
// before it cuts the attach. A variable for the tests.
var endWait = 5 * time.Second

// deletePod deletes pod id with grace period 0; one already gone is no
// error.
func (d *Driver) deletePod(ctx context.Context, id string) error {
	err := d.c.CS.CoreV1().Pods(d.o.Namespace).Delete(ctx, id, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))})
	if err != nil && !apierrors.IsNotFound(err) {
		return classify("delete pod", id, err)
	}
	return nil
}

// List returns the pods of the namespace carrying label ("key=value").
// A pod whose phase is Succeeded or Failed is Ended: with restartPolicy
// Never, those phases are final.
func (d *Driver) List(ctx context.Context, label string) ([]driver.Container, error) {
	list, err := d.c.CS.CoreV1().Pods(d.o.Namespace).List(ctx, metav1.ListOptions{LabelSelector: label})
	if err != nil {
		return nil, classify("list pods", "", err)
	}
	out := make([]driver.Container, 0, len(list.Items))
	for _, p := range list.Items {
		ended := p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
		out = append(out, driver.Container{ID: p.Name, Labels: p.Labels, Ended: ended})
	}
	return out, nil
}

// Close ends the attaches the driver holds (those of the pods not
// removed).
func (d *Driver) Close() {
	d.mu.Lock()
	held := d.held
	d.held = map[string]*stream{}
	clear(d.installs)
	clear(d.policed)
	d.mu.Unlock()
	for _, s := range held {
		s.Close()
	}
}

// Address returns pod id's IP, as its status says: [driver.Addresser].
// Whether the caller reaches it is for the caller to find out. A pod on
// the node's network (Network "host"), or any with AttachOnly, has none
// to offer: [driver.ErrNotSupported].
func (d *Driver) Address(ctx context.Context, id string) (string, error) {
	if d.o.AttachOnly {
		return "", fmt.Errorf("%w: kube: the caller asked for the attach stream alone", driver.ErrNotSupported)
	}
	p, err := d.c.CS.CoreV1().Pods(d.o.Namespace).Get(ctx, id, metav1.GetOptions{})
	if err != nil {
		return "", classify("look up", id, err)
	}
	if p.Spec.HostNetwork {
		// Its address is the node's: the agent would listen on the node,
		// where another sandbox's, or a service of the node's, may hold
		// the port, with no policy in front.
		return "", fmt.Errorf("%w: kube: pod %s is on the node's network", driver.ErrNotSupported, id)
	}
	return p.Status.PodIP, nil
}

// errCheckpoints is why a kube sandbox cannot be checkpointed.
var errCheckpoints = fmt.Errorf("%w: checkpoints: Kubernetes: the kubelet can checkpoint a container (its /checkpoint endpoint), but nothing restores one", driver.ErrNotSupported)

// CheckpointRefusal implements [driver.Checkpointer]: always refused.
func (d *Driver) CheckpointRefusal(context.Context) error { return errCheckpoints }

// Suspend implements [driver.Checkpointer]: always refused.
func (d *Driver) Suspend(context.Context, string) error { return errCheckpoints }

// Resume implements [driver.Checkpointer]: always refused.
func (d *Driver) Resume(context.Context, string) error { return errCheckpoints }

// AttachRunning implements [driver.Checkpointer]: always refused.
func (d *Driver) AttachRunning(context.Context, string) (io.ReadWriteCloser, error) {
	return nil, errCheckpoints
}

// Export implements [driver.Checkpointer]: always refused.
func (d *Driver) Export(context.Context, string, string, bool) error { return errCheckpoints }

// Import implements [driver.Checkpointer]: always refused.
func (d *Driver) Import(context.Context, string) (string, error) { return "", errCheckpoints }
