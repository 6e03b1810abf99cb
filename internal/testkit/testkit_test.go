package testkit

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	osexec "os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLockedBuffer(t *testing.T) {
	t.Parallel()
	var b LockedBuffer
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 100 {
				_, err := fmt.Fprint(&b, i)
				assert.NoError(t, err)
				_ = b.String()
			}
		})
	}
	wg.Wait()
	assert.Len(t, b.String(), 800)
}

func TestFailingWriter(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	n, err := FailingWriter{boom}.Write([]byte("x"))
	assert.Zero(t, n)
	assert.Equal(t, boom, err)
}

func TestSlowWriter(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		w    *SlowWriter
		min  time.Duration
	}{
		{"delay", &SlowWriter{Delay: 20 * time.Millisecond}, 40 * time.Millisecond},
		{"rate", &SlowWriter{Rate: 100}, 40 * time.Millisecond}, // 2 bytes a write: 20ms each
		{"none", &SlowWriter{}, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var into strings.Builder
			c.w.W = &into
			start := time.Now()
			for range 2 {
				n, err := c.w.Write([]byte("ab"))
				require.NoError(t, err)
				assert.Equal(t, 2, n)
			}
			assert.GreaterOrEqual(t, time.Since(start), c.min)
			assert.Equal(t, "abab", into.String())
			assert.Equal(t, int64(4), c.w.N())
		})
	}
	var discard SlowWriter
	n, err := discard.Write([]byte("abc"))
	require.NoError(t, err)
	assert.Equal(t, 3, n, "nil W discards")
	assert.Equal(t, int64(3), discard.N())
}

func TestTarRoundTrip(t *testing.T) {
	t.Parallel()
	in := []Entry{
		Dir("d/", 0o750),
		File("d/f", "data", 0o600),
		Symlink("d/s", "f"),
		Link("d/h", "d/f"),
		File("../raw", "", 0o644),
		Dir("nodash", 0o755),
		{Header: tar.Header{Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3, Mode: 0o666}},
	}
	got, err := Untar(Tar(t, in...))
	require.NoError(t, err)
	require.Len(t, got, len(in))
	for i, e := range in {
		g := got[i]
		assert.Equal(t, []any{e.Typeflag, e.Name, e.Linkname, e.Mode, e.Size, e.Body, e.Devmajor, e.Devminor},
			[]any{g.Typeflag, g.Name, g.Linkname, g.Mode, g.Size, g.Body, g.Devmajor, g.Devminor}, e.Name)
	}
	assert.True(t, got[0].ModTime.Equal(time.Unix(1700000000, 0)), "the constructors' mtime")
	assert.Equal(t, []string{"d/", "d/f", "d/s", "d/h", "../raw", "nodash", "null"}, Names(got))
	assert.Equal(t, []string{"d/", "d/f", "d/s", "d/h", "../raw", "nodash/", "null"}, Paths(got))
	assert.Equal(t, []string{"d/ 5 750 0 ", "d/f 0 600 4 data", "d/s 2 644 0 f"}, Lines(got)[:3])
	assert.Equal(t, []string{"d=<dir>", "d/f=data", "d/s=", "d/h=", "../raw=", "nodash=<dir>", "null="}, Contents(got))

	empty, err := Untar(Tar(t))
	require.NoError(t, err)
	assert.Empty(t, empty)
}

func TestUntarCut(t *testing.T) {
	t.Parallel()
	b := Tar(t, File("a", "a", 0o644), File("big", strings.Repeat("x", 2000), 0o644))
	got, err := Untar(b[:1024+512+700])
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF)
	require.Len(t, got, 2, "what was read, the cut entry too")
	assert.Equal(t, "a", got[0].Body)
	assert.Len(t, got[1].Body, 700)

	_, err = Untar([]byte("not a tar archive, long enough to be read as a header block" + strings.Repeat(".", 512)))
	assert.Error(t, err)
}

func TestTarFailsT(t *testing.T) {
	t.Parallel()
	ft := &fakeT{TB: t}
	func() {
		defer func() { _ = recover() }()
		Tar(ft, Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: "f", Size: 3}, Body: "x"})
	}()
	assert.True(t, ft.failed, "a Body shorter than Size fails t")
}

