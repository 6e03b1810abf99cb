package kube

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/testkit"
)

// fakeDriver is a driver on client-go's fake clientset, whose pod
// creations get the name "podvm-test" and a UID, as from an API server.
func fakeDriver(t *testing.T) (*Driver, *fake.Clientset) {
	t.Helper()
	cs := fake.NewClientset()
	cs.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		p := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).DeepCopy()
		p.Name, p.UID = "podvm-test", types.UID("uid-1")
		return true, p, nil
	})
	o := Options{Namespace: "ns", DenyAll: true}
	return New(&Client{CS: cs, REST: &rest.Config{Host: "https://x"}}, o), cs
}

// verbs lists the fake's actions as "verb resource".
func verbs(cs *fake.Clientset) []string {
	var out []string
	for _, a := range cs.Actions() {
		out = append(out, a.GetVerb()+" "+a.GetResource().Resource)
	}
	return out
}

// Network "none": the pod first, then its policy, owned by it from the
// create on, so that nothing can leave the policy without an owner.
func TestCreateOwnsItsPolicy(t *testing.T) {
	d, cs := fakeDriver(t)
	spec := baseSpec()
	spec.Network = "none"
	id, err := d.Create(context.Background(), spec)
	require.NoError(t, err)
	assert.Equal(t, "podvm-test", id)
	require.Equal(t, []string{"create pods", "create networkpolicies"}, verbs(cs))
	np := cs.Actions()[1].(k8stesting.CreateAction).GetObject().(*networkingv1.NetworkPolicy)
	require.Len(t, np.OwnerReferences, 1)
	ref := np.OwnerReferences[0]
	assert.Equal(t, "v1", ref.APIVersion)
	assert.Equal(t, "Pod", ref.Kind)
	assert.Equal(t, "podvm-test", ref.Name)
	assert.Equal(t, types.UID("uid-1"), ref.UID)
	assert.Nil(t, ref.BlockOwnerDeletion)
	p := cs.Actions()[0].(k8stesting.CreateAction).GetObject().(*corev1.Pod)
	assert.Equal(t, np.Spec.PodSelector.MatchLabels, map[string]string{labelSandbox: p.Labels[labelSandbox]})
	assert.NotEmpty(t, p.Labels[labelSandbox])
}

// Another network makes no policy.
func TestCreateNoPolicy(t *testing.T) {
	d, cs := fakeDriver(t)
	_, err := d.Create(context.Background(), baseSpec())
	require.NoError(t, err)
	assert.Equal(t, []string{"create pods"}, verbs(cs))
}

// A policy the API server refuses: no pod is left running without it.
func TestCreatePolicyRefused(t *testing.T) {
	d, cs := fakeDriver(t)
	cs.PrependReactor("create", "networkpolicies", func(k8stesting.Action) (bool, kruntime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "networking.k8s.io", Resource: "networkpolicies"}, "", errors.New("no"))
	})
	spec := baseSpec()
	spec.Network = "none"
	id, err := d.Create(context.Background(), spec)
	require.Error(t, err)
	assert.ErrorIs(t, err, driver.ErrEngine)
	assert.True(t, apierrors.IsForbidden(err), "%v", err)
	assert.Empty(t, id)
	require.Equal(t, []string{"create pods", "create networkpolicies", "delete pods"}, verbs(cs))
	del := cs.Actions()[2].(k8stesting.DeleteAction)
	assert.Equal(t, "podvm-test", del.GetName())
	assert.Equal(t, int64(0), *del.GetDeleteOptions().GracePeriodSeconds)
	d.mu.Lock()
	defer d.mu.Unlock()
	assert.Empty(t, d.installs, "CopyIn would keep an agent for a deleted pod")
}

