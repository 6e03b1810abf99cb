package podman

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestEnforce(t *testing.T) {
	t.Parallel()
	v1 := Host{Rootless: true, CgroupVersion: "v1"}
	delegated := Host{Rootless: true, CgroupVersion: "v2", Controllers: []string{"cpu", "memory", "pids"}}
	rootful := Host{CgroupVersion: "v1"} // rootful Podman enforces, whatever it lists
	limited := Spec{Pids: 64, Memory: 64 << 20, CPUs: 0.5}

	for name, h := range map[string]Host{"rootful": rootful, "rootless, delegated": delegated} {
		for _, spec := range []Spec{limited, {Pids: -1}} {
			s := spec
			require.NoError(t, h.Enforce(&s), name)
			assert.Equal(t, spec, s, "%s: the cgroup enforces every limit, and no limit is asked for as such", name)
		}
	}

	for _, c := range []struct {
		host  Host
		spec  Spec
		limit string
	}{
		{v1, Spec{Pids: 64}, "pids"},
		{v1, Spec{Pids: -1, Memory: 64 << 20}, "memory"},
		{v1, Spec{Pids: -1, CPUs: 1}, "CPU"},
		{Host{Rootless: true, CgroupVersion: "v2", Controllers: []string{"memory", "cpu"}}, Spec{Pids: 64}, "pids"},
		{Host{Rootless: true, CgroupVersion: "v2", Controllers: []string{"pids"}}, Spec{Pids: 64, Memory: 64 << 20}, "memory"},
	} {
		s := c.spec
		err := c.host.Enforce(&s)
		require.ErrorIs(t, err, ErrNotSupported, c.limit)
		var le *LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, c.limit, le.Limit)
		assert.ErrorContains(t, err, "a "+c.limit+" limit: rootless Podman on cgroup "+c.host.CgroupVersion+" cannot enforce it")
	}

	s := Spec{Pids: -1}
	require.NoError(t, v1.Enforce(&s))
	assert.Equal(t, Spec{}, s, "no limit: nothing for Podman to warn about")
}
