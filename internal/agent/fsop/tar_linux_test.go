package fsop

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/podvm/podvm/internal/testkit"
)

// tarFile is one entry of a tar stream.
type tarFile struct {
	index   int
	hdr     *tar.Header
	content string
}

// untar reads a whole tar stream, its entries by name.
func untar(t *testing.T, stream string) map[string]tarFile {
	t.Helper()
	entries, err := testkit.Untar([]byte(stream))
	require.NoError(t, err)
	files := map[string]tarFile{}
	for i, e := range entries {
		files[e.Name] = tarFile{i, &e.Header, e.Body}
	}
	return files
}

// tempDir is t.TempDir, made removable at the end by a user who is not
// root even when read-only directories were put in it.
func tempDir(t *testing.T) string {
	dir := t.TempDir()
	t.Cleanup(func() {
		filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(path, 0o700)
			}
			return nil
		})
	})
	return dir
}

// when is the mtime makeTree gives every file.
var when = time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)

// makeTree fills dir with one of each kind of file tar carries, in modes
// and with names that are easy to lose.
func makeTree(t *testing.T, dir string) {
	t.Helper()
	must := func(err error) { t.Helper(); require.NoError(t, err) }
	must(os.Mkdir(dir, 0o700))
	write(t, dir+"/data", "data", 0o644)
	write(t, dir+"/exec", "#!", 0o4755)
	write(t, dir+"/sgid", "", 0o2750)
	write(t, dir+"/empty", "", 0o600)
	must(os.Link(dir+"/data", dir+"/hard"))
	must(os.Symlink("data", dir+"/link"))
	must(os.Symlink("/nonexistent/abs", dir+"/abslink"))
	must(os.Symlink("bad-\xff\xfe/"+strings.Repeat("t", 200), dir+"/badlink"))
	mkfifo(t, dir+"/fifo")
	must(os.Chmod(dir+"/fifo", 0o640))
	must(os.MkdirAll(dir+"/d/sub", 0o700))
	write(t, dir+"/d/inner", "inner", 0o600)
	write(t, dir+"/d/sub/f", strings.Repeat("big", 100_000), 0o600)
	must(os.Link(dir+"/d/sub/f", dir+"/d/f-again"))
	must(os.Mkdir(dir+"/n", 0o700))
	for _, name := range names {
		write(t, dir+"/n/"+name, name, 0o644)
	}
	must(os.Mkdir(dir+"/e", 0o700))
	// Last, as they stop writes or change mtimes.
	must(os.Chmod(dir+"/d/sub", 0o555))
	must(os.Chmod(dir+"/d", fs.ModeSticky|0o777))
	must(filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		must(err)
		return unix.UtimesNanoAt(unix.AT_FDCWD, path, []unix.Timespec{unix.NsecToTimespec(when.UnixNano()), unix.NsecToTimespec(when.UnixNano())}, unix.AT_SYMLINK_NOFOLLOW)
	}))
	dirs := []string{dir + "/d/sub", dir + "/d", dir + "/n", dir + "/e", dir}
	for _, d := range dirs {
		must(os.Chtimes(d, when, when))
	}
}

// node is what a round trip keeps of a file.
type node struct {
	mode    fs.FileMode
	content string
	link    string
	mtime   time.Time
	uid     uint32
	sameAs  string // the first path with the same inode, for hard links
}

// snapshot is every file beneath dir, by path relative to it.
func snapshot(t *testing.T, dir string) map[string]node {
	t.Helper()
	nodes := map[string]node{}
	first := map[uint64]string{}
	require.NoError(t, filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		require.NoError(t, err)
		fi, err := os.Lstat(path)
		require.NoError(t, err)
		rel, _ := filepath.Rel(dir, path)
		st := fi.Sys().(*syscall.Stat_t)
		n := node{mode: fi.Mode(), mtime: fi.ModTime(), uid: st.Uid}
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(path)
			require.NoError(t, err)
			n.content = string(b)
		case fi.Mode()&fs.ModeSymlink != 0:
			n.link, err = os.Readlink(path)
			require.NoError(t, err)
		}
		if !fi.IsDir() {
			if f, ok := first[st.Ino]; ok {
				n.sameAs = f
			} else {
				first[st.Ino] = rel
			}
		}
		nodes[rel] = n
		return nil
	}))
	return nodes
}

