package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/podvm/podvm/internal/driver"
)

// This file is where the API server's failures are recognised: one
// function, classify, that maps them to the seam's sentinels.

// classify wraps err, the failure of op on what (may be empty), with the
// sentinel it means: a pod that is not there is [driver.ErrNoSuchContainer],
// a name taken [driver.ErrNameInUse], a spec the API server refuses
// [driver.ErrInvalidConfig], a pod whose containers ended
// [driver.ErrContainerNotRunning], an API server that cannot be reached
// [driver.ErrUnavailable], anything else it said [driver.ErrEngine]. A
// context's error gets no sentinel.
func classify(op, what string, err error) error {
	if what != "" {
		op += " " + what
	}
	var sentinel error
	var ne net.Error
	switch msg := err.Error(); {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("vm: kube: %s: %w", op, err)
	case strings.Contains(msg, "would exceed context deadline"):
		// client-go's rate limiter refuses to wait past ctx's deadline
		// with an error of its own: the call was cut by the deadline.
		return fmt.Errorf("vm: kube: %s: %w (%v)", op, context.DeadlineExceeded, err)
	case apierrors.IsNotFound(err):
		sentinel = driver.ErrNoSuchContainer
	case apierrors.IsAlreadyExists(err):
		sentinel = driver.ErrNameInUse
	case apierrors.IsInvalid(err):
		sentinel = driver.ErrInvalidConfig
	case apierrors.IsBadRequest(err) && notRunning(msg):
		sentinel = driver.ErrContainerNotRunning
	case apierrors.IsServiceUnavailable(err), apierrors.IsServerTimeout(err), apierrors.IsTimeout(err),
		errors.As(err, &ne), strings.Contains(msg, "connection refused"), strings.Contains(msg, "no such host"):
		sentinel = driver.ErrUnavailable
	default:
		sentinel = driver.ErrEngine
	}
	return fmt.Errorf("%w: kube: %s: %w", sentinel, op, err)
}

// notRunning recognises the API server's refusal to attach or exec to a
// container that has ended, or not started
// (pkg/registry/core/pod/strategy.go, ResourceLocation's checks).
func notRunning(msg string) bool {
	for _, s := range []string{"completed pod", "is not running", "container not found", "is waiting to start", "not available"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
