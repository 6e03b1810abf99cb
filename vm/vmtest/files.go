package vmtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// fileSentinels are the errors of the file calls an observation names,
// before those of [Observe].
var fileSentinels = []error{
	syscall.EISDIR, syscall.ENOTDIR, syscall.ENAMETOOLONG, syscall.ELOOP, syscall.EROFS,
	fs.ErrNotExist, fs.ErrExist, fs.ErrPermission, fs.ErrInvalid,
	vm.ErrFileTooLarge, vm.ErrUnsafeArchive, vm.ErrNotCreated, vm.ErrRemoved,
}

// observeFile records what a file call gave: got, or the sentinel err
// matches (its message when none does: the file calls' own messages are
// the same on every backend).
func observeFile(label, got string, err error) observation {
	if err == nil {
		return observation{Label: label, Result: &exec.Result{Stdout: got}}
	}
	for _, s := range fileSentinels {
		if errors.Is(err, s) {
			return observation{Label: label, Err: s.Error()}
		}
	}
	return observe(label, nil, err)
}

// wantErr fails t unless err matches target.
func wantErr(t *testing.T, what string, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Errorf("%s: got error %v; want one matching %v", what, err, target)
	}
}

// listDir describes ReadDir's entries as "name mode size link" lines; a
// directory's size is the filesystem's and left out.
func listDir(list []vm.FileInfo) string {
	var b strings.Builder
	for _, fi := range list {
		size := fi.Size
		if fi.Mode.IsDir() {
			size = 0
		}
		fmt.Fprintf(&b, "%s %v %d %s\n", fi.Name, fi.Mode, size, fi.Link)
	}
	return b.String()
}

// fileCases are the conformance cases of the file calls ([vm.WriteFile],
// [vm.ReadFile], [vm.ReadDir], [vm.CopyDirIn], [vm.CopyDirOut]), which
// work on every VM through its CopyIn and CopyOut, or natively for a
// [vm.FileServer].
func fileCases() []testCase {
	return []testCase{
		{Name: "files/write-read", AcrossPaths: true, Promise: "WriteFile writes the bytes with the mode, owned by the sandbox's user, replacing a file; ReadFile reads them back",
			Config: func(c *vm.Config) { c.User = "65534:65534" },
			Test:   filesWriteRead},
		{Name: "files/errors", AcrossPaths: true, Promise: "a missing path is fs.ErrNotExist, a file over the cap vm.ErrFileTooLarge, a directory is no file (syscall.EISDIR), a file no directory (syscall.ENOTDIR), a relative path fs.ErrInvalid",
			Test: filesErrors},
		{Name: "files/read-dir", AcrossPaths: true, Promise: "ReadDir lists names, modes, sizes and symlink targets, sorted, following a symlink to the directory",
			Test: filesReadDir},
		{Name: "files/copy-dir", AcrossPaths: true, Promise: "a host tree copied in and out again is the same: contents, modes, symlinks as symlinks, empty directories",
			Test: filesCopyDir},
		{Name: "files/copy-dir-out-unsafe", AcrossPaths: true, Promise: "CopyDirOut writes nothing outside the host directory, refusing links out and special files with vm.ErrUnsafeArchive",
			Test: filesCopyDirOutUnsafe},
		{Name: "files/lifecycle", AcrossPaths: true, Promise: "the file calls before Create are vm.ErrNotCreated, after Remove vm.ErrRemoved",
			Uncreated: true,
			Test:      filesLifecycle},
	}
}

func filesWriteRead(ctx context.Context, t *testing.T, v vm.VM) []observation {
	blob := make([]byte, 3<<20)
	_, _ = rand.Read(blob)
	if err := vm.WriteFile(ctx, v, "/tmp/secret", []byte("first"), 0o600); err != nil {
		skipIfNotSupported(t, err)
		t.Fatalf("WriteFile: %v", err)
	}
	if err := vm.WriteFile(ctx, v, "/tmp/secret", []byte("replaced"), 0o640); err != nil {
		t.Fatalf("WriteFile over a file: %v", err)
	}
	if err := vm.WriteFileFrom(ctx, v, "/tmp/blob", bytes.NewReader(blob), -1, 0o755); err != nil {
		t.Fatalf("WriteFileFrom of unknown size: %v", err)
	}
	res, err, o := run(ctx, v, "stat", sh(`stat -c '%n %a %u:%g %s' /tmp/secret /tmp/blob && cat /tmp/secret`))
	want(t, res, err, fmt.Sprintf("/tmp/secret 640 65534:65534 8\n/tmp/blob 755 65534:65534 %d\nreplaced", len(blob)), "", 0)

	got, err := vm.ReadFile(ctx, v, "/tmp/blob", int64(len(blob)))
	if err != nil || !bytes.Equal(got, blob) {
		t.Errorf("ReadFile: %d bytes, %v; want the %d written", len(got), err, len(blob))
	}
	secret, err := vm.ReadFile(ctx, v, "/tmp/secret", 100)
	if string(secret) != "replaced" || err != nil {
		t.Errorf("ReadFile: %q, %v; want %q", secret, err, "replaced")
	}
	return []observation{o, observeFile("read", string(secret), err)}
}