// On a cluster that enforces policies, a pod with a deny-all policy
// runs nothing of the caller's before its status names its IP: the gate
// waits for it, reading the status until it does, and says why when the
// pod failed or ctx ended first. Elsewhere, and for a pod with no
// policy, the gate does not wait.
func TestBeforeGateWaitsForTheIP(t *testing.T) {
	t.Parallel()
	made := func(enforced bool, network string, status ...corev1.PodStatus) (*Driver, *fake.Clientset, string) {
		d, cs := fakeDriver(t)
		d.o.Enforced = enforced
		spec := baseSpec()
		spec.Network = network
		id, err := d.Create(context.Background(), spec)
		require.NoError(t, err)
		gets := 0
		cs.PrependReactor("get", "pods", func(k8stesting.Action) (bool, kruntime.Object, error) {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: "ns"}}
			p.Status = status[min(gets, len(status)-1)]
			gets++
			return true, p, nil
		})
		return d, cs, id
	}
	gets := func(cs *fake.Clientset) int {
		n := 0
		for _, v := range verbs(cs) {
			if v == "get pods" {
				n++
			}
		}
		return n
	}
	none, ip := corev1.PodStatus{Phase: corev1.PodRunning}, corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.7"}

	t.Run("enforced", func(t *testing.T) {
		d, cs, id := made(true, "none", none, none, ip)
		require.NoError(t, d.beforeGate(context.Background(), id))
		assert.Equal(t, 3, gets(cs), "status reads")
		require.NoError(t, d.beforeGate(context.Background(), id))
		assert.Equal(t, 3, gets(cs), "a second gate waits for nothing")
	})
	for _, c := range []struct {
		name     string
		enforced bool
		network  string
	}{{"unenforced", false, "none"}, {"no policy", true, "pod"}} {
		t.Run(c.name, func(t *testing.T) {
			d, cs, id := made(c.enforced, c.network, none)
			require.NoError(t, d.beforeGate(context.Background(), id))
			assert.Zero(t, gets(cs), "status reads")
		})
	}
	t.Run("failed", func(t *testing.T) {
		exited := corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{{Name: Main,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 3, Reason: "Error"}}}}}
		d, _, id := made(true, "none", none, exited)
		assert.ErrorIs(t, d.beforeGate(context.Background(), id), driver.ErrContainerNotRunning)
	})
	t.Run("ctx", func(t *testing.T) {
		d, _, id := made(true, "none", none)
		ctx, cancel := context.WithTimeout(context.Background(), 3*ipEvery)
		defer cancel()
		err := d.beforeGate(ctx, id)
		assert.ErrorIs(t, err, context.DeadlineExceeded)
		assert.ErrorContains(t, err, "NetworkPolicy")
	})
	t.Run("removed", func(t *testing.T) {
		d, cs, id := made(true, "none", none)
		require.NoError(t, d.Remove(context.Background(), id))
		require.NoError(t, d.beforeGate(context.Background(), id))
		assert.Zero(t, gets(cs), "status reads after Remove")
	})
	t.Run("removed while waiting", func(t *testing.T) {
		d, cs, id := made(true, "none", none, ip)
		cs.PrependReactor("get", "pods", func(k8stesting.Action) (bool, kruntime.Object, error) {
			d.mu.Lock()
			delete(d.policed, id) // as Remove or Close do (a reactor cannot call the fake)
			d.mu.Unlock()
			return false, nil, nil
		})
		assert.ErrorIs(t, d.beforeGate(context.Background(), id), driver.ErrNoSuchContainer)
	})
	t.Run("a read that fails for a moment", func(t *testing.T) {
		d, cs, id := made(true, "none", none, ip)
		failed := false
		cs.PrependReactor("get", "pods", func(k8stesting.Action) (bool, kruntime.Object, error) {
			if !failed {
				failed = true
				return true, nil, apierrors.NewInternalError(errors.New("etcd is slow"))
			}
			return false, nil, nil
		})
		require.NoError(t, d.beforeGate(context.Background(), id))
		assert.Equal(t, 3, gets(cs), "status reads: the failed one, then none, then the IP")
	})
	t.Run("gone", func(t *testing.T) {
		d, cs, id := made(true, "none", none)
		cs.PrependReactor("get", "pods", func(k8stesting.Action) (bool, kruntime.Object, error) {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "pods"}, id)
		})
		assert.ErrorIs(t, d.beforeGate(context.Background(), id), driver.ErrNoSuchContainer)
		assert.Equal(t, 1, gets(cs), "status reads")
	})
}

