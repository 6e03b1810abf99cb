package kube

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"k8s.io/client-go/tools/remotecommand"

	corev1 "k8s.io/api/core/v1"

	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/marks"
	"github.com/podvm/podvm/internal/testkit"
)

// The copies' script: an archive then the marks, a missing path said by
// its word, an extraction's status after the archive.
func TestTarScriptMarks(t *testing.T) {
	const mark = "podvm-tar-feed:"
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f"), []byte("data"), 0o644))
	run := func(t *testing.T, shell []string, op, p string, stdin []byte) (string, string, int) {
		cmd := osexec.Command(shell[0], append(shell[1:], "-c", tarScript, "podvm-tar", op, octal(p))...)
		head := mark + "\n"
		if op == "in" {
			head += checkLines(nil)
		}
		cmd.Stdin = io.MultiReader(strings.NewReader(head), bytes.NewReader(stdin))
		var out, errs testkit.LockedBuffer
		cmd.Stdout, cmd.Stderr = &out, &errs
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*osexec.ExitError); ok {
			code = ee.ExitCode()
		}
		return out.String(), errs.String(), code
	}
	for _, shell := range testkit.Shells(t) {
		t.Run(shell[len(shell)-1], func(t *testing.T) {
			out, errs, code := run(t, shell, "out", filepath.Join(dir, "f"), nil)
			require.Equal(t, 0, code, errs) // cat's: tar's status is in the mark
			assert.Equal(t, mark+" exited 0\n", errs)
			archive, ok := strings.CutSuffix(out, mark+" end\n")
			require.True(t, ok, "no end mark after the archive")
			h, err := tar.NewReader(strings.NewReader(archive)).Next()
			require.NoError(t, err)
			assert.Equal(t, "f", h.Name)

			out, errs, code = run(t, shell, "out", filepath.Join(dir, "missing"), nil)
			assert.Equal(t, 0, code)
			assert.Equal(t, mark+" end\n", out)
			assert.Equal(t, mark+" missing\n", errs)

			into := t.TempDir()
			_, errs, code = run(t, shell, "in", into, []byte(archive))
			assert.Equal(t, 0, code, errs)
			assert.Equal(t, mark+" exited 0\n", errs)
			got, err := os.ReadFile(filepath.Join(into, "f"))
			require.NoError(t, err)
			assert.Equal(t, "data", string(got))

			_, errs, code = run(t, shell, "in", into, []byte("not a tar archive, long enough to be read as a header block"))
			assert.Equal(t, 0, code)
			assert.Contains(t, errs, mark+" exited ")
			assert.NotContains(t, errs, mark+" exited 0")
		})
	}
}

// fakeSession reads the mark from its stdin, writes out and the marks,
// then stays until cut, as a session whose command left a child holding
// its output does.
type fakeSession struct{ out string }

func (f fakeSession) Stream(remotecommand.StreamOptions) error { panic("not used") }

func (f fakeSession) StreamWithContext(ctx context.Context, so remotecommand.StreamOptions) error {
	mark, err := bufio.NewReader(so.Stdin).ReadString('\n')
	if err != nil {
		return err
	}
	mark = strings.TrimSuffix(mark, "\n")
	fmt.Fprintf(so.Stdout, "%s%s end\n", f.out, mark)
	fmt.Fprintf(so.Stderr, "%s exited 4\n", mark)
	<-ctx.Done()
	return ctx.Err()
}

// Once both marks are in, a session that does not end is cut after
// markGrace, and the marks' result stands.
func TestMarkedGrace(t *testing.T) {
	defer func(g time.Duration) { markGrace = g }(markGrace)
	markGrace = 100 * time.Millisecond
	var out bytes.Buffer
	s := marks.New("podvm-test-", nil, &out, io.Discard)
	start := time.Now()
	_ = streamMarked(context.Background(), s, fakeSession{out: "data"}, nil)
	assert.Less(t, time.Since(start), 5*time.Second)
	code, why, complete := s.Result()
	assert.True(t, complete)
	assert.Equal(t, "", why)
	assert.Equal(t, 4, code)
	assert.Equal(t, "data", out.String())
}

