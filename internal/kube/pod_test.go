package kube

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/podvm/podvm/internal/agent"
	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/testkit"
)

func baseSpec() driver.Spec {
	return driver.Spec{Image: "localhost/busybox:1", Network: "pod", Labels: map[string]string{"io.podvm.managed": "true"},
		Capabilities: []string{"CHOWN", "KILL"}, Agent: agent.Path, Pull: driver.PullNever}
}

var baseOpts = Options{Namespace: "ns", Lifetime: time.Hour}

// Every pod, whatever its config, is locked down the same way.
func TestPodAlways(t *testing.T) {
	p, err := pod(baseSpec(), baseOpts)
	require.NoError(t, err)
	assert.Equal(t, "ns", p.Namespace)
	assert.Equal(t, "podvm-", p.GenerateName)
	assert.Equal(t, "true", p.Labels["io.podvm.managed"])
	s := p.Spec
	assert.Equal(t, corev1.RestartPolicyNever, s.RestartPolicy)
	assert.False(t, *s.AutomountServiceAccountToken, "a service account token in the pod")
	assert.False(t, *s.EnableServiceLinks)
	assert.Equal(t, int64(3600), *s.ActiveDeadlineSeconds)
	assert.False(t, s.HostNetwork)
	assert.Nil(t, s.RuntimeClassName)
	require.Len(t, s.Containers, 1)
	assert.Empty(t, s.InitContainers, "one container, installed on its attach")
	for _, c := range s.Containers {
		sc := c.SecurityContext
		assert.False(t, *sc.AllowPrivilegeEscalation, c.Name)
		assert.False(t, *sc.Privileged, c.Name)
		assert.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop, c.Name)
		assert.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, sc.SeccompProfile.Type, c.Name)
		assert.Equal(t, corev1.PullNever, c.ImagePullPolicy, c.Name)
		assert.Equal(t, "localhost/busybox:1", c.Image, c.Name)
		assert.True(t, c.Stdin && c.StdinOnce, "%s: stdin open once", c.Name)
	}
	assert.Equal(t, []corev1.Capability{"CHOWN", "KILL"}, s.Containers[0].SecurityContext.Capabilities.Add)
}

// The agent's way in: Main's PID 1 installs it from its stdin into a
// volume at agent.Dir, behind the gate, and runs it.
func TestPodAgent(t *testing.T) {
	spec := baseSpec()
	spec.AgentArgs = []string{"-x"}
	p, err := pod(spec, baseOpts)
	require.NoError(t, err)
	assert.Empty(t, p.Spec.InitContainers)
	main := p.Spec.Containers[0]
	assert.Equal(t, []string{"/bin/sh", "-c", installGate(agent.Dir, "/"), agent.Path, "-x"}, main.Command)
	assert.Contains(t, main.VolumeMounts, corev1.VolumeMount{Name: agentVolume, MountPath: agent.Dir})
	assert.Nil(t, p.Spec.ShareProcessNamespace)
}

// The exec path: no agent; cat holds Main, pause is PID 1.
func TestPodExecPath(t *testing.T) {
	spec := baseSpec()
	spec.Agent = ""
	p, err := pod(spec, baseOpts)
	require.NoError(t, err)
	assert.Empty(t, p.Spec.InitContainers)
	assert.Empty(t, p.Spec.Volumes)
	assert.Equal(t, []string{"/bin/sh", "-c", gate, "cat"}, p.Spec.Containers[0].Command)
	assert.True(t, *p.Spec.ShareProcessNamespace)
}

