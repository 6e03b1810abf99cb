package kube_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	osexec "os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/agent"
	"github.com/podvm/podvm/internal/testkit"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/kube"
	"github.com/podvm/podvm/vm/vmtest"
)

// The integration tests run on the cluster $KUBECONFIG names, with the
// image $PODVM_KUBE_IMAGE present on its nodes (a busybox: sh, tar, cat),
// in $PODVM_KUBE_NAMESPACE (default: the context's). Without them they
// skip, and fail under CI=true or PODVM_REQUIRE_KUBE=1, so CI never
// passes by skipping.

// env is the cluster the tests use.
type env struct {
	kubeconfig, image, namespace string
	cs                           kubernetes.Interface
}

// runLabel marks every pod this test process makes, for the leak check.
const runLabel = "io.podvm.test-run"

var runID = func() string {
	if id := os.Getenv("PODVM_KUBE_RUN_ID"); id != "" {
		return id // an owner of TestOwnerDies: the run that started it
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}()

// requireKube is the variable that, set to 1, makes a missing cluster
// fail the tests as CI=true does.
const requireKube = "PODVM_REQUIRE_KUBE"

// lookup returns the configured cluster, or why there is none.
func lookup() (env, string) {
	e := env{kubeconfig: os.Getenv("KUBECONFIG"), image: os.Getenv("PODVM_KUBE_IMAGE"), namespace: os.Getenv("PODVM_KUBE_NAMESPACE")}
	if e.kubeconfig == "" || e.image == "" {
		return e, "integration test needs a Kubernetes cluster: set KUBECONFIG and PODVM_KUBE_IMAGE (and PODVM_KUBE_NAMESPACE)"
	}
	rc, err := clientcmd.BuildConfigFromFlags("", e.kubeconfig)
	if err != nil {
		return e, err.Error()
	}
	if e.cs, err = kubernetes.NewForConfig(rc); err != nil {
		return e, err.Error()
	}
	if e.namespace == "" {
		e.namespace = "default"
	}
	return e, ""
}

func need(t testing.TB) env {
	t.Helper()
	e, why := lookup()
	if why != "" {
		testkit.SkipOrFail(t, requireKube, why)
	}
	return e
}

// TestMain also checks, after the tests, that no pod they made is left,
// and serves as the crashing owner of TestOwnerDies.
func TestMain(m *testing.M) {
	if os.Getenv("PODVM_KUBE_OWNER") == "1" {
		os.Exit(owner())
	}
	if e, why := lookup(); why == "" {
		reapEarlierRuns(e)
	}
	code := m.Run()
	if e, why := lookup(); why == "" && code == 0 {
		code = checkNoLeak(e)
	}
	os.Exit(code)
}

// reapEarlierRuns removes the pods that processes that ended without
// cleaning up, an earlier test binary killed by its timeout among them,
// left in the test namespace. A run's own leaks still fail it
// (checkNoLeak); they do not fail the next one.
func reapEarlierRuns(e env) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	removed, err := vm.Reap(ctx, 0, vm.WithBackend(kube.Backend(e.options()...)))
	if len(removed) > 0 || err != nil {
		fmt.Fprintf(os.Stderr, "vm/kube: reaped %d pods that ended processes left in %s (errors: %v)\n", len(removed), e.namespace, err)
	}
}

