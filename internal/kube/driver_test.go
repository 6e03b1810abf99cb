package kube

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
)

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
