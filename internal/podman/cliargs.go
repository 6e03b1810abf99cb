package podman

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/podvm/podvm/internal/driver"
)

// This file is how a driver.Spec and a driver.Process become podman's argv.

// CreateArgs is the argv of `podman run -d` for spec (as [asked] returns
// it: a zero Pids is no --pids-limit) or, with an agent as PID 1, of
// `podman create`. It is exported for package vm's fuzz test of
// what its config validation promises.
func CreateArgs(c driver.Spec) []string {
	a := []string{"run", "-d"}
	if c.Agent != "" {
		a = []string{"create", "-i", "--log-driver", "none"}
	}
	a = append(a, "--pull", "never") // the caller made the image present
	a = appendFlag(a, "--name", c.Name)
	for _, k := range slices.Sorted(maps.Keys(c.Labels)) {
		a = append(a, "--label", k+"="+c.Labels[k])
	}
	a = append(a,
		"--network", c.Network,
		"--security-opt", "no-new-privileges",
		"--cap-drop", "all",
		"--cap-add", strings.Join(c.Capabilities, ","),
	)
	if c.Pids != 0 {
		a = append(a, "--pids-limit", strconv.FormatInt(c.Pids, 10))
	}
	// Podman passes the host's proxy variables by default.
	a = append(a, "--http-proxy=false")
	if c.Memory > 0 {
		m := strconv.FormatInt(c.Memory, 10)
		a = append(a, "--memory", m, "--memory-swap", m) // swap included
	}
	if c.CPUs > 0 {
		a = append(a, "--cpus", strconv.FormatFloat(c.CPUs, 'f', -1, 64))
	}
	if c.ReadOnlyRootfs {
		a = append(a, "--read-only", "--read-only-tmpfs")
	}
	for _, m := range c.Mounts {
		spec := m.Source + ":" + m.Target
		if m.ReadOnly {
			spec += ":ro"
		}
		a = append(a, "-v", spec)
	}
	a = appendFlag(appendFlag(a, "--workdir", c.Workdir), "--user", c.User)
	for _, e := range c.Env {
		a = append(a, "--env", e)
	}
	if c.Agent != "" {
		entry, _ := json.Marshal(append([]string{c.Agent}, c.AgentArgs...))
		return append(a, "--entrypoint", string(entry), c.Image)
	}
	init, _ := json.Marshal(initEntrypoint)
	return append(a, "--init", "--entrypoint", string(init), c.Image)
}

// execArgs is the argv of `podman exec` for p in container id.
func execArgs(id string, p driver.Process) []string {
	a := []string{"exec"}
	if p.Stdin != nil {
		a = append(a, "-i")
	}
	for _, e := range p.Env {
		a = append(a, "--env", e)
	}
	a = appendFlag(appendFlag(a, "--workdir", p.Workdir), "--user", p.User)
	return append(append(a, id), p.Argv...)
}

// appendFlag appends flag and v to a unless v is empty.
func appendFlag(a []string, flag, v string) []string {
	if v == "" {
		return a
	}
	return append(a, flag, v)
}
