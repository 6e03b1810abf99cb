package vmtest

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/podvm/podvm/internal/testkit"
	"github.com/podvm/podvm/vm"
)

// UnixEchoEnv names the environment variable that holds the path of a
// built testdata/unixecho (make test builds it): without it, the suite
// builds one with the go command for each case that needs it.
const UnixEchoEnv = "PODVM_UNIXECHO"

// unixEchoBinary returns the path of a static unixecho binary: the one
// UnixEchoEnv names, or one built for t.
func unixEchoBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(UnixEchoEnv); p != "" {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	path := filepath.Join(t.TempDir(), "unixecho")
	cmd := exec.Command("go", "build", "-buildvcs=false", "-o", path, "./testdata/unixecho")
	cmd.Dir = filepath.Dir(file)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux") // the sandbox's; its arch is the host's
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building testdata/unixecho (or name one in %s): %v: %s", UnixEchoEnv, err, out)
	}
	return path
}

// copyHelper copies the host's executable src into v as dst (in /tmp).
func copyHelper(ctx context.Context, t *testing.T, v vm.VM, src, dst string) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tarball := testkit.Tar(t, testkit.File(filepath.Base(dst), string(b), 0o755))
	if err := v.CopyIn(ctx, filepath.Dir(dst), bytes.NewReader(tarball)); err != nil {
		t.Fatalf("copying %s into the sandbox: %v", dst, err)
	}
}
