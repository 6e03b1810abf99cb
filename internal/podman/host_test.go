package podman

import (
	"testing"

	"github.com/podvm/podvm/internal/driver"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEnforce(t *testing.T) {
	t.Parallel()
	v1 := Host{Rootless: true, CgroupVersion: "v1"}
	delegated := Host{Rootless: true, CgroupVersion: "v2", Controllers: []string{"cpu", "memory", "pids"}}
	rootful := Host{CgroupVersion: "v1"} // rootful Podman enforces, whatever it lists
	limited := driver.Spec{Pids: 64, Memory: 64 << 20, CPUs: 0.5}

	for name, h := range map[string]Host{"rootful": rootful, "rootless, delegated": delegated} {
		for _, spec := range []driver.Spec{limited, {Pids: -1}} {
			s := spec
			require.NoError(t, h.Enforce(&s), name)
			assert.Equal(t, spec, s, "%s: the cgroup enforces every limit, and no limit is asked for as such", name)
		}
	}

	for _, c := range []struct {
		host  Host
		spec  driver.Spec
		limit string
	}{
		{v1, driver.Spec{Pids: 64}, "pids"},
		{v1, driver.Spec{Pids: -1, Memory: 64 << 20}, "memory"},
		{v1, driver.Spec{Pids: -1, CPUs: 1}, "CPU"},
		{Host{Rootless: true, CgroupVersion: "v2", Controllers: []string{"memory", "cpu"}}, driver.Spec{Pids: 64}, "pids"},
		{Host{Rootless: true, CgroupVersion: "v2", Controllers: []string{"pids"}}, driver.Spec{Pids: 64, Memory: 64 << 20}, "memory"},
	} {
		s := c.spec
		err := c.host.Enforce(&s)
		require.ErrorIs(t, err, driver.ErrNotSupported, c.limit)
		var le *driver.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, c.limit, le.Limit)
		assert.ErrorContains(t, err, "a "+c.limit+" limit: rootless Podman on cgroup "+c.host.CgroupVersion+" cannot enforce it")
	}

	s := driver.Spec{Pids: -1}
	require.NoError(t, v1.Enforce(&s))
	assert.Equal(t, driver.Spec{}, s, "no limit: nothing for Podman to warn about")
}