// One case per Config field the driver sees: what it becomes, or its
// refusal.
func TestPodFields(t *testing.T) {
	for _, c := range []struct {
		name  string
		spec  func(*driver.Spec)
		opts  func(*Options)
		check func(*testing.T, *corev1.Pod)
		err   error
	}{
		{name: "Name", spec: func(s *driver.Spec) { s.Name = "podvm-x.y" }, check: func(t *testing.T, p *corev1.Pod) {
			assert.Equal(t, "podvm-x.y", p.Name)
			assert.Empty(t, p.GenerateName)
		}},
		{name: "Name not a pod name", spec: func(s *driver.Spec) { s.Name = "Upper_case" }, err: driver.ErrInvalidConfig},
		{name: "Labels", spec: func(s *driver.Spec) { s.Labels["team"] = "build" }, check: func(t *testing.T, p *corev1.Pod) {
			assert.Equal(t, "build", p.Labels["team"])
		}},
		{name: "Label value not a label", spec: func(s *driver.Spec) { s.Labels["team"] = "a b" }, err: driver.ErrInvalidConfig},
		{name: "Label key not a label", spec: func(s *driver.Spec) { s.Labels["a b"] = "x" }, err: driver.ErrInvalidConfig},
		{name: "Env", spec: func(s *driver.Spec) { s.Env = []string{"A=1", "EMPTY=", "B=x=y"} }, check: func(t *testing.T, p *corev1.Pod) {
			assert.Equal(t, []corev1.EnvVar{{Name: "A", Value: "1"}, {Name: "EMPTY"}, {Name: "B", Value: "x=y"}}, p.Spec.Containers[0].Env)
		}},
		{name: "Workdir", spec: func(s *driver.Spec) { s.Workdir = "/tmp" }, check: func(t *testing.T, p *corev1.Pod) {
			assert.Equal(t, "/tmp", p.Spec.Containers[0].WorkingDir)
		}},
		{name: "User uid", spec: func(s *driver.Spec) { s.User = "65534" }, check: func(t *testing.T, p *corev1.Pod) {
			for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
				assert.Equal(t, int64(65534), *c.SecurityContext.RunAsUser)
				assert.Nil(t, c.SecurityContext.RunAsGroup)
			}
		}},
		{name: "User uid:gid", spec: func(s *driver.Spec) { s.User = "1000:2000" }, check: func(t *testing.T, p *corev1.Pod) {
			sc := p.Spec.Containers[0].SecurityContext
			assert.Equal(t, int64(1000), *sc.RunAsUser)
			assert.Equal(t, int64(2000), *sc.RunAsGroup)
		}},
		{name: "User name", spec: func(s *driver.Spec) { s.User = "nobody" }, err: driver.ErrNotSupported},
		{name: "User group name", spec: func(s *driver.Spec) { s.User = "1:wheel" }, err: driver.ErrNotSupported},
		{name: "Network none refused", spec: func(s *driver.Spec) { s.Network = "none" }, err: driver.ErrNotSupported},
		{name: "Network none with a policy", spec: func(s *driver.Spec) { s.Network = "none" }, opts: func(o *Options) { o.DenyAll = true },
			check: func(t *testing.T, p *corev1.Pod) { assert.False(t, p.Spec.HostNetwork) }},
		{name: "Network host", spec: func(s *driver.Spec) { s.Network = "host" }, check: func(t *testing.T, p *corev1.Pod) {
			assert.True(t, p.Spec.HostNetwork)
		}},
		{name: "Network bridge", spec: func(s *driver.Spec) { s.Network = "bridge" }, check: func(t *testing.T, p *corev1.Pod) {
			assert.False(t, p.Spec.HostNetwork)
		}},
		{name: "Network other", spec: func(s *driver.Spec) { s.Network = "slirp4netns" }, err: driver.ErrNotSupported},
		{name: "Network container", spec: func(s *driver.Spec) { s.Network = "container:x" }, err: driver.ErrNotSupported},
		{name: "Memory", spec: func(s *driver.Spec) { s.Memory = 64 << 20 }, check: func(t *testing.T, p *corev1.Pod) {
			for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
				q := c.Resources.Limits[corev1.ResourceMemory]
				assert.Equal(t, int64(64<<20), q.Value())
				assert.NotContains(t, c.Resources.Limits, corev1.ResourceCPU)
			}
		}},
		{name: "CPUs", spec: func(s *driver.Spec) { s.CPUs = 1.5 }, check: func(t *testing.T, p *corev1.Pod) {
			q := p.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU]
			assert.Equal(t, int64(1500), q.MilliValue())
			assert.NotContains(t, p.Spec.Containers[0].Resources.Limits, corev1.ResourceMemory)
		}},
		{name: "CPUs below a thousandth", spec: func(s *driver.Spec) { s.CPUs = 0.0001 }, err: driver.ErrInvalidConfig},
		{name: "no limits", check: func(t *testing.T, p *corev1.Pod) { assert.Empty(t, p.Spec.Containers[0].Resources.Limits) }},
		{name: "ReadOnlyRootfs", spec: func(s *driver.Spec) { s.ReadOnlyRootfs = true }, check: func(t *testing.T, p *corev1.Pod) {
			c := p.Spec.Containers[0]
			assert.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
			var dirs []string
			for _, m := range c.VolumeMounts {
				dirs = append(dirs, m.MountPath)
			}
			assert.Subset(t, dirs, []string{"/tmp", "/var/tmp", "/run"})
		}},
		{name: "ReadOnlyRootfs off", check: func(t *testing.T, p *corev1.Pod) {
			assert.False(t, *p.Spec.Containers[0].SecurityContext.ReadOnlyRootFilesystem)
		}},
		{name: "Pull missing", spec: func(s *driver.Spec) { s.Pull = driver.PullMissing }, check: func(t *testing.T, p *corev1.Pod) {
			for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
				assert.Equal(t, corev1.PullIfNotPresent, c.ImagePullPolicy)
			}
		}},
		{name: "Pull always", spec: func(s *driver.Spec) { s.Pull = driver.PullAlways }, check: func(t *testing.T, p *corev1.Pod) {
			for _, c := range append(p.Spec.InitContainers, p.Spec.Containers...) {
				assert.Equal(t, corev1.PullAlways, c.ImagePullPolicy)
			}
		}},
		{name: "Pull unknown", spec: func(s *driver.Spec) { s.Pull = "sometimes" }, err: driver.ErrInvalidConfig},
		{name: "Pids set", spec: func(s *driver.Spec) { s.Pids = 64 }, err: driver.ErrNotSupported},
		{name: "Pids none: the node's", spec: func(s *driver.Spec) { s.Pids = -1 }, check: func(t *testing.T, p *corev1.Pod) {
			assert.NotContains(t, p.Spec.Containers[0].Resources.Limits, corev1.ResourcePods)
		}},
		{name: "ImageArchive", spec: func(s *driver.Spec) { s.ImageArchive = "/tmp/image.tar" }, err: driver.ErrNotSupported},
		{name: "Mounts", spec: func(s *driver.Spec) { s.Mounts = []driver.Mount{{Source: "/src", Target: "/dst"}} }, err: driver.ErrNotSupported},
		{name: "RuntimeClass", opts: func(o *Options) { o.RuntimeClass = "gvisor" }, check: func(t *testing.T, p *corev1.Pod) {
			assert.Equal(t, "gvisor", *p.Spec.RuntimeClassName)
		}},
		{name: "Arch", opts: func(o *Options) { o.Arch = "arm64" }, check: func(t *testing.T, p *corev1.Pod) {
			assert.Equal(t, map[string]string{corev1.LabelArchStable: "arm64"}, p.Spec.NodeSelector)
		}},
		{name: "a sub-second Lifetime", opts: func(o *Options) { o.Lifetime = 300 * time.Millisecond }, check: func(t *testing.T, p *corev1.Pod) {
			require.NotNil(t, p.Spec.ActiveDeadlineSeconds)
			assert.Equal(t, int64(1), *p.Spec.ActiveDeadlineSeconds, "rounded up: the API server refuses 0")
		}},
		{name: "no Lifetime", opts: func(o *Options) { o.Lifetime = 0 }, check: func(t *testing.T, p *corev1.Pod) {
			assert.Nil(t, p.Spec.ActiveDeadlineSeconds)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec, o := baseSpec(), baseOpts
			if c.spec != nil {
				c.spec(&spec)
			}
			if c.opts != nil {
				c.opts(&o)
			}
			p, err := pod(spec, o)
			if c.err != nil {
				require.Error(t, err)
				assert.True(t, errors.Is(err, c.err), "%v is not %v", err, c.err)
				assert.Equal(t, err, Check(spec, o))
				return
			}
			require.NoError(t, err)
			c.check(t, p)
		})
	}
}

