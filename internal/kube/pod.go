package kube

import (
	"fmt"
	"maps"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/podvm/podvm/internal/agent"
	"github.com/podvm/podvm/internal/driver"
)

// This file is what a sandbox becomes on Kubernetes: one Pod, and for
// Network "none" a NetworkPolicy that denies it all traffic. It is a pure
// function of the driver's Spec and Options, so that every Config field's
// fate is tested without a cluster.

// Names of the pod's containers and volumes.
const (
	// Main is the sandbox's container: podvm's agent as PID 1, or, on the
	// exec path, cat holding the pod open.
	Main = "sandbox"
	// agentVolume holds the agent: Main's PID 1 writes it there behind
	// the gate (installGate), then runs it.
	agentVolume = "podvm-agent"
	// agentVolumeSize bounds the agent's volume: its tar stream and what
	// it holds, each at most maxInstall.
	agentVolumeSize = 2 * maxInstall
)

// gate is what PID 1 of Main runs on the exec path before cat: it
// writes a dot on stdout every 50 ms until it reads one line on stdin,
// which the driver's lifeline writes once a dot has come through its
// attach. Kubernetes can only attach to a container that runs, and an
// attach made while the container is not running yet is upgraded and
// then reset: a write of its stdin meeting the reset is logged by
// client-go on the process's stderr, so nothing is written until a dot
// proves the attach reaches the running gate. It needs /bin/sh and sleep
// in the image, and takes out the variables sh itself exports (SHLVL,
// PWD): every command's base environment is the container's. The dots'
// writer is dead (waited for) before cat starts. The agent's path runs
// the same gate in front of the agent's install (installGate).
const gate = `(while :; do printf .; sleep 0.05; done) & t=$!; read -r _; kill $t; wait $t 2>/dev/null; unset SHLVL PWD OLDPWD; exec "$0" "$@"`

// installGate is Main's PID 1 on the agent's path: the gate, whose line
// is the size in bytes of the agent's tar stream, which follows it on
// stdin (whole 512-byte blocks, as every tar stream is). dd reads
// exactly that many bytes into the agent's volume, dir (iflag=fullblock:
// however the attach cut them into reads; never a byte past them, which
// are the agent's channel), tar extracts them beneath root, and the
// agent is exec'd on the same stdin and stdout: its handshake is the
// next thing on the stream, the dots dropped before it. The agent speaks
// first: without the gate its handshake would be written before anyone
// listens, and lost. One container, installed and run on one attach,
// starts sooner than an init container that extracted the agent before
// it: the kubelet noticed the init container's exit only at its next
// relist, a second apart. It needs dd (with iflag=fullblock: coreutils',
// busybox's since 1.24), tar, wc and rm in the image, besides sh and
// sleep. A failure exits, its reason on stderr (the container's
// termination message): a missing program says "podvm: the image lacks".
func installGate(dir, root string) string {
	tarball, root := shellQuote(dir+"/agent.tar"), shellQuote(root)
	return `(while :; do printf .; sleep 0.05; done) & t=$!; read -r n; kill $t; wait $t 2>/dev/null; ` +
		`for p in dd tar wc rm; do command -v $p >/dev/null 2>&1 || { echo "podvm: the image lacks $p, which installing the agent needs" >&2; exit 127; }; done; ` +
		`case $n in ''|*[!0-9]*|0*) echo "podvm: installing the agent: no size on stdin" >&2; exit 1;; esac; ` +
		`[ $((n % 512)) -eq 0 ] || { echo "podvm: installing the agent: a size of $n bytes is not whole tar blocks" >&2; exit 1; }; ` +
		`dd of=` + tarball + ` bs=512 count=$((n / 512)) iflag=fullblock 2>/dev/null && ` +
		`[ "$(wc -c <` + tarball + `)" -eq "$n" ] || { echo "podvm: installing the agent: stdin ended before its $n bytes (or dd lacks iflag=fullblock)" >&2; exit 1; }; ` +
		`tar -x -f ` + tarball + ` -C ` + root + ` || exit; rm -f ` + tarball + `; ` +
		`unset SHLVL PWD OLDPWD; exec "$0" "$@"`
}

