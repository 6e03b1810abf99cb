package vm

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// A sandbox handed out by a Pool has the capabilities of the VM it is:
// files, snapshots, processes and services reach the sandbox itself.
func TestPooledCapabilities(t *testing.T) {
	t.Parallel()
	for _, v := range []VM{new(APIVM), new(CLIVM)} {
		pv := &pooledVM{VM: v}
		_, files := capability[FileServer](pv)
		_, snaps := capability[Snapshotter](pv)
		_, procs := capability[ProcessStarter](pv)
		_, dials := capability[ServiceDialer](pv)
		_, copier := capability[checkedCopier](pv)
		assert.Equal(t, []bool{true, true, true, true, true}, []bool{files, snaps, procs, dials, copier}, "%T", v)
	}
	_, ok := capability[ProcessStarter](&pooledVM{VM: struct{ VM }{}})
	assert.False(t, ok, "a VM without the capability, pooled, has none")
}