// No name the scripts are given is read as an option: a file named
// "-dash", "--", "-" alone, a directory or a command beginning with "-".
func TestScriptsTakeNoNameAsOption(t *testing.T) {
	const mark = "podvm-tar-feed:"
	dir := t.TempDir()
	names := []string{"-dash", "--", "-", "-rf"}
	for _, n := range names {
		require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte("data "+n), 0o644))
	}
	require.NoError(t, os.Mkdir(filepath.Join(dir, "-d"), 0o755))
	prog := filepath.Join(dir, "-d", "-prog")
	require.NoError(t, os.WriteFile(prog, []byte("#!/bin/sh\necho \"prog $*\"\n"), 0o755))
	for _, shell := range testkit.Shells(t) {
		t.Run(shell[len(shell)-1], func(t *testing.T) {
			for _, n := range names {
				cmd := osexec.Command(shell[0], append(shell[1:], "-c", tarScript, "podvm-tar", "out", octal(filepath.Join(dir, n)))...)
				cmd.Stdin = strings.NewReader(mark + "\n")
				var out, errs testkit.LockedBuffer
				cmd.Stdout, cmd.Stderr = &out, &errs
				require.NoError(t, cmd.Run())
				require.Equal(t, mark+" exited 0\n", errs.String(), "tar out %q", n)
				tr := tar.NewReader(strings.NewReader(out.String()))
				h, err := tr.Next()
				require.NoError(t, err)
				assert.Equal(t, n, h.Name)
				got, _ := io.ReadAll(tr)
				assert.Equal(t, "data "+n, string(got))
			}
			for _, c := range []struct {
				name, dir string
				argv      []string
				out       string
			}{
				{"a dir -d", "-d", []string{"sh", "-c", "pwd"}, filepath.Join(dir, "-d") + "\n"},
				{"a dir -", "-", []string{"sh", "-c", "pwd"}, dir + "\n"},
				{"a command -prog in PATH", "", []string{"-prog", "-x"}, "prog -x\n"},
				{"a command -d/-prog", "", []string{"-d/-prog", "--"}, "prog --\n"},
			} {
				args := []string{"-c", marks.ExecScript, "podvm-exec", c.dir, "1", "", "PATH=" + filepath.Join(dir, "-d") + ":/usr/bin:/bin"}
				cmd := osexec.Command(shell[0], append(shell[1:], append(args, c.argv...)...)...)
				cmd.Dir = dir
				if c.dir == "-" { // "-" is a file here: make it a directory
					cmd.Dir = filepath.Join(dir, "-d")
					c.out = filepath.Join(dir, "-d", "-") + "\n"
					require.NoError(t, os.MkdirAll(filepath.Join(cmd.Dir, "-"), 0o755))
				}
				stdin, err := cmd.StdinPipe()
				require.NoError(t, err)
				var out, errs testkit.LockedBuffer
				cmd.Stdout, cmd.Stderr = &out, &errs
				require.NoError(t, cmd.Start())
				_, _ = io.WriteString(stdin, "podvm-exec-feed:\n")
				deadline := time.Now().Add(10 * time.Second)
				for !strings.Contains(errs.String(), "podvm-exec-feed:") {
					require.True(t, time.Now().Before(deadline), "%s: no marks: %q %q", c.name, out.String(), errs.String())
					time.Sleep(5 * time.Millisecond)
				}
				stdin.Close()
				_ = cmd.Wait()
				assert.Equal(t, c.out+"podvm-exec-feed: end\n", out.String(), c.name)
				assert.Equal(t, "podvm-exec-feed: exited 0\n", errs.String(), c.name)
			}
		})
	}
}

