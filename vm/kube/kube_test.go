package kube_test

import (
	"context"
	"errors"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/kube"
)

// fakeKubeconfig writes a kubeconfig naming an API server nobody serves:
// the constructors make no request, so they work on it.
func fakeKubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config")
	require.NoError(t, os.WriteFile(path, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: from-context}}]
current-context: x
`), 0o600))
	return path
}

// Every Config field either works on Kubernetes or is refused, before
// anything reaches a cluster; these are the refusals, and the fields that
// pass the check (what they become is internal/kube's pod_test.go).
func TestNewRefuses(t *testing.T) {
	cfgFile := fakeKubeconfig(t)
	ok := []kube.Option{kube.WithKubeconfig(cfgFile), kube.WithUnenforcedNetworkPolicy()}
	for _, c := range []struct {
		name string
		cfg  func(*vm.Config)
		opts []kube.Option
		err  error // nil: accepted
	}{
		{name: "defaults with an unenforced policy accepted", cfg: func(*vm.Config) {}},
		{name: "Network none without a word about policies", cfg: func(*vm.Config) {}, opts: []kube.Option{kube.WithKubeconfig(cfgFile)}, err: vm.ErrNotSupported},
		{name: "Network none, policies enforced", cfg: func(*vm.Config) {}, opts: []kube.Option{kube.WithKubeconfig(cfgFile), kube.WithNetworkPolicy()}},
		{name: "Network pod", cfg: func(c *vm.Config) { c.Network = "pod" }, opts: []kube.Option{kube.WithKubeconfig(cfgFile)}},
		{name: "Network host", cfg: func(c *vm.Config) { c.Network = "host" }},
		{name: "Network slirp4netns", cfg: func(c *vm.Config) { c.Network = "slirp4netns" }, err: vm.ErrNotSupported},
		{name: "Pids", cfg: func(c *vm.Config) { c.Pids = 64 }, err: vm.ErrNotSupported},
		{name: "NoPidsLimit: the node's", cfg: func(c *vm.Config) { c.Pids = vm.NoPidsLimit }},
		{name: "Mounts", cfg: func(c *vm.Config) { c.Mounts = []vm.Mount{{Source: "/tmp", Target: "/mnt"}} }, err: vm.ErrNotSupported},
		{name: "ImageArchive", cfg: func(c *vm.Config) { c.ImageArchive = "/tmp/img.tar" }, err: vm.ErrNotSupported},
		{name: "User name", cfg: func(c *vm.Config) { c.User = "nobody" }, err: vm.ErrNotSupported},
		{name: "User uid:gid", cfg: func(c *vm.Config) { c.User = "65534:65534" }},
		{name: "Name not a pod name", cfg: func(c *vm.Config) { c.Name = "Has_Upper" }, err: vm.ErrInvalidConfig},
		{name: "Name", cfg: func(c *vm.Config) { c.Name = "podvm-ok" }},
		{name: "Label value", cfg: func(c *vm.Config) { c.Labels = map[string]string{"team": "has space"} }, err: vm.ErrInvalidConfig},
		{name: "Labels", cfg: func(c *vm.Config) { c.Labels = map[string]string{"team": "build"} }},
		{name: "Memory CPUs", cfg: func(c *vm.Config) { c.Memory, c.CPUs = 64<<20, 0.5 }},
		{name: "ReadOnlyRootfs Workdir Env", cfg: func(c *vm.Config) { c.ReadOnlyRootfs, c.Workdir, c.Env = true, "/tmp", []string{"A=1"} }},
		{name: "Pull", cfg: func(c *vm.Config) { c.Pull = vm.PullAlways }},
		{name: "PodmanExec", cfg: func(c *vm.Config) { c.PodmanExec = true }},
		{name: "invalid Config", cfg: func(c *vm.Config) { c.Image = "" }, err: vm.ErrInvalidConfig},
		{name: "Lifetime zero", cfg: func(*vm.Config) {}, opts: append(ok, kube.WithLifetime(0)), err: vm.ErrInvalidConfig},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := vm.Config{Image: "localhost/busybox:1"}
			c.cfg(&cfg)
			opts := c.opts
			if opts == nil {
				opts = ok
			}
			v, err := kube.New(context.Background(), cfg, opts...)
			if c.err == nil {
				require.NoError(t, err)
				assert.Equal(t, "", v.ID())
				require.NoError(t, v.Remove(context.Background()))
				return
			}
			require.Error(t, err)
			assert.True(t, errors.Is(err, c.err), "%v is not %v", err, c.err)
			assert.Nil(t, v)
		})
	}
}

// With no cluster configuration at all, New says so.
func TestNewNoCluster(t *testing.T) {
	t.Setenv("KUBECONFIG", filepath.Join(t.TempDir(), "none"))
	t.Setenv("HOME", t.TempDir())
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	_, err := kube.New(context.Background(), vm.Config{Image: "x", Network: "pod"})
	assert.ErrorIs(t, err, vm.ErrUnavailable)
}

// An API server that does not answer fails Create with ErrUnavailable.
func TestCreateUnreachable(t *testing.T) {
	v, err := kube.New(context.Background(), vm.Config{Image: "x", Network: "pod"}, kube.WithKubeconfig(fakeKubeconfig(t)))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	assert.ErrorIs(t, v.Create(ctx), vm.ErrUnavailable)
	assert.NoError(t, v.Remove(ctx))
}

// Importing the package registers BackendKube for vm.New, and Backend
// names a configured one.
func TestBackendRegistered(t *testing.T) {
	cfgFile := fakeKubeconfig(t)
	t.Setenv("KUBECONFIG", cfgFile)
	v, err := vm.New(context.Background(), vm.Config{Image: "x", Network: "pod"}, vm.WithBackend(vm.BackendKube))
	require.NoError(t, err)
	assert.NoError(t, v.Remove(context.Background()))
	_, err = vm.New(context.Background(), vm.Config{Image: "x"}, vm.WithBackend(vm.BackendKube))
	assert.ErrorIs(t, err, vm.ErrNotSupported, "Network none, with nothing said about policies")

	b := kube.Backend(kube.WithKubeconfig(cfgFile), kube.WithUnenforcedNetworkPolicy())
	assert.Equal(t, b, kube.Backend(kube.WithKubeconfig(cfgFile), kube.WithUnenforcedNetworkPolicy()), "one name per configuration")
	assert.Equal(t, vm.BackendKube, kube.Backend())
	v, err = vm.New(context.Background(), vm.Config{Image: "x"}, vm.WithBackend(b))
	require.NoError(t, err)
	assert.NoError(t, v.Remove(context.Background()))
}

// Users of the Podman backends do not link client-go: package vm, and
// what it imports, never import Kubernetes' packages.
func TestVMDoesNotImportKubernetes(t *testing.T) {
	goBin, err := osexec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := osexec.Command(goBin, "list", "-deps", "github.com/podvm/podvm/vm").Output()
	require.NoError(t, err)
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "k8s.io/") || strings.HasPrefix(pkg, "github.com/podvm/podvm/internal/kube") {
			t.Errorf("package vm depends on %s", pkg)
		}
	}
}

// Kubernetes cannot restore a checkpoint: CheckpointSupport,
// TakeCheckpoint and Suspend say so, naming why, without asking the
// cluster (here, one that never answers).
func TestCheckpointsRefused(t *testing.T) {
	v, err := kube.New(context.Background(), vm.Config{Image: "x", Network: "pod"}, kube.WithKubeconfig(fakeKubeconfig(t)))
	require.NoError(t, err)
	err = vm.CheckpointSupport(context.Background(), v)
	require.ErrorIs(t, err, vm.ErrNotSupported)
	assert.ErrorContains(t, err, "nothing restores one")
	_, err = vm.TakeCheckpoint(context.Background(), v, vm.CheckpointOptions{})
	require.ErrorIs(t, err, vm.ErrNotSupported, "before anything, created or not")
	require.ErrorIs(t, vm.Suspend(context.Background(), v), vm.ErrNotSupported)
	assert.NoError(t, v.Remove(context.Background()))
}
