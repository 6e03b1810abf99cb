package vm

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/podvm/podvm/exec"
)

// Only a run that Remove began during, and that ended as Remove ends runs,
// is reported as removed.
func TestEnded(t *testing.T) {
	boom := errors.New("boom")
	for _, c := range []struct {
		name          string
		removedBefore bool
		removedNow    bool
		res           *exec.Result
		err           error
		removed       bool
	}{
		{"not removed", false, false, &exec.Result{ExitCode: 137}, nil, false},
		{"killed by the removal", false, true, &exec.Result{ExitCode: 137}, nil, true},
		{"failed as the container went", false, true, nil, boom, true},
		{"its own exit status", false, true, &exec.Result{ExitCode: 1}, nil, false},
		{"podman's failure as the container went", false, true, &exec.Result{ExitCode: 125}, nil, true},
		{"clean exit", false, true, &exec.Result{}, nil, false},
		{"removed before the call", true, true, nil, fmt.Errorf("x: %w", ErrRemoved), true},
		{"invalid command", false, true, nil, fmt.Errorf("x: %w", exec.ErrInvalidCommand), false},
		{"refused, Remove having begun since the call", false, true, nil, fmt.Errorf("x: %w", ErrRemoved), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var s state
			if c.removedNow {
				s.markRemoved()
			}
			res, err := s.ended("sh", c.removedBefore, c.res, c.err)
			assert.Same(t, c.res, res)
			assert.Equal(t, c.removed, errors.Is(err, ErrRemoved), "%v", err)
			if c.err != nil {
				assert.ErrorIs(t, err, c.err)
			}
			if errors.Is(c.err, ErrRemoved) {
				assert.Equal(t, c.err, err, "reported once, as it was")
			}
		})
	}
}
