package marks

import (
	"io"
	"os"
	osexec "os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/testkit"
)

// The scripts run on this machine's sh as they would in a sandbox: the mark
// is the first line of stdin, the command's output comes first, then the
// marks, and the script holds on until its stdin ends, ending 0 whatever
// the command's status (which is in the mark).
func TestExecScriptMarks(t *testing.T) {
	const mark = "podvm-exec-feed:"
	for _, c := range []struct {
		name      string
		dir       string
		env, argv []string
		stdin     string // the command's: the script's hold then ends with it
		path      string // the session's PATH, when not this process's
		out, err  string
		words     []string
	}{
		{name: "status", argv: []string{"sh", "-c", `echo out; echo err >&2; exit 3`}, out: "out\n", err: "err\n", words: []string{"exited 3"}},
		{name: "env and dir", dir: "/", env: []string{"A=b c"}, argv: []string{"sh", "-c", `printf '%s %s' "$A" "$PWD"`}, out: "b c /", words: []string{"exited 0"}},
		{name: "env cannot touch the script", env: []string{"m=x", "n=9", "i=1", "d=/no", "s=1", "PATH=/nowhere", "IFS=x"}, argv: []string{"/bin/sh", "-c", `echo "$m$n$PATH"`},
			out: "x9/nowhere\n", words: []string{"exited 0"}},
		{name: "the path of the command's env", env: []string{"PATH=/nowhere"}, argv: []string{"sh"}, words: []string{"notfound", "exited 127"}},
		{name: "stdin", argv: []string{"cat"}, stdin: "hello\nworld", out: "hello\nworld", words: []string{"exited 0"}},
		{name: "killed, quietly", argv: []string{"sh", "-c", `kill -9 $$`}, words: []string{"exited 137"}},
		{name: "not found", argv: []string{"no-such-command"}, words: []string{"notfound", "exited 127"}},
		{name: "no dir", dir: "/no/such", argv: []string{"true"}, words: []string{"dir"}},
		{name: "not executable", argv: []string{"/etc/passwd"}, words: []string{"perm", "exited 127"}},
		{name: "a session's PATH that names no tool", path: "/nowhere", argv: []string{"/bin/sh", "-c", `echo "$PATH"`}, out: "/nowhere\n", words: []string{"exited 0"}},
	} {
		for _, shell := range testkit.Shells(t) {
			t.Run(shell[len(shell)-1]+"/"+c.name, func(t *testing.T) {
				args := Args(c.dir, c.env, c.stdin != "", c.argv)
				cmd := osexec.Command(shell[0], append(shell[1:], args...)...)
				if c.path != "" {
					cmd.Env = append(os.Environ(), "PATH="+c.path)
				}
				stdin, err := cmd.StdinPipe()
				require.NoError(t, err)
				var out, errs testkit.LockedBuffer
				outPipe, err := cmd.StdoutPipe()
				require.NoError(t, err)
				errPipe, err := cmd.StderrPipe()
				require.NoError(t, err)
				require.NoError(t, cmd.Start())
				// The output pipes' ends: the hold is theirs (containerd
				// drops what is in flight once they close).
				var eof sync.WaitGroup
				var closed atomic.Int32
				for _, c := range []struct {
					r io.Reader
					w *testkit.LockedBuffer
				}{{outPipe, &out}, {errPipe, &errs}} {
					eof.Add(1)
					go func() {
						defer eof.Done()
						_, _ = io.Copy(c.w, c.r)
						closed.Add(1)
					}()
				}
				done := make(chan error, 1)
				go func() { eof.Wait(); done <- cmd.Wait() }()
				_, err = io.WriteString(stdin, mark+"\n"+c.stdin)
				require.NoError(t, err)
				if c.stdin != "" {
					stdin.Close() // the command's stdin ends, and the hold with it
				}
				deadline := time.Now().Add(10 * time.Second)
				for !strings.Contains(errs.String(), mark) || !strings.Contains(out.String(), mark) {
					require.True(t, time.Now().Before(deadline), "no marks: %q %q", out.String(), errs.String())
					time.Sleep(5 * time.Millisecond)
				}
				if c.stdin == "" {
					select {
					case <-done:
						t.Fatal("the script ended before its stdin did")
					case <-time.After(100 * time.Millisecond):
					}
					assert.Zero(t, closed.Load(), "an output pipe closed before the script's stdin did")
					stdin.Close()
				}
				require.NoError(t, <-done, "the script's own status is cat's")
				assert.Equal(t, c.out+mark+" end\n", out.String())
				want := c.err
				for _, w := range c.words {
					want += mark + " " + w + "\n"
				}
				assert.Equal(t, want, errs.String())
			})
		}
	}
}

// The names the exec path refuses, before any session.
func TestUnsettable(t *testing.T) {
	for name, ok := range map[string]bool{
		"A": true, "_x9": true, "PATH": true, "m": true,
		"": false, "9a": false, "A-B": false, "a.b": false, "é": false,
		"podvm_m": false, "UID": false, "PPID": false, "SHELLOPTS": false,
	} {
		assert.Equal(t, ok, Unsettable(name) == "", "%q: %s", name, Unsettable(name))
	}
}