// shellQuote quotes s for sh, whatever it holds.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Options are what the driver adds to a Spec: where and how its pods run.
type Options struct {
	// Namespace is where the pods (and policies) are made.
	Namespace string
	// RuntimeClass is the pods' runtimeClassName; "" for the cluster's
	// default runtime.
	RuntimeClass string
	// Lifetime is the pods' activeDeadlineSeconds: the kubelet kills a pod
	// that runs longer, whoever made it, whether or not it is alive.
	Lifetime time.Duration
	// DenyAll makes, for Network "none", a NetworkPolicy selecting the pod
	// that allows no ingress and no egress. Without it, Network "none" is
	// refused: the pod network is the only other choice.
	DenyAll bool
	// Arch, when set, is the nodes' architecture the pod must land on (the
	// agent is built for it).
	Arch string
	// AttachOnly keeps every call on the attach stream: Address refuses,
	// and the deny-all policy lets nothing in.
	AttachOnly bool
	// Enforced says the cluster's network plugin enforces NetworkPolicy:
	// a pod with a deny-all policy runs nothing of the caller's before
	// its status names its IP ([Driver.Attach]).
	Enforced bool
}

// Check reports whether spec can be honoured as o says, without a
// cluster: an error matching [driver.ErrNotSupported] or
// [driver.ErrInvalidConfig] for a field that Kubernetes cannot honour as
// the Spec means it, the one Create would return. It builds nothing.
func Check(spec driver.Spec, o Options) error {
	switch {
	case spec.Pids > 0:
		return fmt.Errorf("%w: kube: pids %d: Kubernetes limits processes per node (the kubelet's podPidsLimit), not per pod; leave Pids zero to accept the node's limit", driver.ErrNotSupported, spec.Pids)
	case spec.ImageArchive != "":
		return fmt.Errorf("%w: kube: an image archive cannot be loaded into the nodes through the API server; import it into the nodes' runtime or push it to a registry they pull from", driver.ErrNotSupported)
	case len(spec.Mounts) > 0:
		return fmt.Errorf("%w: kube: host mounts: a pod's hostPath is a directory of whichever node runs it, not of the caller; copy files in with CopyIn instead", driver.ErrNotSupported)
	}
	if _, err := pullPolicy(spec.Pull); err != nil {
		return err
	}
	if err := checkLabels(spec.Labels); err != nil {
		return err
	}
	if spec.Name != "" {
		if errs := validation.IsDNS1123Subdomain(spec.Name); len(errs) > 0 {
			return fmt.Errorf("%w: kube: name %q is not a pod name: %s", driver.ErrInvalidConfig, spec.Name, strings.Join(errs, "; "))
		}
	}
	if _, _, err := ids(spec.User); err != nil {
		return err
	}
	if _, err := network(spec.Network, o); err != nil {
		return err
	}
	_, err := resources(spec)
	return err
}

