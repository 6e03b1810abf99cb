package libpod_test

import (
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// moduleRoot is the directory of the module's go.mod.
func moduleRoot(t *testing.T) string {
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, dir, parent, "no go.mod above the test")
		dir = parent
	}
}

// goTool runs the go command in the module's root with extra environment.
func goTool(t *testing.T, env []string, args ...string) string {
	t.Helper()
	cmd := osexec.Command("go", args...)
	cmd.Dir = moduleRoot(t)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

// Podman's bindings are imported for the connection only: the module
// builds with no build tags, with or without cgo, and none of the heavy
// dependencies of the bindings' other packages (gpgme, the btrfs graph
// driver) is linked into programs that import podvm.
func TestNoHeavyDependencies(t *testing.T) {
	if _, err := osexec.LookPath("go"); err != nil {
		t.Skip("the go command is not in PATH")
	}
	t.Parallel()
	deps := goTool(t, nil, "list", "-deps", "./...")
	require.Contains(t, deps, "github.com/containers/podman/v5/pkg/bindings\n", "the check must see the bindings")
	for _, pkg := range strings.Fields(deps) {
		for _, heavy := range []string{"gpgme", "btrfs", "pkg/specgen", "pkg/bindings/containers"} {
			if strings.Contains(pkg, heavy) {
				t.Errorf("%s is a dependency of the module (%s)", pkg, heavy)
			}
		}
	}
	goTool(t, []string{"CGO_ENABLED=0"}, "build", "./...")
}