// retry tries at once for a pod that starts at once, then less often.
func TestRetryPause(t *testing.T) {
	assert.Equal(t, retryEvery, pause(1))
	assert.Equal(t, retryEvery, pause(retryFast))
	assert.Equal(t, retrySlow, pause(retryFast+1))
}

// session is a held attach of the tests' own: it records, in order, its
// stdin's closing, its end and the pod's deletion (Driver.Remove's steps).
type session struct {
	s *stream

	mu     sync.Mutex
	events []string
	stdin  chan struct{} // closed with the session's stdin
	ended  sync.Once
	cut    bool
}

// newSession returns a session held by d for pod "podvm-test", whose
// deletion it records.
func newSession(t *testing.T, d *Driver, cs *fake.Clientset) *session {
	t.Helper()
	ss := &session{stdin: make(chan struct{})}
	ss.s = &stream{done: make(chan struct{}), cancel: func() {
		ss.mu.Lock()
		ss.cut = true
		ss.mu.Unlock()
		ss.end()
	}}
	ss.s.closers = []io.Closer{closer(func() { ss.record("stdin closed"); close(ss.stdin) })}
	cs.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		ss.record("pod deleted")
		return false, nil, nil
	})
	d.mu.Lock()
	d.held["podvm-test"] = ss.s
	d.mu.Unlock()
	return ss
}

func (ss *session) record(e string) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.events = append(ss.events, e)
}

// end ends the session, as Main's exit does.
func (ss *session) end() {
	ss.ended.Do(func() { ss.record("session ended"); close(ss.s.done) })
}

func (ss *session) log() ([]string, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return append([]string(nil), ss.events...), ss.cut
}

type closer func()

func (c closer) Close() error { c(); return nil }

// removeAsync runs d.Remove of "podvm-test" in a goroutine.
func removeAsync(ctx context.Context, d *Driver) <-chan error {
	done := make(chan error, 1)
	go func() { done <- d.Remove(ctx, "podvm-test") }()
	return done
}

// Remove closes PID 1's stdin and deletes the pod only once the attach
// holding it ended by itself (Main's process exited), with grace 0.
func TestRemoveEndsPID1First(t *testing.T) {
	d, cs := fakeDriver(t)
	ss := newSession(t, d, cs)
	removed := removeAsync(context.Background(), d)
	<-ss.stdin
	time.Sleep(400 * time.Millisecond) // past stream.Close's 250 ms
	events, _ := ss.log()
	assert.Equal(t, []string{"stdin closed"}, events, "the pod deleted while PID 1 may run")
	ss.end()
	require.NoError(t, <-removed)
	events, cut := ss.log()
	assert.Equal(t, []string{"stdin closed", "session ended", "pod deleted"}, events)
	assert.False(t, cut, "the session was cut, not left to end")
	del := cs.Actions()[len(cs.Actions())-1].(k8stesting.DeleteAction)
	assert.Equal(t, "podvm-test", del.GetName())
	assert.Equal(t, int64(0), *del.GetDeleteOptions().GracePeriodSeconds)
	d.mu.Lock()
	defer d.mu.Unlock()
	assert.Empty(t, d.held)
}