func assertSameTree(t *testing.T, want, got map[string]node) {
	t.Helper()
	assert.Len(t, got, len(want))
	for path, w := range want {
		g, ok := got[path]
		if !assert.True(t, ok, "%q is missing", path) {
			continue
		}
		assert.True(t, w.mtime.Equal(g.mtime), "%q: mtime %v, not %v", path, g.mtime, w.mtime)
		w.mtime, g.mtime = time.Time{}, time.Time{}
		assert.Equal(t, w, g, "%q", path)
	}
}

func TestTarOut(t *testing.T) {
	t.Parallel()
	src := tempDir(t)
	makeTree(t, src+"/t")
	r := call(t, "", "tar-out", src+"/t")
	require.Equal(t, 0, r.code, r.stderr)
	files := untar(t, r.stdout)

	uid, gid := os.Getuid(), os.Getgid()
	for name, f := range files {
		assert.True(t, strings.HasPrefix(name, "t/"), "%q is under t/", name)
		assert.Equal(t, []int{uid, gid}, []int{f.hdr.Uid, f.hdr.Gid}, "%q: owner", name)
		assert.True(t, when.Equal(f.hdr.ModTime), "%q: mtime %v", name, f.hdr.ModTime)
	}
	want := map[string]struct {
		typ      byte
		mode     int64
		linkname string
		content  string
	}{
		"t/":                         {tar.TypeDir, 0o700&^0o077 | 0o700, "", ""},
		"t/data":                     {tar.TypeReg, 0o644, "", "data"},
		"t/exec":                     {tar.TypeReg, 0o4755, "", "#!"},
		"t/sgid":                     {tar.TypeReg, 0o2750, "", ""},
		"t/hard":                     {tar.TypeLink, 0o644, "t/data", ""},
		"t/link":                     {tar.TypeSymlink, 0o777, "data", ""},
		"t/badlink":                  {tar.TypeSymlink, 0o777, "bad-\xff\xfe/" + strings.Repeat("t", 200), ""},
		"t/fifo":                     {tar.TypeFifo, 0o640, "", ""},
		"t/d/":                       {tar.TypeDir, 0o1777, "", ""},
		"t/d/sub/":                   {tar.TypeDir, 0o555, "", ""},
		"t/d/f-again":                {tar.TypeReg, 0o600, "", strings.Repeat("big", 100_000)},
		"t/d/sub/f":                  {tar.TypeLink, 0o600, "t/d/f-again", ""},
		"t/n/bad-\xff\xfe":           {tar.TypeReg, 0o644, "", "bad-\xff\xfe"},
		"t/n/a\nb":                   {tar.TypeReg, 0o644, "", "a\nb"},
		"t/n/" + names[len(names)-1]: {tar.TypeReg, 0o644, "", names[len(names)-1]},
	}
	for name, w := range want {
		f, ok := files[name]
		if !assert.True(t, ok, "%q is missing", name) {
			continue
		}
		assert.Equal(t, w.typ, f.hdr.Typeflag, "%q: type", name)
		assert.Equal(t, w.mode, f.hdr.Mode, "%q: mode", name)
		assert.Equal(t, w.linkname, f.hdr.Linkname, "%q: link", name)
		assert.Equal(t, w.content, f.content, "%q: content", name)
	}
	assert.Len(t, files, len(snapshot(t, src+"/t")), "every file, once")
	assert.Less(t, files["t/d/"].index, files["t/d/inner"].index, "a directory before its contents")
	assert.Less(t, files["t/d/f-again"].index, files["t/d/inner"].index, "sorted by name")

	t.Run("GNU tar extracts it", func(t *testing.T) {
		t.Parallel()
		if _, err := exec.LookPath("tar"); err != nil {
			t.Skip("no tar")
		}
		dst := tempDir(t)
		cmd := exec.Command("tar", "-C", dst, "-xpf", "-")
		cmd.Stdin = strings.NewReader(r.stdout)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "%s", out)
		assertSameTree(t, snapshot(t, src+"/t"), snapshot(t, dst+"/t"))
	})
}

