package vmtest

import (
	"bytes"
	"context"
	"io"
	"io/fs"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/podvm/podvm/internal/testkit"
	"github.com/podvm/podvm/vm"
)

// failureCases are the documented failures of the file calls, one table
// each, every row run on every backend and observed as the sentinel its
// error matches, so that [RunParity] compares them across backends and
// across the ways a call travels (podvm's agent, Podman's copies).
func failureCases() []testCase {
	return []testCase{
		{Name: "files/failures", Promise: "each failure of a file call matches its documented sentinel (fs.ErrNotExist, syscall.EISDIR, syscall.ENOTDIR, fs.ErrInvalid, syscall.ENAMETOOLONG, syscall.ELOOP, vm.ErrFileTooLarge), the same on every path; ReadDir lists an absolute symlink",
			AcrossPaths: true, Test: filesFailures},
		{Name: "files/read-only", Promise: "a write to a read-only root filesystem fails with syscall.EROFS, on every path",
			AcrossPaths: true, Config: func(c *vm.Config) { c.ReadOnlyRootfs = true }, Test: filesReadOnly},
	}
}

// failure is one row of a failure table: a call and the sentinel its
// error must match.
type failure struct {
	label  string
	call   func() error
	target error
}

// runFailures runs each row, requires its error to match its target, and
// observes it.
func runFailures(t *testing.T, rows []failure) []observation {
	t.Helper()
	var obs []observation
	for _, r := range rows {
		err := r.call()
		if err == nil {
			t.Errorf("%s: no error; want one matching %v", r.label, r.target)
		} else {
			wantErr(t, r.label, err, r.target)
		}
		obs = append(obs, observeFile(r.label, "", err))
	}
	return obs
}

// readErr and dirErr keep the error of ReadFile and ReadDir.
func readErr(ctx context.Context, v vm.VM, name string) func() error {
	return func() error { _, err := vm.ReadFile(ctx, v, name, 100); return err }
}

func dirErr(ctx context.Context, v vm.VM, name string) func() error {
	return func() error { _, err := vm.ReadDir(ctx, v, name); return err }
}

func writeErr(ctx context.Context, v vm.VM, name string) func() error {
	return func() error { return vm.WriteFile(ctx, v, name, []byte("x"), 0o644) }
}