// Extraction never goes through a symlink planted under its directory:
// an entry beneath one is refused before tar runs, said by the number of
// its check, and a directory entry replaces one in its place.
func TestTarScriptPlantedLinks(t *testing.T) {
	const mark = "podvm-tar-feed:"
	// archive holds directories dirs, then files holding "x".
	archive := func(dirs []string, files ...string) []byte {
		var entries []testkit.Entry
		for _, d := range dirs {
			entries = append(entries, testkit.Dir(d+"/", 0o755))
		}
		for _, f := range files {
			entries = append(entries, testkit.File(f, "x", 0o644))
		}
		return testkit.Tar(t, entries...)
	}
	for _, shell := range testkit.Shells(t) {
		t.Run(shell[len(shell)-1], func(t *testing.T) {
			top := t.TempDir()
			dst, out := filepath.Join(top, "dst"), filepath.Join(top, "out")
			require.NoError(t, os.MkdirAll(filepath.Join(dst, "new\nline"), 0o755))
			require.NoError(t, os.Mkdir(out, 0o755))
			for _, l := range []string{"abs", "rel", "-d", "new\nline/l"} {
				require.NoError(t, os.Symlink(out, filepath.Join(dst, l)))
			}
			for _, c := range []struct {
				name string
				tar  []byte
				word string
			}{
				{"beneath a link", archive(nil, "ok", "abs/x"), "unsafe 1"},
				{"deep beneath a link", archive([]string{"a"}, "a/b", "-d/x/y"), "unsafe 2"},
				{"beneath a link in a newline's directory", archive(nil, "new\nline/l/x"), "unsafe 2"},
				{"a hard link to a file beneath a link", testkit.Tar(t, testkit.Link("h", "abs/f")), "unsafe 1"},
				{"a directory in a link's place", archive([]string{"rel"}, "rel/y"), "exited 0"},
			} {
				checks, err := planted(bytes.NewReader(c.tar))
				require.NoError(t, err)
				cmd := osexec.Command(shell[0], append(shell[1:], "-c", tarScript, "podvm-tar", "in", octal(dst))...)
				cmd.Stdin = io.MultiReader(strings.NewReader(mark+"\n"+checkLines(checks)), bytes.NewReader(c.tar))
				var stdout, errs testkit.LockedBuffer
				cmd.Stdout, cmd.Stderr = &stdout, &errs
				require.NoError(t, cmd.Run(), c.name)
				assert.Equal(t, mark+" "+c.word+"\n", errs.String(), c.name)
				entries, err := os.ReadDir(out)
				require.NoError(t, err)
				assert.Empty(t, entries, "%s: written through a link", c.name)
			}
			fi, err := os.Lstat(filepath.Join(dst, "rel"))
			require.NoError(t, err)
			assert.True(t, fi.IsDir(), "the link in a directory entry's place stays")
			_, err = os.Stat(filepath.Join(dst, "rel", "y"))
			assert.NoError(t, err)
		})
	}
}

// stoppable writes early, then, once the command is stopped, what the
// command printed before it that was still on its way (late), and the
// marks of a killed command; it ends when cut or when its stdin ends.
type stoppable struct{ killed chan struct{} }

func (f stoppable) Stream(remotecommand.StreamOptions) error { panic("not used") }

func (f stoppable) StreamWithContext(ctx context.Context, so remotecommand.StreamOptions) error {
	r := bufio.NewReader(so.Stdin)
	mark, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	mark = strings.TrimSuffix(mark, "\n")
	fmt.Fprint(so.Stdout, "early ")
	select {
	case <-f.killed:
	case <-ctx.Done():
		return ctx.Err()
	}
	fmt.Fprintf(so.Stdout, "late%s end\n", mark)
	fmt.Fprintf(so.Stderr, "%s exited 137\n", mark)
	_, _ = io.Copy(io.Discard, r) // the hold, until the driver ends it
	return nil
}

// When ctx ends before the marks and the caller can stop the command,
// the session drains to its marks: what was on its way arrives. Without
// a stop, it is cut at once.
func TestMarkedStop(t *testing.T) {
	for _, c := range []struct {
		name    string
		stop    bool
		out     string
		stopped bool
	}{
		{"stop, then drain", true, "early late", true},
		{"no stop: cut", false, "early ", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := stoppable{killed: make(chan struct{})}
			var out testkit.LockedBuffer
			s := marks.New("podvm-test-", nil, &out, io.Discard)
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(100*time.Millisecond, cancel)
			var stop func()
			if c.stop {
				stop = func() { close(f.killed) }
			}
			start := time.Now()
			_ = streamMarked(ctx, s, f, stop)
			assert.Less(t, time.Since(start), stopDrain)
			assert.Equal(t, c.out, out.String())
			assert.Equal(t, c.stopped, s.Stopped())
		})
	}
}