// A PID 1 that does not exit holds Remove up for endWait, then the
// session is cut and the pod deleted.
func TestRemoveBound(t *testing.T) {
	defer func(w time.Duration) { endWait = w }(endWait)
	endWait = 200 * time.Millisecond
	d, cs := fakeDriver(t)
	ss := newSession(t, d, cs)
	start := time.Now()
	require.NoError(t, d.Remove(context.Background(), "podvm-test"))
	assert.GreaterOrEqual(t, time.Since(start), endWait)
	events, cut := ss.log()
	assert.Equal(t, []string{"stdin closed", "session ended", "pod deleted"}, events)
	assert.True(t, cut)
}

// ... or until ctx ends.
func TestRemoveContext(t *testing.T) {
	d, cs := fakeDriver(t)
	ss := newSession(t, d, cs)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = d.Remove(ctx, "podvm-test") // the fake deletes even with ctx done
	assert.Less(t, time.Since(start), endWait)
	events, cut := ss.log()
	assert.Equal(t, []string{"stdin closed", "session ended", "pod deleted"}, events)
	assert.True(t, cut)
}

// The agent's stream closed (as package vm does when the handshake
// fails) before Remove: Close leaves the attach to end by itself, and
// Remove still waits for that.
func TestRemoveAfterAttachedClose(t *testing.T) {
	d, cs := fakeDriver(t)
	ss := newSession(t, d, cs)
	a := &attached{s: ss.s}
	require.NoError(t, a.Close())
	<-ss.stdin
	removed := removeAsync(context.Background(), d)
	time.Sleep(300 * time.Millisecond) // past stream.Close's 250 ms
	events, cut := ss.log()
	assert.Equal(t, []string{"stdin closed"}, events)
	assert.False(t, cut, "Close cut the attach")
	ss.end()
	require.NoError(t, <-removed)
	events, _ = ss.log()
	assert.Equal(t, []string{"stdin closed", "session ended", "pod deleted"}, events)
}

// Without an attach held, Remove deletes at once; a pod already gone is
// no error.
func TestRemoveNothingHeld(t *testing.T) {
	d, cs := fakeDriver(t)
	require.NoError(t, d.Remove(context.Background(), "gone"))
	assert.Equal(t, []string{"delete pods"}, verbs(cs))
}

// List finds the pods of its namespace that carry the label, and marks
// Ended those in a final phase, and only those.
func TestList(t *testing.T) {
	mk := func(ns, name string, labels map[string]string, phase corev1.PodPhase) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}, Status: corev1.PodStatus{Phase: phase}}
	}
	ours := map[string]string{"io.podvm.managed": "true", "team": "a"}
	cs := fake.NewClientset(
		mk("ns", "pending", ours, corev1.PodPending),
		mk("ns", "running", ours, corev1.PodRunning),
		mk("ns", "succeeded", ours, corev1.PodSucceeded),
		mk("ns", "failed", ours, corev1.PodFailed),
		mk("ns", "unknown", ours, corev1.PodUnknown),
		mk("ns", "no-phase", ours, ""),
		mk("ns", "not-podvm", map[string]string{"team": "a"}, corev1.PodFailed),
		mk("other", "elsewhere", ours, corev1.PodFailed),
	)
	d := New(&Client{CS: cs, REST: &rest.Config{}}, Options{Namespace: "ns"})
	list, err := d.List(context.Background(), "io.podvm.managed=true")
	require.NoError(t, err)
	ended := map[string]bool{}
	for _, c := range list {
		assert.Equal(t, ours, c.Labels, c.ID)
		ended[c.ID] = c.Ended
	}
	assert.Equal(t, map[string]bool{
		"pending": false, "running": false, "unknown": false, "no-phase": false,
		"succeeded": true, "failed": true,
	}, ended)
}

// An attach's stdin is held longer when its upgrade was slow: the reset
// of an attach to a container not started yet comes later on a busy
// machine, as the upgrade does.
func TestStdinHoldFollowsTheUpgrade(t *testing.T) {
	assert.Equal(t, stdinHold, hold(5*time.Millisecond), "a quiet machine")
	assert.Equal(t, 300*time.Millisecond, hold(100*time.Millisecond), "a busy one")
	assert.Equal(t, maxStdinHold, hold(time.Minute), "bounded")
}

