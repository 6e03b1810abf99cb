package kube

import (
	"archive/tar"
	"bytes"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The scripts run on this machine's sh as they would in a pod: the
// command's output first, then the marks, and the script holds on until
// its stdin ends.
func TestExecScriptMarks(t *testing.T) {
	const mark = "podvm-exec-feed:"
	for _, c := range []struct {
		name       string
		dir        string
		env, argv  []string
		out, err   string
		word       string
		exitStatus int
	}{
		{name: "status", argv: []string{"sh", "-c", `echo out; echo err >&2; exit 3`}, out: "out\n", err: "err\n", word: "exited 3", exitStatus: 3},
		{name: "env and dir", dir: "/", env: []string{"A=b c"}, argv: []string{"sh", "-c", `printf '%s %s' "$A" "$PWD"`}, out: "b c /", word: "exited 0"},
		{name: "killed, quietly", argv: []string{"sh", "-c", `kill -9 $$`}, word: "exited 137", exitStatus: 137},
		{name: "not found", argv: []string{"no-such-command"}, word: "notfound", exitStatus: 127},
		{name: "no dir", dir: "/no/such", argv: []string{"true"}, word: "dir", exitStatus: 127},
		{name: "not executable", argv: []string{"/etc/passwd"}, word: "perm", exitStatus: 127},
	} {
		for _, shell := range shells(t) {
			t.Run(shell[len(shell)-1]+"/"+c.name, func(t *testing.T) {
				args := append([]string{"-c", execScript, "podvm-exec", mark[:5], mark[5:], c.dir, strconv.Itoa(len(c.env)), ""}, c.env...)
				args = append(args, c.argv...)
				cmd := osexec.Command(shell[0], append(shell[1:], args...)...)
				in, err := cmd.StdinPipe()
				require.NoError(t, err)
				var out, errs lockedBuffer
				cmd.Stdout, cmd.Stderr = &out, &errs
				require.NoError(t, cmd.Start())
				done := make(chan error, 1)
				go func() { done <- cmd.Wait() }()
				deadline := time.Now().Add(10 * time.Second)
				for !strings.Contains(errs.String(), mark) || !strings.Contains(out.String(), mark) {
					require.True(t, time.Now().Before(deadline), "no marks: %q %q", out.String(), errs.String())
					time.Sleep(5 * time.Millisecond)
				}
				select {
				case <-done:
					t.Fatal("the script ended before its stdin did")
				case <-time.After(100 * time.Millisecond):
				}
				in.Close()
				err = <-done
				code := 0
				if ee, ok := err.(*osexec.ExitError); ok {
					code = ee.ExitCode()
				}
				assert.Equal(t, c.exitStatus, code)
				assert.Equal(t, c.out+mark+" end\n", out.String())
				assert.Equal(t, c.err+mark+" "+c.word+"\n", errs.String())
			})
		}
	}
}

// shells are the POSIX shells of this machine the scripts must run on:
// images have busybox's ash, dash or bash as /bin/sh.
func shells(t *testing.T) [][]string {
	var found [][]string
	for _, sh := range [][]string{{"dash"}, {"bash"}, {"busybox", "sh"}} {
		if p, err := osexec.LookPath(sh[0]); err == nil {
			found = append(found, append([]string{p}, sh[1:]...))
		}
	}
	require.NotEmpty(t, found)
	return found
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// The copies' script: an archive then the marks, a missing path said by
// its word, an extraction's status after the archive.
func TestTarScriptMarks(t *testing.T) {
	const mark = "podvm-tar-feed:"
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f"), []byte("data"), 0o644))
	run := func(t *testing.T, shell []string, op, p string, stdin []byte) (string, string, int) {
		cmd := osexec.Command(shell[0], append(shell[1:], "-c", tarScript, "podvm-tar", mark[:4], mark[4:], op, octal(p))...)
		cmd.Stdin = bytes.NewReader(stdin)
		var out, errs lockedBuffer
		cmd.Stdout, cmd.Stderr = &out, &errs
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*osexec.ExitError); ok {
			code = ee.ExitCode()
		}
		return out.String(), errs.String(), code
	}
	for _, shell := range shells(t) {
		t.Run(shell[len(shell)-1], func(t *testing.T) {
			out, errs, code := run(t, shell, "out", filepath.Join(dir, "f"), nil)
			require.Equal(t, 0, code, errs)
			assert.Equal(t, mark+" exited 0\n", errs)
			archive, ok := strings.CutSuffix(out, mark+" end\n")
			require.True(t, ok, "no end mark after the archive")
			h, err := tar.NewReader(strings.NewReader(archive)).Next()
			require.NoError(t, err)
			assert.Equal(t, "f", h.Name)

			out, errs, code = run(t, shell, "out", filepath.Join(dir, "missing"), nil)
			assert.Equal(t, 2, code)
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
			assert.NotEqual(t, 0, code)
			assert.Contains(t, errs, mark+" exited ")
		})
	}
}