// pod returns the Pod for spec, once [Check] passed it. Its name is
// spec.Name, else generated from "podvm-".
func pod(spec driver.Spec, o Options) (*corev1.Pod, error) {
	if err := Check(spec, o); err != nil {
		return nil, err
	}
	pull, _ := pullPolicy(spec.Pull)
	uid, gid, _ := ids(spec.User)
	hostNet, _ := network(spec.Network, o)
	res, _ := resources(spec)
	sc := &corev1.SecurityContext{
		RunAsUser:                uid,
		RunAsGroup:               gid,
		Privileged:               ptr(false),
		AllowPrivilegeEscalation: ptr(false),
		ReadOnlyRootFilesystem:   ptr(spec.ReadOnlyRootfs),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	for _, c := range spec.Capabilities {
		sc.Capabilities.Add = append(sc.Capabilities.Add, corev1.Capability(c))
	}
	main := corev1.Container{
		Name:            Main,
		Image:           spec.Image,
		ImagePullPolicy: pull,
		WorkingDir:      spec.Workdir,
		Resources:       res,
		SecurityContext: sc,
		// Both paths hold PID 1's stdin open through an attach: when that
		// attach ends (Remove, or the caller's process died and its
		// connection with it), stdin closes and PID 1 exits.
		Stdin:                    true,
		StdinOnce:                true,
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	for _, kv := range spec.Env {
		k, v, _ := strings.Cut(kv, "=")
		main.Env = append(main.Env, corev1.EnvVar{Name: k, Value: v})
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: spec.Name, Namespace: o.Namespace, Labels: maps.Clone(spec.Labels)},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  ptr(false),
			EnableServiceLinks:            ptr(false),
			TerminationGracePeriodSeconds: ptr(int64(1)),
			HostNetwork:                   hostNet,
			Containers:                    []corev1.Container{main},
		},
	}
	if spec.Name == "" {
		p.GenerateName = "podvm-"
	}
	if o.RuntimeClass != "" {
		p.Spec.RuntimeClassName = ptr(o.RuntimeClass)
	}
	if o.Lifetime > 0 {
		// Whole seconds, rounded up: the API server refuses 0.
		p.Spec.ActiveDeadlineSeconds = ptr(int64((o.Lifetime + time.Second - 1) / time.Second))
	}
	if o.Arch != "" {
		p.Spec.NodeSelector = map[string]string{corev1.LabelArchStable: o.Arch}
	}
	if spec.ReadOnlyRootfs {
		// As Podman does with --read-only: writable scratch where programs
		// expect it, in memory, gone with the pod.
		for i, dir := range []string{"/tmp", "/var/tmp", "/run"} {
			name := "podvm-tmp-" + strconv.Itoa(i)
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: name,
				VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}}})
			p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: name, MountPath: dir})
		}
	}
	c := &p.Spec.Containers[0]
	if spec.Agent == "" {
		// The exec path: cat, behind the gate, reading the stdin of the
		// attach that nobody writes to, holds the pod open; the pause
		// container is PID 1 and reaps orphans.
		p.Spec.ShareProcessNamespace = ptr(true)
		c.Command = []string{"/bin/sh", "-c", gate, "cat"}
		return p, nil
	}
	// The agent's path: Main's PID 1 reads the agent into a volume of
	// its own behind the gate, and runs it (installGate).
	// Bounded: it is writable by the sandbox's user, whatever
	// ReadOnlyRootfs says, and on the node's disk.
	p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: agentVolume,
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: resource.NewQuantity(agentVolumeSize, resource.BinarySI)}}})
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: agentVolume, MountPath: agent.Dir})
	c.Command = append([]string{"/bin/sh", "-c", installGate(agent.Dir, "/"), spec.Agent}, spec.AgentArgs...)
	return p, nil
}

// pullPolicy maps a Spec's Pull to the containers' imagePullPolicy.
func pullPolicy(pull string) (corev1.PullPolicy, error) {
	switch pull {
	case driver.PullMissing, "":
		return corev1.PullIfNotPresent, nil
	case driver.PullNever:
		return corev1.PullNever, nil
	case driver.PullAlways:
		return corev1.PullAlways, nil
	}
	return "", fmt.Errorf("%w: kube: pull policy %q", driver.ErrInvalidConfig, pull)
}

