package vm_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/mock/gomock"

	"github.com/podvm/podvm/internal/testkit"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/vmmock"
)

// tarVM is a sandbox made of tar streams: CopyOut of a path serves the
// archive stored under it, CopyIn stores the archive it is given under
// the path of its first entry. It fails as the socket backend does for a
// path it does not have.
type tarVM struct {
	vm.VM // nil: only the copies are used
	mu    sync.Mutex
	tars  map[string][]byte
	// endless paths send zeros after their archive until the reader stops.
	endless map[string]bool
	ended   int // CopyOut calls that returned
}

func newTarVM() *tarVM { return &tarVM{tars: map[string][]byte{}, endless: map[string]bool{}} }

func (f *tarVM) CopyOut(ctx context.Context, p string, w io.Writer) error {
	defer func() { f.mu.Lock(); f.ended++; f.mu.Unlock() }()
	f.mu.Lock()
	data, ok := f.tars[p]
	endless := f.endless[p]
	f.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: copy out %s: libpod: archive get: 404 no such file or directory", vm.ErrPodman, p)
	}
	if _, err := w.Write(data); err != nil {
		return err
	}
	for endless {
		if _, err := w.Write(make([]byte, 64<<10)); err != nil {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

func (f *tarVM) CopyIn(_ context.Context, dir string, r io.Reader) error {
	data, err := io.ReadAll(r)
	if err != nil {
		return fmt.Errorf("vm: copy into %s: %w", dir, err)
	}
	h, err := tar.NewReader(bytes.NewReader(data)).Next()
	if err != nil {
		return fmt.Errorf("tarVM: %w", err)
	}
	root, _, _ := strings.Cut(path.Clean(h.Name), "/")
	if root == "." {
		// A tree extracted in dir itself: kept as CopyOut of dir names it.
		root, data = path.Base(dir), renamed(data, path.Base(dir))
		dir = path.Dir(dir)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tars[path.Join(dir, root)] = data
	return nil
}

// renamed is the archive data, its entries named beneath root instead
// of ".".
func renamed(data []byte, root string) []byte {
	var out bytes.Buffer
	tr, tw := tar.NewReader(bytes.NewReader(data)), tar.NewWriter(&out)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		h.Name = path.Join(root, h.Name)
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		_ = tw.WriteHeader(h)
		_, _ = io.Copy(tw, tr)
	}
	_ = tw.Close()
	return out.Bytes()
}

// readTar lists an archive as "name type mode size link|content" lines.
func readTar(t *testing.T, data []byte) []string {
	t.Helper()
	entries, err := testkit.Untar(data)
	require.NoError(t, err)
	return testkit.Lines(entries)
}

func TestWriteFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newTarVM()
	require.NoError(t, vm.WriteFile(ctx, f, "/work/./run.sh", []byte("#!/bin/sh\n"), 0o755|fs.ModeSetuid))
	assert.Equal(t, []string{"run.sh 0 4755 10 #!/bin/sh\n"}, readTar(t, f.tars["/work/run.sh"]))

	require.NoError(t, vm.WriteFileFrom(ctx, f, "/work/sized", strings.NewReader("abc"), 3, 0o600))
	assert.Equal(t, []string{"sized 0 600 3 abc"}, readTar(t, f.tars["/work/sized"]))
	require.NoError(t, vm.WriteFileFrom(ctx, f, "/work/unsized", strings.NewReader("spooled"), -1, 0o640))
	assert.Equal(t, []string{"unsized 0 640 7 spooled"}, readTar(t, f.tars["/work/unsized"]))

	got, err := vm.ReadFile(ctx, f, "/work/run.sh", 100)
	require.NoError(t, err)
	assert.Equal(t, "#!/bin/sh\n", string(got), "what WriteFile wrote, ReadFile reads")
}

func TestWriteFileRefuses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		path string
		r    io.Reader
		size int64
		perm fs.FileMode
		want error
	}{
		{"relative path", "work/x", strings.NewReader(""), 0, 0o644, fs.ErrInvalid},
		{"the root", "/", strings.NewReader(""), 0, 0o644, fs.ErrInvalid},
		{"NUL in the path", "/a\x00b", strings.NewReader(""), 0, 0o644, fs.ErrInvalid},
		{"a file type in perm", "/x", strings.NewReader(""), 0, fs.ModeDir | 0o755, fs.ErrInvalid},
		{"a size below -1", "/x", strings.NewReader(""), -2, 0o644, fs.ErrInvalid},
		{"a short reader", "/x", strings.NewReader("ab"), 3, 0o644, nil},
		{"a long reader", "/x", strings.NewReader("abcd"), 3, 0o644, nil},
		{"missing directory", "/no/such/x", strings.NewReader("a"), 1, 0o644, fs.ErrNotExist},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctrl := gomock.NewController(t)
			m := vmmock.NewMockVM(ctrl)
			switch {
			case c.want == fs.ErrNotExist:
				m.EXPECT().CopyIn(gomock.Any(), "/no/such", gomock.Any()).DoAndReturn(func(_ context.Context, dir string, r io.Reader) error {
					_, _ = io.Copy(io.Discard, r)
					return fmt.Errorf("%w: %s: podman cp exited 125: destination must be a directory when copying from stdin", vm.ErrPodman, dir)
				})
			case c.want == nil: // read to the end: the content is checked as it streams
				m.EXPECT().CopyIn(gomock.Any(), "/", gomock.Any()).DoAndReturn(func(_ context.Context, dir string, r io.Reader) error {
					_, err := io.Copy(io.Discard, r)
					return err
				})
			}
			err := vm.WriteFileFrom(context.Background(), m, c.path, c.r, c.size, c.perm)
			require.Error(t, err)
			assert.True(t, strings.HasPrefix(err.Error(), "vm: "), err.Error())
			if c.want != nil {
				assert.ErrorIs(t, err, c.want)
			} else {
				assert.ErrorContains(t, err, "3 bytes")
			}
		})
	}
}

