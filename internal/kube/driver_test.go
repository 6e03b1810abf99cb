package kube

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/podvm/podvm/internal/driver"
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
	o := Options{Namespace: "ns", PullPolicy: corev1.PullNever, DenyAll: true}
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
	assert.ErrorIs(t, err, driver.ErrPodman)
	assert.True(t, apierrors.IsForbidden(err), "%v", err)
	assert.Empty(t, id)
	require.Equal(t, []string{"create pods", "create networkpolicies", "delete pods"}, verbs(cs))
	del := cs.Actions()[2].(k8stesting.DeleteAction)
	assert.Equal(t, "podvm-test", del.GetName())
	assert.Equal(t, int64(0), *del.GetDeleteOptions().GracePeriodSeconds)
	d.mu.Lock()
	defer d.mu.Unlock()
	assert.Empty(t, d.pending, "CopyIn would feed Install of a deleted pod")
}