func TestDenyAll(t *testing.T) {
	np := denyAll("ns", labelSandbox, "k", map[string]string{"io.podvm.managed": "true"}, 0)
	assert.Equal(t, map[string]string{labelSandbox: "k"}, np.Spec.PodSelector.MatchLabels)
	assert.Len(t, np.Spec.PolicyTypes, 2)
	assert.Empty(t, np.Spec.Ingress)
	assert.Empty(t, np.Spec.Egress)
	assert.Equal(t, "true", np.Labels["io.podvm.managed"])

	// With the agent: in to its peers' port alone, from anywhere (its
	// handshake admits the caller only); still nothing out.
	np = denyAll("ns", labelSandbox, "k", nil, agent.PeerPort)
	require.Len(t, np.Spec.Ingress, 1)
	rule := np.Spec.Ingress[0]
	assert.Empty(t, rule.From, "every source: the handshake, not the address, admits")
	require.Len(t, rule.Ports, 1)
	assert.Equal(t, corev1.ProtocolTCP, *rule.Ports[0].Protocol)
	assert.Equal(t, int32(agent.PeerPort), rule.Ports[0].Port.IntVal)
	assert.Nil(t, rule.Ports[0].EndPort)
	assert.Empty(t, np.Spec.Egress)
	assert.Len(t, np.Spec.PolicyTypes, 2, "egress is still denied")
}