func TestReadFile(t *testing.T) {
	t.Parallel()
	f := newTarVM()
	f.tars["/etc/hosts"] = testkit.Tar(t, testkit.File("hosts", "127.0.0.1 localhost\n", 0o644))
	f.tars["/etc/empty"] = testkit.Tar(t, testkit.File("empty", "", 0o644))
	f.tars["/etc/link"] = testkit.Tar(t, testkit.Symlink("link", "hosts")) // a symlink sent as one
	f.tars["/etc/abs"] = testkit.Tar(t, testkit.Symlink("abs", "/etc/link"))
	f.tars["/loop"] = testkit.Tar(t, testkit.Symlink("loop", "loop"))
	f.tars["/etc/cli"] = testkit.Tar(t, testkit.File("hosts", "named by its target", 0o644)) // `podman cp` follows and renames
	f.tars["/etc/big"] = testkit.Tar(t, testkit.File("big", strings.Repeat("x", 101), 0o644))
	f.tars["/etc/dir"] = testkit.Tar(t, testkit.Dir("dir/", 0o644), testkit.File("dir/x", "x", 0o644))
	f.tars["/etc/fifo"] = testkit.Tar(t, testkit.Entry{Header: tar.Header{Name: "fifo", Typeflag: tar.TypeFifo, Mode: 0o644}})
	f.tars["/etc/evil"] = testkit.Tar(t, testkit.File("../evil", "x", 0o644))
	for _, c := range []struct {
		path, want string
		err        error
		msg        string
	}{
		{"/etc/hosts", "127.0.0.1 localhost\n", nil, ""},
		{"/etc/empty", "", nil, ""},
		{"/etc/link", "127.0.0.1 localhost\n", nil, ""},
		{"/etc/abs", "127.0.0.1 localhost\n", nil, ""},
		{"/etc/cli", "named by its target", nil, ""},
		{"/etc/big", "", vm.ErrFileTooLarge, "101 bytes, over the cap of 100"},
		{"/etc/missing", "", fs.ErrNotExist, "no such file"},
		{"/etc/dir", "", nil, "is a directory"},
		{"/etc/fifo", "", nil, "not a regular file"},
		{"/loop", "", nil, "too many levels of symbolic links"},
		{"/etc/evil", "", vm.ErrUnsafeArchive, "../evil"},
		{"etc/hosts", "", fs.ErrInvalid, "absolute"},
	} {
		got, err := vm.ReadFile(context.Background(), f, c.path, 100)
		if c.msg == "" {
			require.NoError(t, err, c.path)
			assert.Equal(t, c.want, string(got), c.path)
			continue
		}
		assert.Nil(t, got, c.path)
		assert.ErrorContains(t, err, c.msg, c.path)
		if c.err != nil {
			assert.ErrorIs(t, err, c.err, c.path)
		}
	}
}