func filesErrors(ctx context.Context, t *testing.T, v vm.VM) []observation {
	res, err := v.Run(ctx, sh(`mkdir /tmp/dir && echo 0123456789 > /tmp/ten`))
	want(t, res, err, "", "", 0)
	var obs []observation
	for _, c := range []struct {
		label  string
		call   func() error
		target error
	}{
		{"read missing", func() error { _, err := vm.ReadFile(ctx, v, "/tmp/missing", 10); return err }, fs.ErrNotExist},
		{"read in missing dir", func() error { _, err := vm.ReadFile(ctx, v, "/no/such/file", 10); return err }, fs.ErrNotExist},
		{"read dir missing", func() error { _, err := vm.ReadDir(ctx, v, "/no/such"); return err }, fs.ErrNotExist},
		{"write in missing dir", func() error { return vm.WriteFile(ctx, v, "/no/such/file", []byte("x"), 0o644) }, fs.ErrNotExist},
		{"copy out missing", func() error { return vm.CopyDirOut(ctx, v, "/no/such", filepath.Join(t.TempDir(), "out")) }, fs.ErrNotExist},
		{"copy in missing parent", func() error { return vm.CopyDirIn(ctx, v, t.TempDir(), "/no/such") }, fs.ErrNotExist},
		{"over the cap", func() error { _, err := vm.ReadFile(ctx, v, "/tmp/ten", 10); return err }, vm.ErrFileTooLarge},
		{"relative", func() error { _, err := vm.ReadFile(ctx, v, "tmp/ten", 10); return err }, fs.ErrInvalid},
		{"read a directory", func() error { _, err := vm.ReadFile(ctx, v, "/tmp/dir", 10); return err }, syscall.EISDIR},
		{"read dir of a file", func() error { _, err := vm.ReadDir(ctx, v, "/tmp/ten"); return err }, syscall.ENOTDIR},
	} {
		err := c.call()
		switch {
		case err == nil:
			t.Errorf("%s: no error", c.label)
		case c.target != nil:
			wantErr(t, c.label, err, c.target)
		}
		obs = append(obs, observeFile(c.label, "", err))
	}
	if _, err := vm.ReadFile(ctx, v, "/tmp/ten", 10); err == nil || !strings.Contains(err.Error(), "11 bytes, over the cap of 10") {
		t.Errorf("over the cap: %v; want the size and the cap named", err)
	}
	return obs
}

func filesReadDir(ctx context.Context, t *testing.T, v vm.VM) []observation {
	res, err := v.Run(ctx, sh(`mkdir -p /tmp/d/sub/deeper && cd /tmp/d && printf abc > a && chmod 640 a && printf 0123456789 > sub/ten &&
		ln -s a link && ln -s ../x up && mkfifo fifo && chmod 4755 a && touch empty && ln -s d /tmp/dlink`))
	want(t, res, err, "", "", 0)
	const listing = "a urwxr-xr-x 3 \nempty -rw-r--r-- 0 \nfifo prw-r--r-- 0 \nlink Lrwxrwxrwx 0 a\nsub drwxr-xr-x 0 \nup Lrwxrwxrwx 0 ../x\n"
	var obs []observation
	for _, dir := range []string{"/tmp/d", "/tmp/dlink"} {
		list, err := vm.ReadDir(ctx, v, dir)
		if err != nil {
			t.Fatalf("ReadDir %s: %v", dir, err)
		}
		if got := listDir(list); got != listing {
			t.Errorf("ReadDir %s:\n%s\nwant:\n%s", dir, got, listing)
		}
		obs = append(obs, observeFile(dir, listDir(list), nil))
	}
	got, err := vm.ReadFile(ctx, v, "/tmp/d/link", 10)
	if string(got) != "abc" || err != nil {
		t.Errorf("ReadFile through a symlink: %q, %v", got, err)
	}
	return append(obs, observeFile("read link", string(got), err))
}

