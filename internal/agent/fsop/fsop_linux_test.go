package fsop

import (
	"bytes"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	// A umask that would show any mode that is not applied exactly.
	unix.Umask(0o077)
	os.Exit(m.Run())
}

// names are names that shells, globs and UTF-8 decoders treat specially;
// each must stay itself.
var names = []string{"x", "[x]", "*", "?", `\`, "backslash", "a\nb", "bad-\xff\xfe", " sp ace ", "-", "long-" + strings.Repeat("n", 240)}

// result is what a call of Main returned.
type result struct {
	code           int
	stdout, stderr string
}

// call runs Main with args and stdin, failing the test if it takes over 10 s
// (a FIFO opened for reading blocks).
func call(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	done := make(chan result, 1)
	go func() {
		var stdout, stderr bytes.Buffer
		code := Main(args, strings.NewReader(stdin), &stdout, &stderr)
		done <- result{code, stdout.String(), stderr.String()}
	}()
	select {
	case r := <-done:
		if r.code == 0 {
			assert.Empty(t, r.stderr, "stderr of a success")
		} else {
			assert.True(t, strings.Count(r.stderr, "\n") == 1 && strings.HasSuffix(r.stderr, "\n"), "stderr is one line: %q", r.stderr)
		}
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("Main%q blocked", args)
		return result{}
	}
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	require.NoError(t, unix.Mkfifo(path, 0o600))
}

// mksock leaves a unix socket at path.
func mksock(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()
}

// write writes file path with mode (unix bits: 04000 is setuid).
func write(t *testing.T, path, content string, mode uint32) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, []byte(content), 0o600))
	require.NoError(t, unix.Chmod(path, mode))
}

func TestNames(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, name := range names {
		r := call(t, "content of "+name, "write", filepath.Join(dir, name), "-1", "644")
		require.Equal(t, 0, r.code, "write %q: %s", name, r.stderr)
	}
	for _, name := range names {
		r := call(t, "", "read", filepath.Join(dir, name), "1000")
		assert.Equal(t, result{0, "content of " + name, ""}, r, "read %q", name)
		got, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		assert.Equal(t, "content of "+name, string(got), "the file %q as written", name)
	}

	r := call(t, "", "list", dir)
	require.Equal(t, 0, r.code, r.stderr)
	entries, err := DecodeList(strings.NewReader(r.stdout))
	require.NoError(t, err)
	var listed []string
	for _, e := range entries {
		listed = append(listed, e.Name)
		assert.Equal(t, int64(len("content of "+e.Name)), e.Size, e.Name)
	}
	assert.ElementsMatch(t, names, listed)

	r = call(t, "", "tar-out", dir)
	require.Equal(t, 0, r.code, r.stderr)
	got := untar(t, r.stdout)
	base := filepath.Base(dir)
	for _, name := range names {
		assert.Equal(t, "content of "+name, got[base+"/"+name].content, "tarred %q", name)
	}
	assert.Len(t, got, len(names)+1)

	dst := t.TempDir()
	r = call(t, r.stdout, "tar-in", dst)
	require.Equal(t, 0, r.code, r.stderr)
	for _, name := range names {
		b, err := os.ReadFile(filepath.Join(dst, base, name))
		require.NoError(t, err, "untarred %q", name)
		assert.Equal(t, "content of "+name, string(b), "untarred %q", name)
	}
}

func TestRead(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, dir+"/file", "hello", 0o600)
	require.NoError(t, os.Mkdir(dir+"/dir", 0o700))
	mkfifo(t, dir+"/fifo")
	mksock(t, dir+"/sock")
	require.NoError(t, os.Symlink("link2", dir+"/link1"))
	require.NoError(t, os.Symlink(dir+"/file", dir+"/link2"))
	require.NoError(t, os.Symlink("dir", dir+"/dirlink"))
	require.NoError(t, os.Symlink("nowhere", dir+"/dangling"))
	open, err := os.Open(dir + "/file")
	require.NoError(t, err)
	t.Cleanup(func() { open.Close() })

	tests := []struct {
		name string
		args []string
		want result
	}{
		{"a file", []string{dir + "/file", "100"}, result{0, "hello", ""}},
		{"exactly the cap", []string{dir + "/file", "5"}, result{0, "hello", ""}},
		{"no cap", []string{dir + "/file", "-1"}, result{0, "hello", ""}},
		{"over the cap", []string{dir + "/file", "4"}, result{int(CodeTooLarge), "", "5 bytes, over the cap of 4\n"}},
		{"a symlink chain", []string{dir + "/link1", "100"}, result{0, "hello", ""}},
		{"a directory", []string{dir + "/dir", "100"}, result{int(CodeIsDir), "", "is a directory\n"}},
		{"a symlink to a directory", []string{dir + "/dirlink", "100"}, result{int(CodeIsDir), "", "is a directory\n"}},
		{"a FIFO", []string{dir + "/fifo", "100"}, result{int(CodeInvalid), "", "not a regular file (p---------)\n"}},
		{"a socket", []string{dir + "/sock", "100"}, result{int(CodeInvalid), "", "not a regular file (S---------)\n"}},
		{"a device", []string{"/dev/null", "100"}, result{int(CodeInvalid), "", "not a regular file (Dc---------)\n"}},
		{"missing", []string{dir + "/missing", "100"}, result{int(CodeNotExist), "", "no such file or directory\n"}},
		{"a missing parent", []string{dir + "/missing/x", "100"}, result{int(CodeNotExist), "", "no such file or directory\n"}},
		{"a dangling symlink", []string{dir + "/dangling", "100"}, result{int(CodeNotExist), "", "no such file or directory\n"}},
		{"a file as a parent", []string{dir + "/file/x", "100"}, result{int(CodeNotDir), "", "not a directory\n"}},
		{"a relative path", []string{"file", "100"}, result{int(CodeInvalid), "", "not an absolute path\n"}},
		{"a bad cap", []string{dir + "/file", "x"}, result{int(CodeInvalid), "", "bad cap \"x\"\n"}},
		{"too few arguments", []string{dir + "/file"}, result{int(CodeInvalid), "", "read takes 2 arguments, not 1\n"}},
	}
	if hasOpenat2() {
		tests = append(tests, struct {
			name string
			args []string
			want result
		}{"a magic link", []string{"/proc/self/fd/" + strconv.Itoa(int(open.Fd())), "100"}, result{int(CodeLoop), "", "too many levels of symbolic links\n"}})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tt.want, call(t, "", append([]string{"read"}, tt.args...)...))
		})
	}

	t.Run("a file longer than its size", func(t *testing.T) {
		t.Parallel()
		// /proc files say 0 bytes and have more: the cap still holds.
		r := call(t, "", "read", "/proc/self/status", "10")
		assert.Equal(t, int(CodeTooLarge), r.code)
		assert.Equal(t, "over the cap of 10 (the file grew while read)\n", r.stderr)
		assert.LessOrEqual(t, len(r.stdout), 10)
		r = call(t, "", "read", "/proc/self/status", "-1")
		assert.Equal(t, 0, r.code, r.stderr)
		assert.Contains(t, r.stdout, "\nPid:\t")
	})
}

func TestWrite(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) // before; the file is dir/f
		args  []string                       // SIZE PERM, or the whole arguments when longer
		stdin string
		want  result
		mode  fs.FileMode // of dir/f after a success, with its content stdin
		check func(t *testing.T, dir string)
	}{
		{name: "a new file", args: []string{"5", "644"}, stdin: "hello", mode: 0o644},
		{name: "all of stdin", args: []string{"-1", "600"}, stdin: "hello", mode: 0o600},
		{name: "empty", args: []string{"0", "640"}, mode: 0o640},
		{name: "setuid", args: []string{"5", "4755"}, stdin: "hello", mode: fs.ModeSetuid | 0o755},
		{name: "setgid and sticky", args: []string{"5", "3770"}, stdin: "hello", mode: fs.ModeSetgid | fs.ModeSticky | 0o770},
		{
			name: "an existing file, in place",
			setup: func(t *testing.T, dir string) {
				write(t, dir+"/f", "old old old", 0o4700)
				os.Link(dir+"/f", dir+"/other")
			},
			args: []string{"3", "4640"}, stdin: "new", mode: fs.ModeSetuid | 0o640,
			check: func(t *testing.T, dir string) {
				b, _ := os.ReadFile(dir + "/other")
				assert.Equal(t, "new", string(b), "the other link of the file")
			},
		},
		{
			name: "a symlink out is replaced, not followed",
			setup: func(t *testing.T, dir string) {
				write(t, dir+"/target", "keep", 0o600)
				require.NoError(t, os.Symlink(dir+"/target", dir+"/f"))
			},
			args: []string{"3", "644"}, stdin: "new", mode: 0o644,
			check: func(t *testing.T, dir string) {
				b, _ := os.ReadFile(dir + "/target")
				assert.Equal(t, "keep", string(b), "the symlink's target")
			},
		},
		{
			name:  "a dangling symlink is replaced",
			setup: func(t *testing.T, dir string) { require.NoError(t, os.Symlink(dir+"/nowhere", dir+"/f")) },
			args:  []string{"3", "644"}, stdin: "new", mode: 0o644,
			check: func(t *testing.T, dir string) {
				assert.NoFileExists(t, dir+"/nowhere")
			},
		},
		{
			name:  "a FIFO is replaced",
			setup: func(t *testing.T, dir string) { mkfifo(t, dir+"/f") },
			args:  []string{"3", "644"}, stdin: "new", mode: 0o644,
		},
		{
			name:  "a socket is replaced",
			setup: func(t *testing.T, dir string) { mksock(t, dir+"/f") },
			args:  []string{"3", "644"}, stdin: "new", mode: 0o644,
		},
		{
			name:  "a directory",
			setup: func(t *testing.T, dir string) { require.NoError(t, os.Mkdir(dir+"/f", 0o700)) },
			args:  []string{"3", "644"}, stdin: "new", want: result{int(CodeIsDir), "", "is a directory\n"},
		},
		{
			name: "a symlink to a directory is replaced",
			setup: func(t *testing.T, dir string) {
				os.Mkdir(dir+"/d", 0o700)
				require.NoError(t, os.Symlink("d", dir+"/f"))
			},
			args: []string{"3", "644"}, stdin: "new", mode: 0o644,
		},
		{name: "too few bytes", args: []string{"5", "644"}, stdin: "abc", want: result{int(CodeInvalid), "", "3 bytes came, not 5\n"}},
		{name: "too many bytes", args: []string{"5", "644"}, stdin: "abcdefg", want: result{int(CodeInvalid), "", "7 bytes came, not 5\n"}},
		{name: "a bad size", args: []string{"-2", "644"}, want: result{int(CodeInvalid), "", "bad size \"-2\"\n"}},
		{name: "bad permissions", args: []string{"0", "17777"}, want: result{int(CodeInvalid), "", "bad permissions \"17777\"\n"}},
		{name: "permissions not octal", args: []string{"0", "9"}, want: result{int(CodeInvalid), "", "bad permissions \"9\"\n"}},
		{name: "a missing parent", args: []string{"write", "D/missing/f", "0", "644"}, want: result{int(CodeNotExist), "", "no such file or directory\n"}},
		{name: "a file as a parent", setup: func(t *testing.T, dir string) { write(t, dir+"/f", "", 0o600) },
			args: []string{"write", "D/f/g", "0", "644"}, want: result{int(CodeNotDir), "", "not a directory\n"}},
		{name: "a path ending in /", args: []string{"write", "D/", "0", "644"}, want: result{int(CodeIsDir), "", "is a directory\n"}},
		{name: "the root", args: []string{"write", "/", "0", "644"}, want: result{int(CodeIsDir), "", "is a directory\n"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			if tt.setup != nil {
				tt.setup(t, dir)
			}
			args := append([]string{"write", dir + "/f"}, tt.args...)
			if len(tt.args) > 2 {
				args = append([]string(nil), tt.args...)
				args[1] = strings.Replace(args[1], "D", dir, 1)
			}
			r := call(t, tt.stdin, args...)
			assert.Equal(t, tt.want, r)
			if tt.want.code == 0 {
				fi, err := os.Lstat(dir + "/f")
				require.NoError(t, err)
				assert.Equal(t, tt.mode, fi.Mode(), "mode")
				b, _ := os.ReadFile(dir + "/f")
				assert.Equal(t, tt.stdin, string(b), "content")
			}
			if tt.check != nil {
				tt.check(t, dir)
			}
		})
	}
}

func TestList(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write(t, dir+"/file", "hello", 0o640)
	write(t, dir+"/setuid", "", 0o4755)
	require.NoError(t, os.Mkdir(dir+"/sticky", 0o700))
	require.NoError(t, os.Chmod(dir+"/sticky", fs.ModeSticky|0o755))
	require.NoError(t, os.Symlink("bad-\xff/target", dir+"/link"))
	mkfifo(t, dir+"/fifo")
	mksock(t, dir+"/sock")
	for _, name := range names {
		write(t, dir+"/n"+name, "", 0o600)
	}
	when := time.Date(2021, 2, 3, 4, 5, 6, 789, time.UTC)
	require.NoError(t, os.Chtimes(dir+"/file", when, when))
	require.NoError(t, os.Symlink(dir, dir+"/../dirlink-"+filepath.Base(dir)))
	t.Cleanup(func() { os.Remove(dir + "/../dirlink-" + filepath.Base(dir)) })

	// What os.Lstat says, for every entry.
	var want []Entry
	des, err := os.ReadDir(dir) // sorted by name
	require.NoError(t, err)
	for _, de := range des {
		fi, err := de.Info()
		require.NoError(t, err)
		e := Entry{Name: de.Name(), Mode: fi.Mode(), ModTime: fi.ModTime()}
		if fi.Mode().IsRegular() {
			e.Size = fi.Size()
		}
		if e.Mode&fs.ModeSymlink != 0 {
			e.Link, _ = os.Readlink(dir + "/" + e.Name)
		}
		want = append(want, e)
	}

	for _, path := range []string{dir, dir + "/../dirlink-" + filepath.Base(dir)} {
		r := call(t, "", "list", path)
		require.Equal(t, 0, r.code, r.stderr)
		got, err := DecodeList(strings.NewReader(r.stdout))
		require.NoError(t, err)
		require.Len(t, got, len(want))
		byName := map[string]Entry{}
		for i := range got {
			assert.Equal(t, want[i].Name, got[i].Name, "order")
			assert.True(t, want[i].ModTime.Equal(got[i].ModTime), "%q: mtime %v, not %v", got[i].Name, got[i].ModTime, want[i].ModTime)
			got[i].ModTime = want[i].ModTime
			assert.Equal(t, want[i], got[i])
			byName[got[i].Name] = got[i]
		}
		file := byName["file"]
		assert.True(t, when.Equal(file.ModTime), "mtime %v, not %v", file.ModTime, when)
		file.ModTime = time.Time{}
		assert.Equal(t, Entry{"file", 5, 0o640, time.Time{}, ""}, file)
		assert.Equal(t, fs.ModeSetuid|0o755, byName["setuid"].Mode)
		assert.Equal(t, fs.ModeDir|fs.ModeSticky|0o755, byName["sticky"].Mode)
		assert.Equal(t, "bad-\xff/target", byName["link"].Link)
		assert.Equal(t, fs.ModeSymlink, byName["link"].Mode.Type())
		assert.Equal(t, fs.ModeNamedPipe, byName["fifo"].Mode.Type())
		assert.Equal(t, fs.ModeSocket, byName["sock"].Mode.Type())
	}

	assert.Equal(t, result{int(CodeNotDir), "", "not a directory\n"}, call(t, "", "list", dir+"/file"))
	assert.Equal(t, result{int(CodeNotExist), "", "no such file or directory\n"}, call(t, "", "list", dir+"/missing"))
}

func TestWriteIgnoresUmask(t *testing.T) {
	// Not parallel: it changes the process's umask.
	dir := t.TempDir()
	old := syscall.Umask(0o777)
	defer syscall.Umask(old)
	r := call(t, "x", "write", dir+"/f", "1", "4777")
	require.Equal(t, 0, r.code, r.stderr)
	fi, err := os.Stat(dir + "/f")
	require.NoError(t, err)
	assert.Equal(t, fs.ModeSetuid|0o777, fi.Mode())
}