// Over the cap, ReadFile stops the copy rather than draining it.
func TestReadFileStopsTheCopy(t *testing.T) {
	t.Parallel()
	f := newTarVM()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "huge", Typeflag: tar.TypeReg, Mode: 0o644, Size: 1 << 40}))
	f.tars["/huge"], f.endless["/huge"] = b.Bytes(), true
	_, err := vm.ReadFile(context.Background(), f, "/huge", 1<<20)
	require.ErrorIs(t, err, vm.ErrFileTooLarge)
	assert.ErrorContains(t, err, "1099511627776 bytes, over the cap of 1048576")
	f.mu.Lock()
	defer f.mu.Unlock()
	assert.Equal(t, 1, f.ended, "ReadFile returned before the CopyOut it started")
}

func TestReadDir(t *testing.T) {
	t.Parallel()
	f := newTarVM()
	f.tars["/src"] = testkit.Tar(t,
		testkit.Dir("src/", 0o755),
		testkit.File("src/b.go", "package b\n", 0o644),
		testkit.File("src/a.go", "package a", 0o600),
		testkit.Dir("src/sub/", 0o700),
		testkit.File("src/sub/deep.go", "deeper, not listed", 0o644),
		testkit.Symlink("src/link", "sub/deep.go"),
		testkit.Link("src/hard", "src/a.go"),
		testkit.File("src/tool", "x", 0o4755),
	)
	f.tars["/dirlink"] = testkit.Tar(t, testkit.Symlink("dirlink", "src"))
	f.tars["/file"] = testkit.Tar(t, testkit.File("file", "x", 0o644))
	mtime := time.Unix(1700000000, 0)
	want := []vm.FileInfo{
		{Name: "a.go", Size: 9, Mode: 0o600, ModTime: mtime},
		{Name: "b.go", Size: 10, Mode: 0o644, ModTime: mtime},
		{Name: "hard", Size: 9, Mode: 0o644, ModTime: mtime},
		{Name: "link", Mode: fs.ModeSymlink | 0o644, ModTime: mtime, Link: "sub/deep.go"},
		{Name: "sub", Mode: fs.ModeDir | 0o700, ModTime: mtime},
		{Name: "tool", Size: 1, Mode: fs.ModeSetuid | 0o755, ModTime: mtime},
	}
	for _, dir := range []string{"/src", "/src/", "/dirlink"} {
		got, err := vm.ReadDir(context.Background(), f, dir)
		require.NoError(t, err, dir)
		assert.Equal(t, want, got, dir)
	}
	_, err := vm.ReadDir(context.Background(), f, "/file")
	assert.ErrorContains(t, err, "not a directory")
	_, err = vm.ReadDir(context.Background(), f, "/nope")
	assert.ErrorIs(t, err, fs.ErrNotExist)
	assert.NotErrorIs(t, err, vm.ErrPodman, "one failure, one sentinel")
	assert.ErrorContains(t, err, "404 no such file or directory", "the backend's message is kept")
	_, err = vm.ReadDir(context.Background(), f, "/")
	assert.ErrorIs(t, err, fs.ErrInvalid)
}

// The VM's own errors come through as they are.
func TestFileCallsKeepTheVMsErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, sentinel := range []error{vm.ErrNotCreated, vm.ErrRemoved, vm.ErrNoSuchContainer, context.Canceled} {
		ctrl := gomock.NewController(t)
		m := vmmock.NewMockVM(ctrl)
		m.EXPECT().CopyOut(gomock.Any(), gomock.Any(), gomock.Any()).Return(fmt.Errorf("vm: copy out: %w", sentinel)).Times(3)
		m.EXPECT().CopyIn(gomock.Any(), gomock.Any(), gomock.Any()).Return(fmt.Errorf("vm: copy into: %w", sentinel)).Times(2)
		_, rerr := vm.ReadFile(ctx, m, "/x", 10)
		_, derr := vm.ReadDir(ctx, m, "/x")
		for _, err := range []error{
			rerr, derr,
			vm.CopyDirOut(ctx, m, "/x", t.TempDir()),
			vm.WriteFile(ctx, m, "/x", nil, 0o644),
			vm.CopyDirIn(ctx, m, t.TempDir(), "/x"),
		} {
			assert.ErrorIs(t, err, sentinel)
			assert.NotErrorIs(t, err, fs.ErrNotExist)
		}
	}
}

