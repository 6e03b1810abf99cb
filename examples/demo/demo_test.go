package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
)

// A GOROOT laid out as Debian's golang packages do it: links, two levels
// deep at most, into a tree beside it. Links that stay inside need nothing.
func TestToolchainMounts(t *testing.T) {
	dir := t.TempDir()
	goroot := filepath.Join(dir, "lib", "go-1.19")
	share := filepath.Join(dir, "share", "go-1.19")
	for _, d := range []string{goroot + "/bin", goroot + "/pkg/tool/linux_amd64", share + "/src", share + "/pkg/include"} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	for link, to := range map[string]string{
		"src":                    "../../share/go-1.19/src",
		"pkg/include":            "../../../share/go-1.19/pkg/include",
		"gobin":                  "bin",
		"pkg/tool/linux_amd64/x": "/elsewhere", // three levels deep: not looked at
	} {
		require.NoError(t, os.Symlink(to, filepath.Join(goroot, link)))
	}

	got, err := toolchainMounts(goroot)
	require.NoError(t, err)
	require.ElementsMatch(t, []vm.Mount{
		{Source: goroot, Target: goroot, ReadOnly: true},
		{Source: share + "/src", Target: share + "/src", ReadOnly: true},
		{Source: share + "/pkg/include", Target: share + "/pkg/include", ReadOnly: true},
	}, got)
}

// TestDemo runs the demo against the real service, so that it cannot rot:
// every step must behave on both backends, and the second build of each
// must come entirely from the build cache the first one filled.
func TestDemo(t *testing.T) {
	env := podmantest.Need(t)
	ctx := t.Context()
	// The cache is the one `make demo` uses: warming it costs a minute,
	// once per Go version, so the test shares it.
	d, err := newDemo(ctx, env.Image, env.Host, "../../testdata/seeds/hello", "../../.podvm/demo-gocache")
	require.NoError(t, err)
	var out bytes.Buffer
	require.NoError(t, d.warm(ctx, &out), out.String())

	out.Reset()
	err = d.show(ctx, &out)
	t.Log("\n" + out.String())
	require.NoError(t, err)
	require.Equal(t, 2, strings.Count(out.String(), "everything from the cache"), "a build missed the warm cache")
	require.Equal(t, freshOnes, strings.Count(out.String(), "everything from the snapshot"), "a sandbox from the snapshot missed its caches")
	// The fork part: every copy answered, or the service cannot
	// checkpoint and the demo said why.
	if !strings.Contains(out.String(), "  skipped: vm: not supported") {
		require.Equal(t, copies, strings.Count(out.String(), ": answer 2 to copy "), "a copy did not answer from the warm state")
	}
}