// fakeT records Fatal instead of ending the test.
type fakeT struct {
	testing.TB
	failed  bool
	skipped bool
	msg     string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed, f.msg = true, fmt.Sprintf(format, args...)
	panic(f)
}
func (f *fakeT) Fatal(args ...any) { f.failed, f.msg = true, fmt.Sprint(args...); panic(f) }
func (f *fakeT) Skip(args ...any)  { f.skipped, f.msg = true, fmt.Sprint(args...); panic(f) }

// The gate reads the environment: not parallel.
func TestSkipOrFail(t *testing.T) {
	const env = "PODVM_TESTKIT_REQUIRE"
	for _, c := range []struct {
		ci, req, gate string
		fail          bool
		msg           string
	}{
		{"", "", env, false, "why"},
		{"true", "", env, true, "why; failing because CI=true or PODVM_TESTKIT_REQUIRE=1"},
		{"", "1", env, true, "why; failing because CI=true or PODVM_TESTKIT_REQUIRE=1"},
		{"false", "yes", env, false, "why"},
		{"true", "", "", true, "why; failing because CI=true"},
		{"", "1", "", false, "why"},
	} {
		t.Setenv("CI", c.ci)
		t.Setenv(env, c.req)
		assert.Equal(t, c.fail, Required(c.gate), "CI=%q %s=%q gate %q", c.ci, env, c.req, c.gate)
		ft := &fakeT{TB: t}
		func() {
			defer func() { _ = recover() }()
			SkipOrFail(ft, c.gate, "why")
		}()
		assert.Equal(t, c.fail, ft.failed, "CI=%q %s=%q gate %q: failed", c.ci, env, c.req, c.gate)
		assert.Equal(t, !c.fail, ft.skipped, "CI=%q %s=%q gate %q: skipped", c.ci, env, c.req, c.gate)
		assert.Equal(t, c.msg, ft.msg)
	}
}

func TestUpperEcho(t *testing.T) {
	t.Parallel()
	a, b := net.Pipe()
	go UpperEcho(b)
	_, err := io.WriteString(a, "abc\n")
	require.NoError(t, err)
	got, err := bufio.NewReader(a).ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "ABC\n", got)
	a.Close()
}

func TestFreed(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	c, err := net.Dial("tcp", addr) // a connection on the port outlives its listener
	require.NoError(t, err)
	defer c.Close()
	s, err := l.Accept()
	require.NoError(t, err)
	defer s.Close()
	assert.False(t, Freed(addr, 100*time.Millisecond), "a listener holds the port")
	go func() {
		time.Sleep(200 * time.Millisecond)
		l.Close()
	}()
	assert.True(t, Freed(addr, 5*time.Second), "the listener closed while Freed waited")
	assert.True(t, Freed(addr, 0), "and the port is free again after Freed took it")
}

func TestAlive(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc")
	}
	assert.True(t, Alive(os.Getpid()))
	assert.Contains(t, Describe(os.Getpid()), "testkit.test")

	cmd := osexec.Command("sleep", "100")
	require.NoError(t, cmd.Start())
	assert.True(t, Alive(cmd.Process.Pid))
	require.NoError(t, cmd.Process.Kill())
	// Killed, not yet reaped: still exiting, then a zombie; dead either way.
	require.Eventually(t, func() bool { return strings.Contains(Describe(cmd.Process.Pid), "state Z") }, 10*time.Second, time.Millisecond)
	assert.False(t, Alive(cmd.Process.Pid))
	_ = cmd.Wait()
	assert.False(t, Alive(cmd.Process.Pid))
	assert.Contains(t, Describe(cmd.Process.Pid), "gone")
}

func TestParseStat(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		line  string
		state string
		flags uint64
		alive bool
	}{
		{"42 (sleep) S 1 42 42 0 -1 4194560 90 0 0 0", "S", 0x400100, true},
		// PF_EXITING: killed, gone from its cgroup, not yet a zombie.
		{"42 (a) b (c) R 1 42 42 0 -1 4194564 90 0 0 0", "R", 0x400104, false},
		{"42 (sleep) Z 1 42 42 0 -1 4227084 90 0 0 0", "Z", 0x40800c, false},
		{"42 (sleep) X 1 42 42 0 -1 4194560 90 0 0 0", "X", 0x400100, false},
	} {
		state, flags, ok := parseStat(c.line)
		require.True(t, ok, c.line)
		assert.Equal(t, c.state, state, c.line)
		assert.Equal(t, c.flags, flags, c.line)
		assert.Equal(t, c.alive, running(state, flags), c.line)
	}
	_, _, ok := parseStat("42 (sleep) S 1")
	assert.False(t, ok, "a cut line")
}