// hostTree makes a tree under dir: a file per mode, a subdirectory, an
// empty directory and a symlink.
func hostTree(t *testing.T, dir string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "sub", "empty"), 0o755))
	for name, mode := range map[string]fs.FileMode{"run.sh": 0o755, "secret": 0o600, "sub/notes": 0o644} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte("content of "+name), mode))
		require.NoError(t, os.Chmod(filepath.Join(dir, name), mode)) // past the umask
	}
	require.NoError(t, os.Symlink("../run.sh", filepath.Join(dir, "sub", "link")))
	require.NoError(t, os.Chmod(filepath.Join(dir, "sub"), 0o750))
}

func TestCopyDirIn(t *testing.T) {
	t.Parallel()
	host := t.TempDir()
	require.NoError(t, os.Chmod(host, 0o711))
	hostTree(t, host)
	f := newTarVM()
	require.NoError(t, vm.CopyDirIn(context.Background(), f, host, "/work/src"))
	assert.Equal(t, []string{
		"src/ 5 711 0 ",
		"src/run.sh 0 755 17 content of run.sh",
		"src/secret 0 600 17 content of secret",
		"src/sub/ 5 750 0 ",
		"src/sub/empty/ 5 755 0 ",
		"src/sub/link 2 777 0 ../run.sh",
		"src/sub/notes 0 644 20 content of sub/notes",
	}, readTar(t, f.tars["/work/src"]))

	// Into "/": the entries are named from it, and "/" keeps its mode.
	require.NoError(t, vm.CopyDirIn(context.Background(), f, host, "/"))
	assert.Contains(t, readTar(t, f.tars["/run.sh"]), "sub/notes 0 644 20 content of sub/notes")
}

func TestCopyDirInRefuses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		make func(t *testing.T, dir string)
		want error
		msg  string
	}{
		{"absolute symlink", func(t *testing.T, dir string) {
			require.NoError(t, os.Symlink("/etc/passwd", filepath.Join(dir, "pw")))
		}, vm.ErrUnsafeArchive, `"pw": symlink to absolute path`},
		{"symlink out of the tree", func(t *testing.T, dir string) {
			require.NoError(t, os.Mkdir(filepath.Join(dir, "a"), 0o755))
			require.NoError(t, os.Symlink("../../x", filepath.Join(dir, "a", "up")))
		}, vm.ErrUnsafeArchive, "points outside the destination"},
		{"socket", func(t *testing.T, dir string) {
			l, err := net.Listen("unix", filepath.Join(dir, "sock"))
			if err != nil {
				t.Skipf("no unix socket here: %v", err)
			}
			t.Cleanup(func() { l.Close() })
		}, vm.ErrUnsafeArchive, "only directories, regular files and symlinks"},
		{"missing host dir", func(t *testing.T, dir string) {
			require.NoError(t, os.Remove(dir))
		}, fs.ErrNotExist, "copy dir in"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// Short: a unix socket's path has a small limit.
			dir, err := os.MkdirTemp("", "pv")
			require.NoError(t, err)
			t.Cleanup(func() { os.RemoveAll(dir) })
			c.make(t, dir)
			err = vm.CopyDirIn(context.Background(), newTarVM(), dir, "/work")
			assert.ErrorIs(t, err, c.want)
			assert.ErrorContains(t, err, c.msg)
		})
	}
}

// A tree copied in and out again is the same tree.
func TestCopyDirRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "new", "out")
	hostTree(t, src)
	f := newTarVM()
	require.NoError(t, vm.CopyDirIn(ctx, f, src, "/work/tree"))
	require.NoError(t, vm.CopyDirOut(ctx, f, "/work/tree", dst))
	assert.Equal(t, listTree(t, src), listTree(t, dst))
}