// The gate writes dots until it reads its line, then execs the agent:
// every dot comes before the agent's first byte, on every shell.
func TestGate(t *testing.T) {
	t.Parallel()
	for _, shell := range testkit.Shells(t) {
		t.Run(shell[len(shell)-1], func(t *testing.T) {
			t.Parallel()
			cmd := osexec.Command(shell[0], append(shell[1:], "-c", gate, "/bin/echo", "agent")...)
			inR, inW := io.Pipe()
			cmd.Stdin = inR
			var out testkit.LockedBuffer
			cmd.Stdout = &out
			require.NoError(t, cmd.Start())
			require.Eventually(t, func() bool { return strings.Count(out.String(), ".") >= 2 }, 10*time.Second, 5*time.Millisecond, "dots while it waits")
			_, err := io.WriteString(inW, "\n")
			require.NoError(t, err)
			inW.Close() // os/exec's copy of stdin ends
			require.NoError(t, cmd.Wait())
			got := out.String()
			assert.Regexp(t, `^\.+agent\n$`, got)
			r := &dotless{r: strings.NewReader(got)}
			rest, err := io.ReadAll(r)
			require.NoError(t, err)
			assert.Equal(t, "agent\n", string(rest))
		})
	}
}

// dotless drops the leading dots whatever the reads' sizes, and nothing
// after.
func TestDotless(t *testing.T) {
	t.Parallel()
	for _, size := range []int{1, 2, 3, 64} {
		r := &dotless{r: iotest.OneByteReader(strings.NewReader("....\x01.x."))}
		if size > 1 {
			r = &dotless{r: strings.NewReader("....\x01.x.")}
		}
		var got []byte
		p := make([]byte, size)
		for {
			n, err := r.Read(p)
			got = append(got, p[:n]...)
			if err != nil {
				break
			}
		}
		assert.Equal(t, "\x01.x.", string(got), "reads of %d", size)
	}
}

// installGate reads the agent's tar stream from stdin to the byte,
// however the stream comes cut, installs it and execs it on the rest of
// stdin: with this machine's dd and tar, and with busybox's (as in a
// busybox image), on every shell.
func TestInstallGate(t *testing.T) {
	t.Parallel()
	agentScript := "#!/bin/sh\nprintf 'agent %s:' \"$1\"; exec cat\n"
	tarball := testkit.Tar(t, testkit.Dir(".podvm/", 0o755), testkit.File(".podvm/podvm-agent", agentScript, 0o755))
	require.Zero(t, len(tarball)%512)
	for _, tools := range toolsets(t) {
		for _, shell := range testkit.Shells(t) {
			t.Run(tools.name+"/"+shell[len(shell)-1], func(t *testing.T) {
				t.Parallel()
				root := t.TempDir()
				dir := filepath.Join(root, ".podvm")
				require.NoError(t, os.Mkdir(dir, 0o777))
				run := func(stdin string) (string, string, error) {
					cmd := osexec.Command(shell[0], append(shell[1:], "-c", installGate(dir, root), filepath.Join(dir, "podvm-agent"), "-x")...)
					cmd.Env = append(os.Environ(), "PATH="+tools.path)
					inR, inW := io.Pipe()
					cmd.Stdin = inR
					var out, errs testkit.LockedBuffer
					cmd.Stdout, cmd.Stderr = &out, &errs
					require.NoError(t, cmd.Start())
					require.Eventually(t, func() bool { return strings.Contains(out.String(), ".") }, 10*time.Second, 5*time.Millisecond, "dots while it waits")
					// In pieces of 100 bytes, a moment apart: reads of less
					// than a block, as an attach delivers them.
					go func() {
						for b := []byte(stdin); len(b) > 0; {
							n := min(100, len(b))
							if _, err := inW.Write(b[:n]); err != nil {
								return // it exited
							}
							b = b[n:]
							time.Sleep(time.Millisecond / 4)
						}
						inW.Close()
					}()
					err := cmd.Wait()
					inR.Close() // a write left unread fails
					rest, rerr := io.ReadAll(&dotless{r: strings.NewReader(out.String())})
					require.NoError(t, rerr)
					return string(rest), errs.String(), err
				}
				got, stderr, err := run(fmt.Sprintf("%d\n", len(tarball)) + string(tarball) + "the channel\x00\xff")
				require.NoError(t, err, stderr)
				assert.Equal(t, "agent -x:the channel\x00\xff", got, "the agent gets stdin from the byte after the tar stream")
				b, err := os.ReadFile(filepath.Join(dir, "podvm-agent"))
				require.NoError(t, err)
				assert.Equal(t, agentScript, string(b))
				_, err = os.Stat(filepath.Join(dir, "agent.tar"))
				assert.ErrorIs(t, err, os.ErrNotExist, "the tar stream is removed once extracted")

				// A line that is no size, and a stream that ends short:
				// it exits, saying why, and runs nothing.
				for _, c := range []struct{ stdin, says string }{
					{"\n", "no size on stdin"},
					{"12x\n", "no size on stdin"},
					{"0512\n", "no size on stdin"},
					{"700\n" + string(tarball[:700]), "a size of 700 bytes is not whole tar blocks"},
					{fmt.Sprintf("%d\n", len(tarball)) + string(tarball[:len(tarball)-700]), "stdin ended before its"},
				} {
					got, stderr, err := run(c.stdin)
					assert.Error(t, err)
					assert.Contains(t, stderr, "podvm: installing the agent: "+c.says)
					assert.Empty(t, got)
				}
			})
		}
	}
}