func TestTarOutRoots(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	require.NoError(t, os.Mkdir(dir+"/t", 0o755))
	write(t, dir+"/t/f", "f", 0o644)
	require.NoError(t, os.Symlink("t", dir+"/dirlink"))
	require.NoError(t, os.Symlink("t/f", dir+"/filelink"))
	require.NoError(t, os.Mkdir(dir+"/s", 0o755))
	write(t, dir+"/s/a", "", 0o644)
	mksock(t, dir+"/s/sock")

	names := func(stream string) []string {
		var names []string
		files := untar(t, stream)
		for name, f := range files {
			names = append(names, name)
			assert.NotEqual(t, tar.TypeSymlink, f.hdr.Typeflag, "%q: the root is followed", name)
		}
		return names
	}
	tests := []struct {
		path  string
		names []string
	}{
		{"/t", []string{"t/", "t/f"}},
		{"/t/", []string{"t/", "t/f"}},
		{"/dirlink", []string{"dirlink/", "dirlink/f"}},
		{"/filelink", []string{"filelink"}},
		{"/t/f", []string{"f"}},
	}
	for _, tt := range tests {
		r := call(t, "", "tar-out", dir+tt.path)
		require.Equal(t, 0, r.code, "%s: %s", tt.path, r.stderr)
		assert.ElementsMatch(t, tt.names, names(r.stdout), tt.path)
	}

	// The root of the sandbox: entries named as `tar -C / -c .` would.
	var buf bytes.Buffer
	require.NoError(t, writeTar(dir+"/t", ".", &buf))
	assert.ElementsMatch(t, []string{"./", "f"}, names(buf.String()))
	for path, want := range map[string]string{"/": ".", "/a/b": "b", "/a/b//": "b", "/a": "a"} {
		got, err := tarName(path)
		assert.NoError(t, err)
		assert.Equal(t, want, got, path)
	}
	_, err := tarName("/a/..")
	assert.Error(t, err)

	r := call(t, "", "tar-out", "/dev/null")
	require.Equal(t, 0, r.code, r.stderr)
	null := untar(t, r.stdout)["null"].hdr
	if assert.NotNil(t, null, "/dev/null is carried") {
		assert.Equal(t, []int64{tar.TypeChar, 1, 3}, []int64{int64(null.Typeflag), null.Devmajor, null.Devminor})
	}

	assert.Equal(t, result{int(CodeUnsafe), "", "entry \"s/sock\": a socket cannot be put in a tar\n"}, discardStdout(call(t, "", "tar-out", dir+"/s")))
	assert.Equal(t, result{int(CodeNotExist), "", "no such file or directory\n"}, call(t, "", "tar-out", dir+"/missing"))
}

func TestTarOutChangedSize(t *testing.T) {
	t.Parallel()
	// sysfs files say 4096 bytes and have fewer.
	const path = "/sys/kernel/uevent_seqnum"
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil || st.Size != 4096 {
		t.Skipf("no %s of 4096 bytes", path)
	}
	r := call(t, "", "tar-out", path)
	assert.Equal(t, 1, r.code)
	assert.Equal(t, "entry \"uevent_seqnum\": changed size while read\n", r.stderr)
	f := untar(t, r.stdout)["uevent_seqnum"]
	require.NotNil(t, f.hdr, "the entry is there, whole")
	assert.Len(t, f.content, 4096)
	assert.Equal(t, strings.Repeat("\x00", 100), f.content[4096-100:], "padded with zeros")
}

