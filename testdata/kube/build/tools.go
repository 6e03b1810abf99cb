//go:build tools

// Package build pins, for scripts/kube-up.sh, the Kubernetes commands it
// builds. It is a module of its own: the project's module does not depend on
// k8s.io/kubernetes, and `go ./...` in the repository does not enter testdata.
package build

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
