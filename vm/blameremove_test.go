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
func TestBlameRemove(t *testing.T) {
	boom := errors.New("boom")
	for _, c := range []struct {
		name       string
		removedNow bool
		res        *exec.Result
		err        error
		removed    bool
	}{
		{"not removed", false, &exec.Result{ExitCode: 137}, nil, false},
		{"killed by the removal", true, &exec.Result{ExitCode: 137}, nil, true},
		{"failed as the container went", true, nil, boom, true},
		{"its own exit status", true, &exec.Result{ExitCode: 1}, nil, false},
		{"podman's failure as the container went", true, &exec.Result{ExitCode: 125}, nil, true},
		{"clean exit", true, &exec.Result{}, nil, false},
		{"invalid command", true, nil, fmt.Errorf("x: %w", exec.ErrInvalidCommand), false},
		{"refused, Remove having begun", true, nil, fmt.Errorf("x: %w", ErrRemoved), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			var s sandbox
			if c.removedNow {
				s.st.Store(&state{removed: true})
			}
			res, err := s.blameRemove("sh", c.res, c.err)
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