// discardStdout drops what an operation wrote before it failed.
func discardStdout(r result) result { r.stdout = ""; return r }

// archive is the tar stream of ents as the agent's tests write it: in
// GNU format, every entry's mtime when (a global header as it is).
func archive(t *testing.T, ents ...testkit.Entry) string {
	t.Helper()
	ents = slices.Clone(ents)
	for i := range ents {
		if ents[i].Typeflag != tar.TypeXGlobalHeader {
			ents[i].Format, ents[i].ModTime = tar.FormatGNU, when
		}
	}
	return string(testkit.Tar(t, ents...))
}

// modes are the ways tar-in resolves paths: with openat2 where the kernel
// has it, and the walk that refuses every symlink.
func modes(t *testing.T) map[string]bool {
	if !hasOpenat2() {
		t.Log("no openat2 here: only the walk is tested")
		return map[string]bool{"walk": false}
	}
	return map[string]bool{"openat2": true, "walk": false}
}

func TestTarIn(t *testing.T) {
	t.Parallel()
	const out = "a symlink under the destination leads out of it"
	tests := []struct {
		name    string
		setup   func(t *testing.T, dst, outside string)
		ents    []testkit.Entry
		stream  string // instead of ents
		code    Code
		msg     string // the failure with openat2
		walkMsg string // the failure of the walk, when it differs
		check   func(t *testing.T, dst string)
	}{
		{
			name:  "a planted absolute symlink",
			setup: func(t *testing.T, dst, outside string) { require.NoError(t, os.Symlink(outside, dst+"/evil")) },
			ents:  []testkit.Entry{testkit.File("evil/x", "bad", 0o644)},
			code:  CodeUnsafe, msg: `entry "evil/x": ` + out, walkMsg: `entry "evil/x": ` + errSymlink.Error(),
		},
		{
			name:  "a planted relative symlink",
			setup: func(t *testing.T, dst, outside string) { require.NoError(t, os.Symlink("../outside", dst+"/evil")) },
			ents:  []testkit.Entry{testkit.File("evil/x", "bad", 0o644)},
			code:  CodeUnsafe, msg: `entry "evil/x": ` + out, walkMsg: `entry "evil/x": ` + errSymlink.Error(),
		},
		{
			name: "a planted symlink deeper down",
			setup: func(t *testing.T, dst, outside string) {
				require.NoError(t, os.MkdirAll(dst+"/a/b", 0o700))
				require.NoError(t, os.Symlink("../../../outside", dst+"/a/b/evil"))
			},
			ents: []testkit.Entry{testkit.Dir("a/b/evil/c/", 0o755)},
			code: CodeUnsafe, msg: `entry "a/b/evil/c/": ` + out, walkMsg: `entry "a/b/evil/c/": ` + errSymlink.Error(),
		},
		{
			name: "a symlink chain out",
			setup: func(t *testing.T, dst, outside string) {
				require.NoError(t, os.Symlink("l2", dst+"/l1"))
				require.NoError(t, os.Symlink(outside, dst+"/l2"))
			},
			ents: []testkit.Entry{testkit.File("l1/x", "bad", 0o644)},
			code: CodeUnsafe, msg: `entry "l1/x": ` + out, walkMsg: `entry "l1/x": ` + errSymlink.Error(),
		},
		{
			name: "the archive's own symlink out",
			ents: []testkit.Entry{testkit.Symlink("l", "../outside"), testkit.File("l/x", "bad", 0o644)},
			code: CodeUnsafe, msg: `entry "l/x": ` + out, walkMsg: `entry "l/x": ` + errSymlink.Error(),
		},
		{
			name:  "a hard link through a planted symlink",
			setup: func(t *testing.T, dst, outside string) { require.NoError(t, os.Symlink(outside, dst+"/evil")) },
			ents:  []testkit.Entry{testkit.Link("h", "evil/f")},
			code:  CodeUnsafe, msg: `entry "h": link target: ` + out, walkMsg: `entry "h": link target: ` + errSymlink.Error(),
		},
		{name: "a hard link up", ents: []testkit.Entry{testkit.Link("h", "../outside/f")}, code: CodeUnsafe, msg: `entry "h": link target: a name with ".."`},
		{name: "an absolute name", ents: []testkit.Entry{testkit.File("/x", "", 0o644)}, code: CodeUnsafe, msg: `entry "/x": an absolute name`},
		{name: "a name up", ents: []testkit.Entry{testkit.File("../x", "", 0o644)}, code: CodeUnsafe, msg: `entry "../x": a name with ".."`},
		{name: "a name down and up", ents: []testkit.Entry{testkit.File("a/../../x", "", 0o644)}, code: CodeUnsafe, msg: `entry "a/../../x": a name with ".."`},
		{
			name: "a character device",
			ents: []testkit.Entry{{Header: tar.Header{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3, Mode: 0o666}}},
			code: CodeUnsafe, msg: `entry "null": a device cannot be created`,
		},
		{
			name: "a block device",
			ents: []testkit.Entry{{Header: tar.Header{Name: "sda", Typeflag: tar.TypeBlock, Devmajor: 8, Mode: 0o660}}},
			code: CodeUnsafe, msg: `entry "sda": a device cannot be created`,
		},
		{
			name: "an unknown type",
			ents: []testkit.Entry{{Header: tar.Header{Name: "c", Typeflag: tar.TypeCont, Mode: 0o660}}},
			code: CodeUnsafe, msg: `entry "c": tar entry type '7' is not supported`,
		},
		{
			name: "a symlink within the destination",
			setup: func(t *testing.T, dst, outside string) {
				require.NoError(t, os.Mkdir(dst+"/sub", 0o700))
				require.NoError(t, os.Symlink("sub", dst+"/in"))
			},
			ents:    []testkit.Entry{testkit.File("in/x", "ok", 0o644)},
			walkMsg: `entry "in/x": ` + errSymlink.Error(),
			check: func(t *testing.T, dst string) {
				b, _ := os.ReadFile(dst + "/sub/x")
				assert.Equal(t, "ok", string(b))
			},
		},
		{
			name:  "a file over a planted symlink",
			setup: func(t *testing.T, dst, outside string) { require.NoError(t, os.Symlink(outside+"/f", dst+"/f")) },
			ents:  []testkit.Entry{testkit.File("f", "new", 0o644)},
			check: func(t *testing.T, dst string) {
				fi, err := os.Lstat(dst + "/f")
				require.NoError(t, err)
				assert.True(t, fi.Mode().IsRegular())
			},
		},
		{
			name:  "a symlink over a file",
			setup: func(t *testing.T, dst, outside string) { write(t, dst+"/f", "old", 0o600) },
			ents:  []testkit.Entry{testkit.Symlink("f", "target")},
			check: func(t *testing.T, dst string) {
				target, err := os.Readlink(dst + "/f")
				require.NoError(t, err)
				assert.Equal(t, "target", target)
			},
		},
		{
			name:  "a file over a directory",
			setup: func(t *testing.T, dst, outside string) { require.NoError(t, os.Mkdir(dst+"/d", 0o700)) },
			ents:  []testkit.Entry{testkit.File("d", "", 0o644)},
			code:  CodeIsDir, msg: `entry "d": is a directory`,
		},
		{
			name:  "a directory over a file",
			setup: func(t *testing.T, dst, outside string) { write(t, dst+"/d", "", 0o600) },
			ents:  []testkit.Entry{testkit.Dir("d/", 0o750)},
			check: func(t *testing.T, dst string) {
				fi, err := os.Lstat(dst + "/d")
				require.NoError(t, err)
				assert.Equal(t, fs.ModeDir|0o750, fi.Mode())
			},
		},
		{
			name: "a directory merged",
			setup: func(t *testing.T, dst, outside string) {
				require.NoError(t, os.Mkdir(dst+"/d", 0o700))
				write(t, dst+"/d/old", "old", 0o600)
			},
			ents: []testkit.Entry{testkit.Dir("d/", 0o750), testkit.File("d/new", "new", 0o600)},
			check: func(t *testing.T, dst string) {
				assert.FileExists(t, dst+"/d/old")
				assert.FileExists(t, dst+"/d/new")
				fi, err := os.Lstat(dst + "/d")
				require.NoError(t, err)
				assert.Equal(t, fs.ModeDir|0o750, fi.Mode())
			},
		},
		{
			name: "missing parents",
			ents: []testkit.Entry{testkit.File("p/q/r", "r", 0o644)},
			check: func(t *testing.T, dst string) {
				b, _ := os.ReadFile(dst + "/p/q/r")
				assert.Equal(t, "r", string(b))
			},
		},
		{
			name: "a hard link",
			ents: []testkit.Entry{testkit.File("a", "a", 0o644), testkit.Link("b", "a"), testkit.Link("./c", "./a")},
			check: func(t *testing.T, dst string) {
				a, _ := os.Stat(dst + "/a")
				for _, name := range []string{"b", "c"} {
					fi, err := os.Stat(dst + "/" + name)
					require.NoError(t, err)
					assert.True(t, os.SameFile(a, fi), name)
				}
			},
		},
		{
			name: "modes",
			ents: []testkit.Entry{
				testkit.File("suid", "", 0o4755), testkit.File("sgid", "", 0o2750), testkit.File("none", "x", 0),
				testkit.Dir("sticky/", 0o1777), testkit.Dir("ro/", 0o555), testkit.File("ro/f", "f", 0o400),
				{Header: tar.Header{Name: "fifo", Typeflag: tar.TypeFifo, Mode: 0o640}},
			},
			check: func(t *testing.T, dst string) {
				for name, want := range map[string]fs.FileMode{
					"suid": fs.ModeSetuid | 0o755, "sgid": fs.ModeSetgid | 0o750, "none": 0,
					"sticky": fs.ModeDir | fs.ModeSticky | 0o777, "ro": fs.ModeDir | 0o555, "ro/f": 0o400,
					"fifo": fs.ModeNamedPipe | 0o640,
				} {
					fi, err := os.Lstat(dst + "/" + name)
					require.NoError(t, err)
					assert.Equal(t, want, fi.Mode(), name)
				}
			},
		},
		{
			name: "the destination's own entry and mtimes",
			ents: []testkit.Entry{testkit.Dir("./", 0o750), testkit.Dir("d/", 0o755), testkit.File("d/f", "f", 0o644), testkit.Symlink("d/l", "f")},
			check: func(t *testing.T, dst string) {
				for _, name := range []string{"", "d", "d/f", "d/l"} {
					fi, err := os.Lstat(dst + "/" + name)
					require.NoError(t, err)
					assert.True(t, when.Equal(fi.ModTime()), "%q: mtime %v", name, fi.ModTime())
				}
				fi, _ := os.Stat(dst)
				assert.Equal(t, fs.ModeDir|0o750, fi.Mode())
			},
		},
		{
			name: "a global header",
			ents: []testkit.Entry{{Header: tar.Header{Typeflag: tar.TypeXGlobalHeader, Name: "pax_global_header", PAXRecords: map[string]string{"comment": "c"}}}, testkit.File("f", "f", 0o644)},
			check: func(t *testing.T, dst string) {
				assert.NoFileExists(t, dst+"/pax_global_header")
				assert.FileExists(t, dst+"/f")
			},
		},
		{
			name: "a cut stream",
			stream: func() string {
				s := archive(t, testkit.File("f", strings.Repeat("x", 2000), 0o644))
				return s[:1000]
			}(),
			code: CodeFailed, msg: `entry "f": unexpected EOF`,
		},
	}
	for mode, beneath := range modes(t) {
		for _, tt := range tests {
			t.Run(mode+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				base := tempDir(t)
				dst, outside := base+"/dst", base+"/outside"
				require.NoError(t, os.Mkdir(dst, 0o700))
				require.NoError(t, os.Mkdir(outside, 0o700))
				write(t, outside+"/f", "keep", 0o600)
				before := snapshot(t, outside)
				if tt.setup != nil {
					tt.setup(t, dst, outside)
				}
				stream := tt.stream
				if stream == "" {
					stream = archive(t, tt.ents...)
				}
				err := extract(dst, strings.NewReader(stream), beneath)
				code, msg := tt.code, tt.msg
				if !beneath && tt.walkMsg != "" {
					code, msg = CodeUnsafe, tt.walkMsg
				}
				if code == CodeOK {
					assert.NoError(t, err)
				} else if assert.Error(t, err) {
					assert.Equal(t, code, codeOf(err), "code")
					assert.Equal(t, msg, err.Error())
				}
				assertSameTree(t, before, snapshot(t, outside))
				if tt.check != nil && code == CodeOK {
					tt.check(t, dst)
				}
			})
		}
	}
}

