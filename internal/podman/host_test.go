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
		for _, spec := range []driver.Spec{limited, {}, {Pids: -1}} {
			require.NoError(t, h.Enforce(spec), name)
		}
	}

	for _, c := range []struct {
		host  Host
		spec  driver.Spec
		limit string
	}{
		{v1, driver.Spec{Pids: 64}, "pids"},
		{v1, driver.Spec{}, "pids"}, // the default is a limit too
		{v1, driver.Spec{Pids: -1, Memory: 64 << 20}, "memory"},
		{v1, driver.Spec{Pids: -1, CPUs: 1}, "CPU"},
		{Host{Rootless: true, CgroupVersion: "v2", Controllers: []string{"memory", "cpu"}}, driver.Spec{Pids: 64}, "pids"},
		{Host{Rootless: true, CgroupVersion: "v2", Controllers: []string{"pids"}}, driver.Spec{Pids: 64, Memory: 64 << 20}, "memory"},
	} {
		err := c.host.Enforce(c.spec)
		require.ErrorIs(t, err, driver.ErrNotSupported, c.limit)
		var le *driver.LimitError
		require.ErrorAs(t, err, &le)
		assert.Equal(t, c.limit, le.Limit)
		assert.ErrorContains(t, err, "a "+c.limit+" limit: rootless Podman on cgroup "+c.host.CgroupVersion+" cannot enforce it")
	}

	require.NoError(t, v1.Enforce(driver.Spec{Pids: -1}), "no limit is honoured anywhere")
}

// TestAsked shows the pids limit a create asks Podman for: the default
// for zero, and no flag at all for none where the service is known to
// enforce none.
func TestAsked(t *testing.T) {
	const v1, rootful, unknown = "test:asked-v1", "test:asked-rootful", "test:asked-unknown"
	hosts.Store(v1, Host{Rootless: true, CgroupVersion: "v1"})
	hosts.Store(rootful, Host{CgroupVersion: "v1"})
	t.Cleanup(func() { hosts.Delete(v1); hosts.Delete(rootful) })

	for _, c := range []struct {
		service   string
		pids, was int64
	}{
		{rootful, 0, driver.DefaultPids},
		{rootful, 64, 64},
		{rootful, -1, -1},
		{unknown, -1, -1},
		{v1, -1, 0}, // nothing for Podman to warn about
		{v1, 0, driver.DefaultPids},
	} {
		got := asked(c.service, driver.Spec{Image: "i", Pids: c.pids})
		assert.Equal(t, driver.Spec{Image: "i", Pids: c.was}, got, "%s, pids %d", c.service, c.pids)
	}
}