// listTree lists a host tree as "path mode size link|content mtime" lines.
func listTree(t *testing.T, dir string) []string {
	t.Helper()
	var got []string
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		fi, err := os.Lstat(p)
		require.NoError(t, err)
		rel, _ := filepath.Rel(dir, p)
		var what string
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			what, err = os.Readlink(p)
		case fi.Mode().IsRegular():
			var b []byte
			b, err = os.ReadFile(p)
			what = string(b) + " " + fi.ModTime().Truncate(time.Second).UTC().String()
		}
		require.NoError(t, err)
		got = append(got, fmt.Sprintf("%s %v %s", rel, fi.Mode(), what))
		return nil
	}))
	return got
}

func TestCopyDirOut(t *testing.T) {
	t.Parallel()
	f := newTarVM()
	f.tars["/out"] = testkit.Tar(t,
		testkit.Dir("out/", 0o750),
		testkit.Dir("out/bin/", 0o555), // read-only, yet filled
		testkit.File("out/bin/tool", "elf", 0o6755),
		testkit.Link("out/bin/same", "out/bin/tool"),
		testkit.Symlink("out/current", "bin/tool"),
		testkit.File("out/deep/er/file", "no directory entries", 0o644),
	)
	host := filepath.Join(t.TempDir(), "made")
	require.NoError(t, vm.CopyDirOut(context.Background(), f, "/out", host))
	got := listTree(t, host)
	for i := range got { // the times are the archive's
		got[i] = strings.Replace(got[i], " 2023-11-14 22:13:20 +0000 UTC", "", 1)
	}
	assert.Equal(t, []string{
		". drwxr-x--- ",
		"bin dr-xr-xr-x ",
		"bin/same -rwxr-xr-x elf",
		"bin/tool -rwxr-xr-x elf",
		"current Lrwxrwxrwx bin/tool",
		"deep drwxr-xr-x ",
		"deep/er drwxr-xr-x ",
		"deep/er/file -rw-r--r-- no directory entries",
	}, got, "modes kept but setuid and setgid, links kept as links")
	require.NoError(t, os.Chmod(filepath.Join(host, "bin"), 0o755)) // for TempDir's cleanup
}

func TestCopyDirOutIntoExisting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newTarVM()
	f.tars["/a"] = testkit.Tar(t, testkit.Dir("a/", 0o644), testkit.Dir("a/sub/", 0o644), testkit.File("a/sub/new", "new", 0o644))
	f.tars["/b"] = testkit.Tar(t, testkit.Dir("b/", 0o644), testkit.File("b/keep", "theirs", 0o644))
	host := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(host, "sub"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(host, "keep"), []byte("mine"), 0o644))

	require.NoError(t, vm.CopyDirOut(ctx, f, "/a", host), "directories merge")
	fi, err := os.Stat(filepath.Join(host, "sub"))
	require.NoError(t, err)
	assert.Equal(t, fs.FileMode(0o700), fi.Mode().Perm(), "a directory that exists keeps its mode")

	err = vm.CopyDirOut(ctx, f, "/b", host)
	assert.ErrorIs(t, err, fs.ErrExist)
	b, _ := os.ReadFile(filepath.Join(host, "keep"))
	assert.Equal(t, "mine", string(b), "a file that exists is never replaced")
}