// An image without dd (or tar): installGate says which it lacks, in
// the words missingProgram looks for, and runs nothing. (busybox sh may
// run its own applets whatever PATH says: dash and bash.)
func TestInstallGateLacking(t *testing.T) {
	t.Parallel()
	for _, sh := range []string{"dash", "bash"} {
		shell, err := osexec.LookPath(sh)
		if err != nil {
			continue
		}
		for _, lacking := range []string{"dd", "tar"} {
			t.Run(sh+"/"+lacking, func(t *testing.T) {
				t.Parallel()
				bin := t.TempDir()
				for _, tool := range []string{"dd", "tar", "wc", "rm", "sleep", "cat", "printf", "kill"} {
					if tool == lacking {
						continue
					}
					if p, err := osexec.LookPath(tool); err == nil {
						require.NoError(t, os.Symlink(p, filepath.Join(bin, tool)))
					}
				}
				dir := t.TempDir()
				cmd := osexec.Command(shell, "-c", installGate(dir, dir), "/bin/echo", "agent")
				cmd.Env = []string{"PATH=" + bin}
				cmd.Stdin = strings.NewReader("512\n" + strings.Repeat("\x00", 512))
				var out, errs testkit.LockedBuffer
				cmd.Stdout, cmd.Stderr = &out, &errs
				err := cmd.Run()
				assert.Error(t, err)
				assert.Contains(t, errs.String(), "podvm: the image lacks "+lacking)
				assert.NotContains(t, out.String(), "agent")
				st := corev1.ContainerStatus{Name: Main, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 127, Message: errs.String()}}}
				assert.ErrorIs(t, missingProgram("p", st), driver.ErrNotSupported)
			})
		}
	}
}

// toolsets are the dd and tar that installGate can meet: this machine's,
// and busybox's where busybox is here, each as a PATH.
func toolsets(t *testing.T) []struct{ name, path string } {
	sets := []struct{ name, path string }{{"host", os.Getenv("PATH")}}
	bb, err := osexec.LookPath("busybox")
	if err != nil {
		t.Log("no busybox here: installGate is tried with this machine's dd and tar alone")
		return sets
	}
	bin := t.TempDir()
	for _, tool := range []string{"dd", "tar", "wc", "rm", "sleep", "cat", "printf"} {
		require.NoError(t, os.Symlink(bb, filepath.Join(bin, tool)))
	}
	return append(sets, struct{ name, path string }{"busybox", bin + ":" + os.Getenv("PATH")})
}