// CopyIn of the agent before Attach keeps its tar stream, in whole
// blocks, and makes no request; Remove and Close forget it.
func TestCopyInKeepsTheAgent(t *testing.T) {
	d, cs := fakeDriver(t)
	ctx := context.Background()
	id, err := d.Create(ctx, baseSpec())
	require.NoError(t, err)
	stream := testkit.Tar(t, testkit.Dir(".podvm/", 0o755), testkit.File(".podvm/podvm-agent", "agent", 0o755))
	require.NoError(t, d.CopyIn(ctx, id, "/", bytes.NewReader(stream)))
	assert.Equal(t, []string{"create pods"}, verbs(cs), "no request but the pod's")
	d.mu.Lock()
	kept := d.installs[id]
	d.mu.Unlock()
	assert.Zero(t, len(kept)%512, "whole 512-byte blocks")
	entries, err := testkit.Untar(kept)
	require.NoError(t, err)
	assert.Equal(t, []string{".podvm/podvm-agent"}, testkit.Names(entries), "the volume's own entry dropped, the agent kept")

	require.NoError(t, d.Remove(ctx, id))
	d.mu.Lock()
	assert.Empty(t, d.installs, "Remove forgets the agent")
	d.mu.Unlock()

	id, err = d.Create(ctx, baseSpec())
	require.NoError(t, err)
	require.NoError(t, d.CopyIn(ctx, id, "/", bytes.NewReader(stream)))
	d.Close()
	d.mu.Lock()
	assert.Empty(t, d.installs, "Close forgets the agents of pods not removed")
	d.mu.Unlock()

	// Over the bound, or no tar stream: refused.
	for _, r := range []io.Reader{io.LimitReader(zeros{}, maxInstall+1), strings.NewReader("not a tar stream, but long enough to fill a header block? no")} {
		id, err = d.Create(ctx, baseSpec())
		require.NoError(t, err)
		assert.ErrorIs(t, d.CopyIn(ctx, id, "/", r), driver.ErrInvalidConfig)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// A stream that ends before the agent's handshake says why, as the
// pod's status does once the kubelet reports it; with nothing to say
// there, what the stream said.
func TestDiagnose(t *testing.T) {
	defer func(w time.Duration) { diagnoseWait = w }(diagnoseWait)
	diagnoseWait = time.Second
	lacking := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "lacking", Namespace: "ns"}, Status: corev1.PodStatus{
		ContainerStatuses: []corev1.ContainerStatus{{Name: Main, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
			ExitCode: 127, Message: "podvm: the image lacks dd, which installing the agent needs\n"}}}}}}
	running := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "running", Namespace: "ns"}, Status: corev1.PodStatus{
		ContainerStatuses: []corev1.ContainerStatus{{Name: Main, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}}
	d := New(&Client{CS: fake.NewClientset(lacking, running), REST: &rest.Config{Host: "https://x"}}, Options{Namespace: "ns"})

	r := &dotless{r: strings.NewReader("..."), early: func(err error) error { return d.diagnose("lacking", err) }}
	_, err := io.ReadAll(r)
	assert.ErrorIs(t, err, driver.ErrNotSupported)
	assert.ErrorContains(t, err, "lacks dd")

	start := time.Now()
	r = &dotless{r: strings.NewReader(".."), early: func(err error) error { return d.diagnose("running", err) }}
	_, err = r.Read(make([]byte, 8))
	assert.Equal(t, io.EOF, err, "nothing to say but the stream's end")
	assert.Less(t, time.Since(start), 5*time.Second)

	// After the handshake's first byte, an end is the stream's own.
	called := false
	r = &dotless{r: strings.NewReader("..hello"), early: func(err error) error { called = true; return err }}
	got, err := io.ReadAll(r)
	require.NoError(t, err)
	assert.Equal(t, "hello", string(got))
	assert.False(t, called)
}