func TestTarInDestination(t *testing.T) {
	t.Parallel()
	dir := tempDir(t)
	write(t, dir+"/file", "", 0o600)
	require.NoError(t, os.Mkdir(dir+"/d", 0o700))
	require.NoError(t, os.Symlink("d", dir+"/link"))
	stream := archive(t, testkit.File("f", "f", 0o644))

	assert.Equal(t, result{int(CodeNotExist), "", "no such file or directory\n"}, call(t, stream, "tar-in", dir+"/missing"))
	assert.Equal(t, result{int(CodeNotDir), "", "not a directory\n"}, call(t, stream, "tar-in", dir+"/file"))
	assert.Equal(t, result{0, "", ""}, call(t, stream, "tar-in", dir+"/link"))
	assert.FileExists(t, dir+"/d/f", "through the symlink")

	// GNU tar pads its stream to a record of 10 KiB; whatever follows the
	// end, and more than a buffer of it, is read.
	stdin := strings.NewReader(stream + strings.Repeat("\x00", 1<<20))
	assert.Equal(t, 0, Main([]string{"tar-in", dir + "/d"}, stdin, io.Discard, io.Discard))
	assert.Zero(t, stdin.Len(), "bytes left unread")
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	src := tempDir(t)
	makeTree(t, src+"/t")
	want := snapshot(t, src+"/t")
	r := call(t, "", "tar-out", src+"/t")
	require.Equal(t, 0, r.code, r.stderr)
	streams := map[string]string{"fsop": r.stdout}
	if _, err := exec.LookPath("tar"); err == nil {
		out, err := exec.Command("tar", "-C", src, "-cf", "-", "t").Output()
		require.NoError(t, err)
		streams["GNU tar"] = string(out)
	}
	for mode, beneath := range modes(t) {
		for from, stream := range streams {
			t.Run(from+" into "+mode, func(t *testing.T) {
				t.Parallel()
				dst := tempDir(t)
				err := extract(dst, strings.NewReader(stream), beneath)
				require.NoError(t, err)
				assertSameTree(t, want, snapshot(t, dst+"/t"))
			})
		}
	}
}

// TestCodes checks that errno values map to the documented codes.
func TestCodes(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]Code{
		unix.ENOENT: CodeNotExist, unix.EISDIR: CodeIsDir, unix.ENOTDIR: CodeNotDir, unix.ENAMETOOLONG: CodeNameTooLong, unix.EINVAL: CodeInvalid,
		unix.EEXIST: CodeExist, unix.EACCES: CodePermission, unix.EPERM: CodePermission, unix.EROFS: CodeReadOnly, unix.ELOOP: CodeLoop, unix.ENOSPC: CodeNoSpace, unix.EIO: CodeFailed, errOut: CodeUnsafe,
		errors.New("x"): CodeFailed, failf(CodeTooLarge, "x"): CodeTooLarge,
	} {
		assert.Equal(t, want, codeOf(err), "%v", err)
	}
}
