package vm_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/mock/gomock"

	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/vmmock"
)

// A VM that cannot take snapshots (a mock, a user's backend) says so, and
// bad options are refused before the VM is asked.
func TestSnapshotNotSupported(t *testing.T) {
	t.Parallel()
	v := vmmock.NewMockVM(gomock.NewController(t)) // no call expected
	ctx := context.Background()
	_, err := vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{})
	assert.ErrorIs(t, err, vm.ErrNotSupported)
	assert.ErrorIs(t, vm.RemoveSnapshot(ctx, v, "localhost/x:latest"), vm.ErrNotSupported)
	_, err = vm.TakeSnapshot(ctx, v, vm.SnapshotOptions{Name: "Not/Valid"})
	assert.ErrorIs(t, err, vm.ErrInvalidSnapshot)
	assert.ErrorIs(t, vm.RemoveSnapshot(ctx, v, "--all"), vm.ErrInvalidSnapshot)
}