// makeTree makes a host tree of every kind CopyDirIn carries.
func makeTree(t *testing.T, dir string, blob []byte) {
	t.Helper()
	files := []struct {
		name string
		mode fs.FileMode
		data []byte
	}{{"run.sh", 0o755, []byte("#!/bin/sh\necho hi\n")}, {"secret", 0o600, []byte("s")}, {"sub/blob", 0o644, blob}, {"sub/empty", 0o444, nil}}
	for _, d := range []string{"sub/empty-dir", "sub/deep/er"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		if err := os.WriteFile(p, f.data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("../run.sh", filepath.Join(dir, "sub", "link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Join(dir, "sub"), 0o750); err != nil {
		t.Fatal(err)
	}
}

// describeTree lists a host tree, one "path mode size link" line each,
// with a digest of the contents.
func describeTree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		var extra string
		switch {
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			extra = fmt.Sprintf("%d %x", len(data), data[:min(len(data), 8)])
		case fi.Mode()&fs.ModeSymlink != 0:
			extra, _ = os.Readlink(p)
		}
		fmt.Fprintf(&b, "%s %v %s\n", rel, fi.Mode(), extra)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func filesCopyDir(ctx context.Context, t *testing.T, v vm.VM) []observation {
	blob := make([]byte, 1<<20)
	_, _ = rand.Read(blob)
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "out")
	makeTree(t, src, blob)
	if err := vm.CopyDirIn(ctx, v, src, "/tmp/tree"); err != nil {
		skipIfNotSupported(t, err)
		t.Fatalf("CopyDirIn: %v", err)
	}
	res, err, o := run(ctx, v, "find", sh(`cd /tmp/tree && find . ! -type d | sort | while read -r f; do stat -c '%n %a %s' "$f"; done; readlink sub/link`))
	want(t, res, err, fmt.Sprintf("./run.sh 755 18\n./secret 600 1\n./sub/blob 644 %d\n./sub/empty 444 0\n./sub/link 777 9\n../run.sh\n", len(blob)), "", 0)
	if err := vm.CopyDirOut(ctx, v, "/tmp/tree", dst); err != nil {
		t.Fatalf("CopyDirOut: %v", err)
	}
	in, out := describeTree(t, src), describeTree(t, dst)
	if in != out {
		t.Errorf("the tree came back different:\n%s\nwant:\n%s", out, in)
	}
	// A file that exists on the host is never replaced.
	err = vm.CopyDirOut(ctx, v, "/tmp/tree", dst)
	wantErr(t, "CopyDirOut over the same tree", err, fs.ErrExist)
	return []observation{o, observeFile("again", "", err)}
}

func filesCopyDirOutUnsafe(ctx context.Context, t *testing.T, v vm.VM) []observation {
	res, err := v.Run(ctx, sh(`mkdir -p /tmp/abs /tmp/up/a /tmp/fifo && ln -s /etc /tmp/abs/etc && ln -s ../../.. /tmp/up/a/top && mkfifo /tmp/fifo/p`))
	want(t, res, err, "", "", 0)
	var obs []observation
	for _, dir := range []string{"/tmp/abs", "/tmp/up", "/tmp/fifo"} {
		parent := t.TempDir()
		err := vm.CopyDirOut(ctx, v, dir, filepath.Join(parent, "out"))
		wantErr(t, "CopyDirOut "+dir, err, vm.ErrUnsafeArchive)
		entries, _ := os.ReadDir(parent)
		for _, e := range entries {
			if e.Name() != "out" {
				t.Errorf("CopyDirOut %s wrote %s outside its destination", dir, e.Name())
			}
		}
		obs = append(obs, observeFile(dir, "", err))
	}
	return obs
}

func filesLifecycle(ctx context.Context, t *testing.T, v vm.VM) []observation {
	var obs []observation
	calls := func(label string, target error) {
		_, err := vm.ReadFile(ctx, v, "/etc/hostname", 100)
		wantErr(t, label+" ReadFile", err, target)
		obs = append(obs, observeFile(label+" read", "", err))
		err = vm.WriteFile(ctx, v, "/tmp/x", []byte("x"), 0o644)
		wantErr(t, label+" WriteFile", err, target)
		obs = append(obs, observeFile(label+" write", "", err))
		err = vm.CopyDirIn(ctx, v, t.TempDir(), "/tmp/x")
		wantErr(t, label+" CopyDirIn", err, target)
		obs = append(obs, observeFile(label+" copy in", "", err))
	}
	calls("before Create", vm.ErrNotCreated)
	if err := v.Create(ctx); err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := v.Remove(ctx); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	calls("after Remove", vm.ErrRemoved)
	if slices.ContainsFunc(obs, func(o observation) bool { return o.Err == "" }) {
		t.Error("a file call succeeded on a sandbox that does not exist")
	}
	return obs
}