func TestOctal(t *testing.T) {
	assert.Equal(t, `\141\377\012\045`, octal("a\xff\n%"))
}

// A link to a directory is archived from inside it, "./x", and renamed
// after the path asked for.
func TestRenameDot(t *testing.T) {
	in := testkit.Tar(t, testkit.Dir("./", 0o755), testkit.File("./f", "", 0o644), testkit.File("./sub/g", "", 0o644))
	var out bytes.Buffer
	require.NoError(t, renameDot(bytes.NewReader(in), &out, "dl"))
	entries, err := testkit.Untar(out.Bytes())
	require.NoError(t, err)
	assert.Equal(t, []string{"dl/", "dl/f", "dl/sub/g"}, testkit.Names(entries))
}

// A container that cannot start for want of a program the pod runs is
// ErrNotSupported, whichever runtime says it and however the kubelet
// reports it; other failures are not.
func TestLacking(t *testing.T) {
	runc := `failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: exec: "tar": executable file not found in $PATH: unknown`
	crun := "executable file `cat` not found in $PATH: No such file or directory: OCI runtime attempted to invoke a command that was not found"
	path := `exec: "/bin/sh": stat /bin/sh: no such file or directory`
	for _, c := range []struct {
		name string
		st   corev1.ContainerStatus
		want bool
	}{
		{"waiting, runc", corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "RunContainerError", Message: runc}}}, true},
		{"terminated, crun", corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 128, Reason: "StartError", Message: crun}}}, true},
		{"back-off after, path", corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 128, Message: path}}}, true},
		{"pulling", corev1.ContainerStatus{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "not found in $PATH"}}}, false},
		{"the gate's dd, ash", corev1.ContainerStatus{Name: Main, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1,
			Message: "sh: dd: not found\npodvm: installing the agent: stdin ended before its 3311616 bytes, or dd is missing or lacks iflag=fullblock\n"}}}, true},
		{"the gate's tar, dash", corev1.ContainerStatus{Name: Main, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 127, Message: "sh: 1: tar: not found\n"}}}, true},
		{"exited 1", corev1.ContainerStatus{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: "tar: short read"}}}, false},
		{"running", corev1.ContainerStatus{State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}, false},
	} {
		err := missingProgram("p", c.st)
		if !c.want {
			assert.NoError(t, err, c.name)
			continue
		}
		assert.ErrorIs(t, err, driver.ErrNotSupported, c.name)
		p := &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{c.st}}}
		p.Name = "p"
		assert.ErrorIs(t, failure(p), driver.ErrNotSupported, c.name)
	}
	// The install's other failures are the engine's, named.
	p := &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: Main, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1,
		Message: "tar: write error: No space left on device\n"}}}}}}
	err := failure(p)
	assert.ErrorIs(t, err, driver.ErrEngine)
	assert.ErrorContains(t, err, "installing the agent")
}