func TestCopyDirOutRefuses(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		tar  []testkit.Entry
		want error
		msg  string
	}{
		{"a file", []testkit.Entry{testkit.File("out", "x", 0o644)}, nil, "not a directory"},
		{"dot-dot", []testkit.Entry{testkit.Dir("out/", 0o644), testkit.File("out/../../x", "x", 0o644)}, vm.ErrUnsafeArchive, "leaves the destination"},
		{"absolute symlink", []testkit.Entry{testkit.Dir("out/", 0o644), testkit.Symlink("out/l", "/etc")}, vm.ErrUnsafeArchive, "absolute"},
		{"symlink out of the copied dir", []testkit.Entry{testkit.Dir("out/", 0o644), testkit.Symlink("out/l", "../x")}, vm.ErrUnsafeArchive, "points outside"},
		{"beneath a symlink", []testkit.Entry{testkit.Dir("out/", 0o644), testkit.Symlink("out/l", "."), testkit.File("out/l/x", "x", 0o644)}, vm.ErrUnsafeArchive, "beneath symlink"},
		{"hard link out", []testkit.Entry{testkit.Dir("out/", 0o644), testkit.Link("out/h", "etc/passwd")}, vm.ErrUnsafeArchive, "outside the copied path"},
		{"device", []testkit.Entry{testkit.Dir("out/", 0o644), {Header: tar.Header{Name: "out/null", Typeflag: tar.TypeChar, Mode: 0o644}}}, vm.ErrUnsafeArchive, "device"},
		{"fifo", []testkit.Entry{testkit.Dir("out/", 0o644), {Header: tar.Header{Name: "out/fifo", Typeflag: tar.TypeFifo, Mode: 0o644}}}, vm.ErrUnsafeArchive, "only directories, regular files, symlinks and hard links"},
		{"another root", []testkit.Entry{testkit.Dir("out/", 0o644), testkit.File("other/x", "x", 0o644)}, vm.ErrUnsafeArchive, "outside the copied path"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newTarVM()
			f.tars["/out"] = testkit.Tar(t, c.tar...)
			parent := t.TempDir()
			err := vm.CopyDirOut(context.Background(), f, "/out", filepath.Join(parent, "dst"))
			assert.ErrorContains(t, err, c.msg)
			if c.want != nil {
				assert.ErrorIs(t, err, c.want)
			}
			entries, _ := os.ReadDir(parent)
			for _, e := range entries {
				assert.Equal(t, "dst", e.Name(), "written outside the destination")
			}
		})
	}
}

// fileServer serves ReadFile itself, and leaves the rest to the tar
// streams.
type fileServer struct {
	*tarVM
	asked []string
}

func (s *fileServer) ReadFile(_ context.Context, p string, maxBytes int64) ([]byte, error) {
	s.asked = append(s.asked, p)
	return []byte("served natively"), nil
}

func (s *fileServer) ReadDir(context.Context, string) ([]vm.FileInfo, error) {
	return nil, fmt.Errorf("fileServer: %w", vm.ErrNotSupported)
}

func (s *fileServer) WriteFile(context.Context, string, io.Reader, int64, fs.FileMode) error {
	return fmt.Errorf("fileServer: %w", vm.ErrNotSupported)
}

var _ vm.FileServer = (*fileServer)(nil)

func TestFileServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := &fileServer{tarVM: newTarVM()}
	got, err := vm.ReadFile(ctx, s, "/a/../etc//hosts", 10)
	require.NoError(t, err)
	assert.Equal(t, "served natively", string(got))
	assert.Equal(t, []string{"/etc/hosts"}, s.asked, "the path arrives cleaned")

	// ErrNotSupported: through the tar streams.
	require.NoError(t, vm.WriteFile(ctx, s, "/x", []byte("tar"), 0o644))
	assert.Equal(t, []string{"x 0 644 3 tar"}, readTar(t, s.tars["/x"]))
	s.tars["/d"] = testkit.Tar(t, testkit.Dir("d/", 0o644), testkit.File("d/f", "x", 0o644))
	list, err := vm.ReadDir(ctx, s, "/d")
	require.NoError(t, err)
	assert.Len(t, list, 1)

	_, err = vm.ReadFile(ctx, s, "relative", 10)
	assert.ErrorIs(t, err, fs.ErrInvalid, "arguments are checked before the server is asked")
	assert.Len(t, s.asked, 1)
}

// The translation of a missing path matches both backends' messages.
func TestMissingPathIsNotExist(t *testing.T) {
	t.Parallel()
	for _, msg := range []string{
		`copy out /no/such: libpod: archive get: 404 no such file or directory`,
		`/no/such: podman cp exited 125: "/no/such" could not be found on container 0123: no such file or directory`,
	} {
		ctrl := gomock.NewController(t)
		m := vmmock.NewMockVM(ctrl)
		m.EXPECT().CopyOut(gomock.Any(), "/no/such", gomock.Any()).Return(fmt.Errorf("%w: %s", vm.ErrPodman, msg))
		_, err := vm.ReadFile(context.Background(), m, "/no/such", 1)
		assert.ErrorIs(t, err, fs.ErrNotExist)
		assert.NotErrorIs(t, err, vm.ErrPodman, "one failure, one sentinel")
		assert.ErrorContains(t, err, msg, "the backend's message is kept")
		assert.True(t, errors.Is(err, os.ErrNotExist))
	}
}