func filesFailures(ctx context.Context, t *testing.T, v vm.VM) []observation {
	res, err := v.Run(ctx, sh(`mkdir /tmp/dir /tmp/abs && echo 0123456789 > /tmp/ten && mkfifo /tmp/fifo &&
		ln -s loop /tmp/loop && ln -s /etc/passwd /tmp/abs/passwd`))
	want(t, res, err, "", "", 0)
	long := "/tmp/" + strings.Repeat("n", 256)
	deep := "/tmp" + strings.Repeat("/"+strings.Repeat("d", 200), 21) // over PATH_MAX
	tree := t.TempDir()
	tarIn := func(dir string) func() error {
		return func() error {
			return v.CopyIn(ctx, dir, bytes.NewReader(testkit.Tar(t, testkit.File("f", "x", 0o644))))
		}
	}
	obs := runFailures(t, []failure{
		{"write missing dir", writeErr(ctx, v, "/no/such/file"), fs.ErrNotExist},
		{"write onto a directory", writeErr(ctx, v, "/tmp/dir"), syscall.EISDIR},
		{"write under a file", writeErr(ctx, v, "/tmp/ten/x"), syscall.ENOTDIR},
		{"write long name", writeErr(ctx, v, long), syscall.ENAMETOOLONG},
		{"write long path", writeErr(ctx, v, deep), syscall.ENAMETOOLONG},
		{"write from onto a directory", func() error {
			return vm.WriteFileFrom(ctx, v, "/tmp/dir", strings.NewReader("x"), -1, 0o644)
		}, syscall.EISDIR},
		{"read missing", readErr(ctx, v, "/tmp/missing"), fs.ErrNotExist},
		{"read a directory", readErr(ctx, v, "/tmp/dir"), syscall.EISDIR},
		{"read /dev/null", readErr(ctx, v, "/dev/null"), fs.ErrInvalid},
		{"read a fifo", readErr(ctx, v, "/tmp/fifo"), fs.ErrInvalid},
		{"read under a file", readErr(ctx, v, "/tmp/ten/x"), syscall.ENOTDIR},
		{"read long name", readErr(ctx, v, long), syscall.ENAMETOOLONG},
		{"read long path", readErr(ctx, v, deep), syscall.ENAMETOOLONG},
		{"read a symlink loop", readErr(ctx, v, "/tmp/loop"), syscall.ELOOP},
		{"read over the cap", func() error { _, err := vm.ReadFile(ctx, v, "/tmp/ten", 10); return err }, vm.ErrFileTooLarge},
		{"read dir missing", dirErr(ctx, v, "/no/such"), fs.ErrNotExist},
		{"read dir of a file", dirErr(ctx, v, "/tmp/ten"), syscall.ENOTDIR},
		{"read dir long name", dirErr(ctx, v, long), syscall.ENAMETOOLONG},
		{"read dir of a symlink loop", dirErr(ctx, v, "/tmp/loop"), syscall.ELOOP},
		{"copy dir out of a file", func() error { return vm.CopyDirOut(ctx, v, "/tmp/ten", filepath.Join(t.TempDir(), "out")) }, syscall.ENOTDIR},
		{"copy dir out long name", func() error { return vm.CopyDirOut(ctx, v, long, filepath.Join(t.TempDir(), "out")) }, syscall.ENAMETOOLONG},
		{"copy dir in onto a file", func() error { return vm.CopyDirIn(ctx, v, tree, "/tmp/ten") }, syscall.ENOTDIR},
		{"copy dir in under a file", func() error { return vm.CopyDirIn(ctx, v, tree, "/tmp/ten/sub") }, syscall.ENOTDIR},
		{"copy dir in missing parent", func() error { return vm.CopyDirIn(ctx, v, tree, "/no/such") }, fs.ErrNotExist},
		{"copy dir in long name", func() error { return vm.CopyDirIn(ctx, v, tree, long) }, syscall.ENAMETOOLONG},
		{"copy in missing", tarIn("/no/such"), fs.ErrNotExist},
		{"copy in onto a file", tarIn("/tmp/ten"), syscall.ENOTDIR},
		{"copy in long name", tarIn(long), syscall.ENAMETOOLONG},
		{"copy out missing", func() error { return v.CopyOut(ctx, "/no/such", io.Discard) }, fs.ErrNotExist},
		{"copy out long name", func() error { return v.CopyOut(ctx, long, io.Discard) }, syscall.ENAMETOOLONG},
	})
	// A listing of names and link targets writes nothing: an absolute
	// symlink in it is no unsafe entry.
	list, err := vm.ReadDir(ctx, v, "/tmp/abs")
	if got, want := listDir(list), "passwd Lrwxrwxrwx 0 /etc/passwd\n"; err != nil || got != want {
		t.Errorf("ReadDir of a directory holding an absolute symlink: %q, %v; want %q", got, err, want)
	}
	return append(obs, observeFile("read dir with an absolute symlink", listDir(list), err))
}

func filesReadOnly(ctx context.Context, t *testing.T, v vm.VM) []observation {
	obs := runFailures(t, []failure{
		{"write", writeErr(ctx, v, "/etc/x"), syscall.EROFS},
		{"copy dir in", func() error { return vm.CopyDirIn(ctx, v, t.TempDir(), "/etc/sub") }, syscall.EROFS},
		{"copy in", func() error {
			return v.CopyIn(ctx, "/etc", bytes.NewReader(testkit.Tar(t, testkit.File("x", "x", 0o644))))
		}, syscall.EROFS},
	})
	// The sandbox's /tmp stays writable.
	err := vm.WriteFile(ctx, v, "/tmp/x", []byte("x"), 0o644)
	if err != nil {
		t.Errorf("WriteFile in /tmp of a read-only root: %v", err)
	}
	return append(obs, observeFile("write /tmp", "", err))
}