// The scripts' streams: their mark lines are taken out and their words
// reported, anything else passes unchanged, however it is split, and a
// failing writer does not hide a mark behind it.
func TestMarkFilter(t *testing.T) {
	const mark = "podvm-exec-0123:"
	for _, c := range []struct {
		writes []string
		out    string
		words  []string
	}{
		{writes: []string{mark + " notfound\n"}, words: []string{"notfound"}},
		{writes: []string{"podvm", "-exec-0123: d", "ir\n"}, words: []string{"dir"}},
		{writes: []string{"hello\n"}, out: "hello\n"},
		{writes: []string{"pod", "x"}, out: "podx"},
		{writes: []string{"out" + mark + " end\n"}, out: "out", words: []string{"end"}},
		{writes: []string{"err\n" + mark + " exited 3\n"}, out: "err\n", words: []string{"exited 3"}},
		{writes: []string{"err\npodvm-ex", "ec-0123: exi", "ted 0\nlate"}, out: "err\nlate", words: []string{"exited 0"}},
		{writes: []string{mark}, out: mark},
		{writes: []string{"podvm-exec-99"}, out: "podvm-exec-99"},
		{writes: nil},
	} {
		var b strings.Builder
		var words []string
		f := &filter{mark: mark, w: &b, line: func(w string) { words = append(words, w) }}
		for _, w := range c.writes {
			_, _ = f.Write([]byte(w))
		}
		f.shut()
		_, _ = f.Write([]byte("after shut"))
		assert.Equal(t, c.out, b.String(), "%q", c.writes)
		assert.Equal(t, c.words, words, "%q", c.writes)
	}
	var words []string
	f := &filter{mark: mark, w: testkit.FailingWriter{Err: io.ErrClosedPipe}, line: func(w string) { words = append(words, w) }}
	n, err := f.Write([]byte("data"))
	assert.Equal(t, 4, n)
	assert.NoError(t, err, "the filter must keep reading for the marks")
	_, _ = f.Write([]byte("more " + mark + " end\n"))
	assert.Equal(t, []string{"end"}, words)
	assert.ErrorIs(t, f.err, io.ErrClosedPipe)
}

// Once one mark is in, a session whose output stands still MarkWait
// without the other is ended (its stdin), incomplete; output still
// moving holds that off.
func TestMarkWait(t *testing.T) {
	defer func(w time.Duration) { MarkWait = w }(MarkWait)
	MarkWait = 100 * time.Millisecond
	s := New("podvm-test-", nil, io.Discard, io.Discard)
	defer s.Stop()
	ended := make(chan time.Time, 1)
	go func() {
		_, _ = io.Copy(io.Discard, s.Stdin())
		ended <- time.Now()
	}()
	_, _ = io.WriteString(s.Stderr(), s.errs.mark+" exited 0\n")
	moving := time.Now().Add(400 * time.Millisecond)
	for time.Now().Before(moving) {
		_, _ = io.WriteString(s.Stdout(), "more output\n")
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case at := <-ended:
		t.Fatalf("ended %v before the output stood still", moving.Sub(at))
	default:
	}
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("a session short of its second mark was never ended")
	}
	_, _, complete := s.Result()
	assert.False(t, complete)
}

// A caller's writer that blocks is not a stalled stream: while a Write
// is in flight past MarkWait, the session is not ended.
func TestMarkWaitSlowWriter(t *testing.T) {
	defer func(w time.Duration) { MarkWait = w }(MarkWait)
	MarkWait = 50 * time.Millisecond
	w := blockingWriter{started: make(chan struct{}, 1), release: make(chan struct{})}
	s := New("podvm-test-", nil, w, io.Discard)
	defer s.Stop()
	var once sync.Once
	free := func() { once.Do(func() { close(w.release) }) }
	defer free() // before Stop, which waits for the Write
	ended := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, s.Stdin())
		close(ended)
	}()
	wrote := make(chan struct{})
	go func() {
		_, _ = io.WriteString(s.Stdout(), "output, then "+s.out.mark+" end\n")
		close(wrote)
	}()
	<-w.started
	_, _ = io.WriteString(s.Stderr(), s.errs.mark+" exited 0\n")
	select {
	case <-ended:
		t.Fatal("ended while the caller's writer held the output")
	case <-time.After(10 * MarkWait):
	}
	free()
	<-wrote
	<-ended
	_, _, complete := s.Result()
	assert.True(t, complete)
}

// blockingWriter's Writes say they started, then wait until release is
// closed.
type blockingWriter struct{ started, release chan struct{} }

func (w blockingWriter) Write(p []byte) (int, error) {
	select {
	case w.started <- struct{}{}:
	default:
	}
	<-w.release
	return len(p), nil
}