func checkNoLeak(e env) int {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		list, err := e.cs.CoreV1().Pods(e.namespace).List(ctx, metav1.ListOptions{LabelSelector: runLabel + "=" + runID})
		if err == nil && len(list.Items) == 0 {
			return 0
		}
		if ctx.Err() != nil {
			fmt.Fprintf(os.Stderr, "leak: pods of this run are left in %s: %v %v\n", e.namespace, names(list), err)
			return 1
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func names(l *corev1.PodList) []string {
	if l == nil {
		return nil
	}
	var n []string
	for _, p := range l.Items {
		n = append(n, p.Name+"("+string(p.Status.Phase)+")")
	}
	return n
}

// enforced reports whether the cluster's network plugin enforces
// NetworkPolicy, as $PODVM_KUBE_NETWORKPOLICY says (the scripts that
// bring the cluster up know: the CNI bridge does not).
func enforced() bool { return os.Getenv("PODVM_KUBE_NETWORKPOLICY") == "enforced" }

// options are the backend's options on e. Where policies are not
// enforced the tests accept it in writing.
func (e env) options() []kube.Option {
	policy := kube.WithUnenforcedNetworkPolicy()
	if enforced() {
		policy = kube.WithNetworkPolicy()
	}
	return []kube.Option{kube.WithKubeconfig(e.kubeconfig), kube.WithNamespace(e.namespace), policy, kube.WithLifetime(time.Hour)}
}

// config completes cfg for the test cluster: its image, never pulled,
// and the run's label.
func (e env) config(cfg vm.Config) vm.Config {
	if cfg.Image == "" {
		cfg.Image = e.image
	}
	if cfg.Pull == "" {
		cfg.Pull = vm.PullNever
	}
	cfg.Labels = maps.Clone(cfg.Labels)
	if cfg.Labels == nil {
		cfg.Labels = map[string]string{}
	}
	cfg.Labels[runLabel] = runID
	return cfg
}

// harness is the conformance suite's view of the kube backend.
type harness struct {
	e    env
	exec bool // Config.PodmanExec: the exec API instead of the agent
}

func (h harness) NewVM(t *testing.T, cfg vm.Config) (vm.VM, error) {
	cfg = h.e.config(cfg)
	cfg.PodmanExec = h.exec
	return kube.New(context.Background(), cfg, h.e.options()...)
}

func (h harness) NewUnreachableVM(t *testing.T, cfg vm.Config) (vm.VM, error) {
	cfg = h.e.config(cfg)
	cfg.PodmanExec = h.exec
	return kube.New(context.Background(), cfg, kube.WithKubeconfig(fakeKubeconfig(t)), kube.WithUnenforcedNetworkPolicy())
}

// RemoveContainer deletes the pod as kubectl does, and waits until it is
// gone: then the kubelet has killed its containers (a forced deletion
// removes the object at once and leaves them running a moment longer).
func (h harness) RemoveContainer(ctx context.Context, id string) error {
	pods := h.e.cs.CoreV1().Pods(h.e.namespace)
	grace := int64(1)
	if err := pods.Delete(ctx, id, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		return err
	}
	for {
		if _, err := pods.Get(ctx, id, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return nil
		} else if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Limits are the promises a pod cannot keep whatever podvm does.
func (h harness) Limits() map[string]string {
	l := map[string]string{
		"hardening/defaults": "Kubernetes sets the pids limit per node (the pod's cgroup has the kubelet's podPidsLimit, the container's none), and a pod always has the pod network's interface; TestHardening checks the rest",
	}
	if h.exec {
		l["timeout/no-shell"] = "the exec API carries argv alone: the exec path sets a command's environment and directory through /bin/sh, which this case removes (the agent's path does without)"
	}
	if !enforced() {
		l["hardening/no-network"] = "the cluster's network plugin does not enforce NetworkPolicy (PODVM_KUBE_NETWORKPOLICY=" + os.Getenv("PODVM_KUBE_NETWORKPOLICY") + "), which the tests accepted with WithUnenforcedNetworkPolicy"
	}
	return l
}

func (h harness) Containers(ctx context.Context, label string) ([]vmtest.Container, error) {
	list, err := h.e.cs.CoreV1().Pods(h.e.namespace).List(ctx, metav1.ListOptions{LabelSelector: label})
	if err != nil {
		return nil, err
	}
	var out []vmtest.Container
	for _, p := range list.Items {
		out = append(out, vmtest.Container{ID: p.Name, Name: p.Name, Labels: p.Labels})
	}
	return out, nil
}

func (h harness) Tracked() bool { return !h.exec }

// GuardsPlantedLinks: on both paths a copy refuses a link the sandbox
// planted under its destination.
func (h harness) GuardsPlantedLinks() bool { return true }

// A first, plain check: create, run, copy, remove, with the agent.
func TestRoundTrip(t *testing.T) {
	e := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, viaExec := range []bool{false, true} {
		t.Run(fmt.Sprint("exec=", viaExec), func(t *testing.T) {
			cfg := e.config(vm.Config{Env: []string{"GREETING=hi"}, Workdir: "/tmp", PodmanExec: viaExec})
			v, err := kube.New(ctx, cfg, e.options()...)
			require.NoError(t, err)
			defer func() { assert.NoError(t, v.Remove(context.Background())) }()
			start := time.Now()
			require.NoError(t, v.Create(ctx))
			t.Logf("created %s in %v", v.ID(), time.Since(start))
			res, err := v.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", `echo "$GREETING $(pwd)"; echo oops >&2; exit 3`}})
			require.NoError(t, err)
			assert.Equal(t, "hi /tmp\n", res.Stdout)
			assert.Equal(t, "oops\n", res.Stderr)
			assert.Equal(t, 3, res.ExitCode)
			_, err = v.Run(ctx, exec.Command{Name: "no-such-command"})
			assert.ErrorIs(t, err, exec.ErrNotFound)
			start = time.Now()
			for range 10 {
				_, err = v.Run(ctx, exec.Command{Name: "true"})
				require.NoError(t, err)
			}
			t.Logf("a Run's round trip: %v", time.Since(start)/10)
		})
	}
}

// owner is the test binary as a process that makes a sandbox, prints its
// ID and waits to be killed.
func owner() int {
	e, why := lookup()
	if why != "" {
		fmt.Println("error:", why)
		return 1
	}
	cfg := e.config(vm.Config{PodmanExec: os.Getenv("PODVM_KUBE_OWNER_EXEC") == "1"})
	ctx := context.Background()
	v, err := kube.New(ctx, cfg, e.options()...)
	if err == nil {
		err = v.Create(ctx)
	}
	if err != nil {
		fmt.Println("error:", err)
		return 1
	}
	fmt.Println("id:", v.ID())
	select {}
}

// A pod whose owner dies without Remove ends by itself (its PID 1's
// stdin, the owner's attach, closes), and Reap removes it.
func TestOwnerDies(t *testing.T) {
	e := need(t)
	for _, viaExec := range []bool{false, true} {
		t.Run(fmt.Sprint("exec=", viaExec), func(t *testing.T) {
			cmd := osexec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "PODVM_KUBE_OWNER=1", "PODVM_KUBE_RUN_ID="+runID)
			if viaExec {
				cmd.Env = append(cmd.Env, "PODVM_KUBE_OWNER_EXEC=1")
			}
			out, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			line, _ := bufio.NewReader(out).ReadString('\n')
			id, ok := strings.CutPrefix(strings.TrimSpace(line), "id: ")
			require.True(t, ok, "the owner said %q", line)
			pods := e.cs.CoreV1().Pods(e.namespace)
			t.Cleanup(func() {
				_ = pods.Delete(context.Background(), id, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
			})
			require.NoError(t, cmd.Process.Kill())
			_ = cmd.Wait()

			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var phase corev1.PodPhase
			for ctx.Err() == nil {
				p, err := pods.Get(ctx, id, metav1.GetOptions{})
				require.NoError(t, err)
				if phase = p.Status.Phase; phase == corev1.PodSucceeded || phase == corev1.PodFailed {
					break
				}
				time.Sleep(250 * time.Millisecond)
			}
			assert.Contains(t, []corev1.PodPhase{corev1.PodSucceeded, corev1.PodFailed}, phase, "the pod of a dead owner still runs")

			// As if its owner had run on another machine, which Reap
			// cannot ask: the pod is reaped for having ended.
			other := fmt.Sprintf(`{"metadata":{"labels":{%q:"0123456789abcdef.1.1",%q:"another-machine"}}}`, vm.LabelOwner, vm.LabelOwnerHost)
			_, err = pods.Patch(ctx, id, types.MergePatchType, []byte(other), metav1.PatchOptions{})
			require.NoError(t, err)
			removed, err := vm.Reap(ctx, 0, vm.WithBackend(kube.Backend(e.options()...)), vm.WithLabel(runLabel, runID))
			require.NoError(t, err)
			assert.Contains(t, removed, id)
		})
	}
}

// What vmtest's hardening/defaults checks and a pod can keep: root with
// vm.DefaultCapabilities only, no-new-privileges, and no service account
// token; the pod's pids limit is the kubelet's.
func TestHardening(t *testing.T) {
	e := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, viaExec := range []bool{false, true} {
		t.Run(fmt.Sprint("exec=", viaExec), func(t *testing.T) {
			v, err := kube.New(ctx, e.config(vm.Config{PodmanExec: viaExec}), e.options()...)
			require.NoError(t, err)
			defer func() { assert.NoError(t, v.Remove(context.Background())) }()
			require.NoError(t, v.Create(ctx))
			res, err := v.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", `id -u
grep -E '^(NoNewPrivs|CapEff|Seccomp):' /proc/self/status | tr -s '\t ' ' '
ls /var/run/secrets/kubernetes.io/serviceaccount 2>&1 | head -1`}})
			require.NoError(t, err)
			assert.Equal(t, "0\nCapEff: 00000000000000fb\nNoNewPrivs: 1\nSeccomp: 2\nls: /var/run/secrets/kubernetes.io/serviceaccount: No such file or directory\n", res.Stdout)
		})
	}
}

// vm.Pool over the kube backend: warm pods are handed out at once, each
// runs, and nothing is left once they are removed and the pool closed.
func TestPool(t *testing.T) {
	e := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	newVM := func(ctx context.Context, cfg vm.Config) (vm.VM, error) { return kube.New(ctx, cfg, e.options()...) }
	p, err := vm.NewPool(e.config(vm.Config{}), newVM, vm.WithPoolSize(2))
	require.NoError(t, err)
	defer func() { assert.NoError(t, p.Close(context.Background())) }()
	v, err := p.Get(ctx) // cold: waits for a create
	require.NoError(t, err)
	res, err := v.Run(ctx, exec.Command{Name: "echo", Args: []string{"pooled"}})
	require.NoError(t, err)
	assert.Equal(t, "pooled\n", res.Stdout)
	require.NoError(t, v.Remove(ctx))
	for p.Stats().Ready < 2 && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
	}
	// A warm Get hands out a pod that was made before it: one of those
	// listed now (not a time bound: this machine is shared and noisy).
	ready, err := e.cs.CoreV1().Pods(e.namespace).List(ctx, metav1.ListOptions{LabelSelector: vm.LabelPool + "=" + p.ID()})
	require.NoError(t, err)
	start := time.Now()
	w, err := p.Get(ctx) // warm
	took := time.Since(start)
	require.NoError(t, err)
	t.Logf("a warm Get: %v", took)
	var made []string
	for _, pod := range ready.Items {
		made = append(made, pod.Name)
	}
	assert.Contains(t, made, w.ID(), "a warm Get waited for a create")
	res, err = w.Run(ctx, exec.Command{Name: "true"})
	require.NoError(t, err)
	assert.Equal(t, 0, res.ExitCode)
	require.NoError(t, w.Remove(ctx))
}

// Network "none" is a deny-all NetworkPolicy selecting the pod alone,
// owned by it (gone with it), that lets in the agent's peers alone.
func TestNetworkPolicy(t *testing.T) {
	e := need(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := kube.New(ctx, e.config(vm.Config{}), e.options()...)
	require.NoError(t, err)
	require.NoError(t, v.Create(ctx))
	pod, err := e.cs.CoreV1().Pods(e.namespace).Get(ctx, v.ID(), metav1.GetOptions{})
	require.NoError(t, err)
	policies, err := e.cs.NetworkingV1().NetworkPolicies(e.namespace).List(ctx, metav1.ListOptions{LabelSelector: runLabel + "=" + runID})
	require.NoError(t, err)
	var found int
	for _, np := range policies.Items {
		if len(np.OwnerReferences) == 1 && np.OwnerReferences[0].UID == pod.UID {
			found++
			assert.Len(t, np.Spec.PolicyTypes, 2)
			// In: the agent's peers' port alone (direct_test.go). Out:
			// nothing.
			require.Len(t, np.Spec.Ingress, 1)
			require.Len(t, np.Spec.Ingress[0].Ports, 1)
			assert.Equal(t, int32(agent.PeerPort), np.Spec.Ingress[0].Ports[0].Port.IntVal)
			assert.Empty(t, np.Spec.Egress)
			sel := np.Spec.PodSelector.MatchLabels
			require.Len(t, sel, 1)
			for k, val := range sel {
				assert.Equal(t, val, pod.Labels[k], "the policy selects its pod")
			}
		}
	}
	assert.Equal(t, 1, found, "one deny-all policy owned by the pod")
	require.NoError(t, v.Remove(ctx))
	for ctx.Err() == nil {
		policies, err = e.cs.NetworkingV1().NetworkPolicies(e.namespace).List(ctx, metav1.ListOptions{LabelSelector: runLabel + "=" + runID})
		require.NoError(t, err)
		if len(policies.Items) == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Errorf("policies left after Remove: %d", len(policies.Items))
}

// A reader slower than the command: containerd and the API server drop
// output still in flight when an exec's process exits, and client-go then
// reports success. No path may return a short stdout or lose the exit
// status: 24 MiB through a writer taking 4 MiB/s.
func TestSlowReader(t *testing.T) {
	e := need(t)
	const size = 24 << 20
	for _, viaExec := range []bool{false, true} {
		t.Run(fmt.Sprint("exec=", viaExec), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			v, err := kube.New(ctx, e.config(vm.Config{PodmanExec: viaExec}), e.options()...)
			require.NoError(t, err)
			defer func() { assert.NoError(t, v.Remove(context.Background())) }()
			require.NoError(t, v.Create(ctx))
			w := &testkit.SlowWriter{Rate: 4 << 20}
			res, err := v.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", fmt.Sprintf("head -c %d /dev/zero; echo done >&2; exit 3", size)}, Stdout: w})
			require.NoError(t, err)
			assert.Equal(t, int64(size), w.N(), "bytes of stdout")
			assert.Equal(t, 3, res.ExitCode)
			assert.Equal(t, "done\n", res.Stderr)
		})
	}
}

// An image without /bin/sh, tar or cat (the node's pause image) cannot
// carry podvm's pod: Create says so as ErrNotSupported on both paths, and
// leaves no pod.
func TestImageWithoutShell(t *testing.T) {
	e := need(t)
	image := os.Getenv("PODVM_KUBE_SHELLLESS_IMAGE")
	if image == "" {
		testkit.SkipOrFail(t, requireKube, "PODVM_KUBE_SHELLLESS_IMAGE (an image without a shell on the node: scripts/kube-up.sh exports it) is not set")
	}
	for _, viaExec := range []bool{false, true} {
		t.Run(fmt.Sprint("exec=", viaExec), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			v, err := kube.New(ctx, e.config(vm.Config{Image: image, PodmanExec: viaExec}), e.options()...)
			require.NoError(t, err)
			err = v.Create(ctx)
			assert.ErrorIs(t, err, vm.ErrNotSupported)
			assert.ErrorContains(t, err, "lacks")
			assert.NoError(t, v.Remove(context.Background()))
		})
	}
}

// A Create logs nothing through client-go: its attaches, tried again
// until the kubelet has started the container, used to have client-go
// log "Unhandled Error ... connection reset by peer" on the process's
// stderr for about every other Create, when a write of stdin met the
// reset of an attach the kubelet had upgraded before the container ran.
// On a loaded machine the reset comes later: the hold follows the
// upgrade's time (internal/kube's hold). Not counted: client-go's own
// heartbeat, "Websocket Ping failed ... i/o timeout", which it logs of
// any stream when the process is starved of CPU, whatever the stream
// carries. Not parallel: klog's output is the process's.
func TestCreateLogsNothing(t *testing.T) {
	e := need(t)
	var buf testkit.LockedBuffer
	klog.LogToStderr(false)
	klog.SetOutput(&buf)
	t.Cleanup(func() {
		klog.SetOutput(os.Stderr)
		klog.LogToStderr(true)
	})
	for _, viaExec := range []bool{false, true} {
		for range 4 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			v, err := kube.New(ctx, e.config(vm.Config{PodmanExec: viaExec}), e.options()...)
			require.NoError(t, err)
			// When each step ends, to match against klog's times.
			at := func(step string) { t.Logf("%s %s (exec=%v)", time.Now().Format("15:04:05.000000"), step, viaExec) }
			require.NoError(t, v.Create(ctx))
			at("created")
			res, err := v.Run(ctx, exec.Command{Name: "echo", Args: []string{"hi"}})
			require.NoError(t, err)
			assert.Equal(t, "hi\n", res.Stdout)
			at("ran")
			require.NoError(t, v.Remove(ctx))
			at("removed")
			cancel()
		}
	}
	klog.Flush()
	var lines []string
	for l := range strings.Lines(buf.String()) {
		if !strings.Contains(l, "Websocket Ping failed") {
			lines = append(lines, l)
		}
	}
	assert.Empty(t, lines, "what client-go logged")
}