// ids maps a User ("uid" or "uid:gid") to runAsUser and runAsGroup:
// Kubernetes takes numbers only, names are refused.
func ids(user string) (uid, gid *int64, err error) {
	if user == "" {
		return nil, nil, nil
	}
	u, g, hasGroup := strings.Cut(user, ":")
	n, err := strconv.ParseInt(u, 10, 64)
	if err != nil || n < 0 || n > 1<<31-1 {
		return nil, nil, fmt.Errorf("%w: kube: user %q: Kubernetes runs containers as a numeric uid (runAsUser), not a name", driver.ErrNotSupported, user)
	}
	uid = &n
	if hasGroup {
		m, err := strconv.ParseInt(g, 10, 64)
		if err != nil || m < 0 || m > 1<<31-1 {
			return nil, nil, fmt.Errorf("%w: kube: group %q: Kubernetes takes a numeric gid (runAsGroup), not a name", driver.ErrNotSupported, g)
		}
		gid = &m
	}
	return uid, gid, nil
}

// network maps a Network: "none" is the pod network behind a deny-all
// policy (o.DenyAll), "host" the node's network, "bridge" and "pod" the
// pod network as it is. Anything else is refused.
func network(mode string, o Options) (hostNetwork bool, err error) {
	switch mode {
	case "none":
		if !o.DenyAll {
			return false, fmt.Errorf("%w: kube: network \"none\": a pod always has the pod network; it is cut off only by a NetworkPolicy, which only a cluster whose network plugin enforces policies honours (say so with kube.WithNetworkPolicy, or accept an unenforced one with kube.WithUnenforcedNetworkPolicy)", driver.ErrNotSupported)
		}
		return false, nil
	case "host":
		return true, nil
	case "bridge", "pod":
		return false, nil
	}
	return false, fmt.Errorf("%w: kube: network %q: a pod has the pod network (\"pod\" or \"bridge\"), the node's (\"host\"), or none (\"none\", by a NetworkPolicy)", driver.ErrNotSupported, mode)
}

// resources maps Memory and CPUs to the container's limits (requests
// default to them).
func resources(spec driver.Spec) (corev1.ResourceRequirements, error) {
	var r corev1.ResourceRequirements
	if spec.Memory == 0 && spec.CPUs == 0 {
		return r, nil
	}
	r.Limits = corev1.ResourceList{}
	if spec.Memory > 0 {
		r.Limits[corev1.ResourceMemory] = *resource.NewQuantity(spec.Memory, resource.BinarySI)
	}
	if spec.CPUs > 0 {
		milli := int64(spec.CPUs*1000 + 0.5)
		if milli < 1 {
			return r, fmt.Errorf("%w: kube: cpus %v: Kubernetes counts CPUs in thousandths", driver.ErrInvalidConfig, spec.CPUs)
		}
		r.Limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(milli, resource.DecimalSI)
	}
	return r, nil
}

// checkLabels refuses labels that Kubernetes would: a key is a qualified
// name, a value at most 63 characters of letters, digits, '-', '_', '.'.
func checkLabels(labels map[string]string) error {
	for k, v := range labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return fmt.Errorf("%w: kube: label key %q: %s", driver.ErrInvalidConfig, k, strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return fmt.Errorf("%w: kube: label %s=%q: %s", driver.ErrInvalidConfig, k, v, strings.Join(errs, "; "))
		}
	}
	return nil
}

// denyAll is the NetworkPolicy that cuts the pods carrying label
// key=value off: it selects them, for ingress and egress, and allows
// nothing, but, when agentPort is not 0, connections in to that TCP port,
// where the agent serves its peers (a caller on the pod network skips
// the API server's attach stream; the agent's handshake admits only the
// caller). Egress stays denied: a connection in is answered, as
// NetworkPolicy allows the replies of an allowed connection, but the
// pod opens none.
func denyAll(namespace, key, value string, labels map[string]string, agentPort int32) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "podvm-deny-", Namespace: namespace, Labels: maps.Clone(labels)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{key: value}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
	if agentPort != 0 {
		port := intstr.FromInt32(agentPort)
		np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr(corev1.ProtocolTCP), Port: &port}},
		}}
	}
	return np
}

func ptr[T any](v T) *T { return &v }
