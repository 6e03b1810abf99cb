package vmtest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/podvm/podvm/internal/testkit"
	"github.com/podvm/podvm/vm"
)

// escapeCases are the cases of what code in the sandbox can plant for
// the file calls: symlinks under a copy's destination, and sockets, which
// a tar stream cannot carry. Through podvm's agent ([Harness.Tracked])
// the copies refuse both, naming the entry (and a [LinkGuard] refuses
// the links); through Podman's copies the
// documented limits hold (a planted link is followed within the sandbox,
// a socket is left out), and the observations are compared across
// backends.
func escapeCases(h Harness) []testCase {
	return []testCase{
		{Name: "files/planted-link", Promise: "through the agent, a copy into a directory never follows a symlink that the sandbox planted under it out of it: the entry is refused with vm.ErrUnsafeArchive, and a planted link in an entry's place is replaced, never written through",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				g, ok := h.(LinkGuard)
				return filesPlantedLink(ctx, t, v, h.Tracked() || ok && g.GuardsPlantedLinks())
			}},
		{Name: "files/write-size", AcrossPaths: true, Promise: "WriteFileFrom fails with fs.ErrInvalid when the content holds fewer or more bytes than its size, even an endless one, and streams a content of unknown size whole",
			Test: filesWriteSize},
		{Name: "files/socket", Promise: "through the agent, a socket in a tree is reported, not dropped: CopyOut and CopyDirOut fail with vm.ErrUnsafeArchive naming it, ReadDir lists it as a socket",
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				return filesSocket(ctx, t, v, h.Tracked())
			}},
	}
}

// filesPlantedLink plants links under a copy's destination; agent says
// the copies must refuse them as the agent's do.
func filesPlantedLink(ctx context.Context, t *testing.T, v vm.VM, agent bool) []observation {
	res, err := v.Run(ctx, sh(`mkdir -p /tmp/pl/dst /tmp/pl/out && echo keep > /tmp/pl/out/f &&
		ln -s /tmp/pl/out /tmp/pl/dst/abs && ln -s ../out /tmp/pl/dst/rel && ln -s ../out/f /tmp/pl/dst/file`))
	want(t, res, err, "", "", 0)
	host := t.TempDir()
	if err := os.MkdirAll(filepath.Join(host, "rel"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(host, "rel", "y"), []byte("y"), 0o644); err != nil {
		t.Fatal(err)
	}
	var obs []observation
	// Entries beneath a planted link: refused.
	for _, c := range []struct {
		label string
		err   error
	}{
		{"CopyIn abs/x", v.CopyIn(ctx, "/tmp/pl/dst", bytes.NewReader(testkit.Tar(t, testkit.File("abs/x", "x", 0o644))))},
		{"CopyIn rel/x", v.CopyIn(ctx, "/tmp/pl/dst", bytes.NewReader(testkit.Tar(t, testkit.File("rel/x", "x", 0o644))))},
	} {
		obs = append(obs, observeFile(c.label, "", c.err))
		if agent && !errors.Is(c.err, vm.ErrUnsafeArchive) {
			t.Errorf("%s through a planted link out of the destination: %v; want an error matching vm.ErrUnsafeArchive", c.label, c.err)
		}
	}
	// Entries in a planted link's place, a directory and a file: the
	// link is replaced, as tar replaces it, never written through.
	for _, c := range []struct {
		label string
		err   error
	}{
		{"CopyDirIn rel/y", vm.CopyDirIn(ctx, v, host, "/tmp/pl/dst")},
		{"CopyIn file", v.CopyIn(ctx, "/tmp/pl/dst", bytes.NewReader(testkit.Tar(t, testkit.File("file", "new\n", 0o644))))},
	} {
		obs = append(obs, observeFile(c.label, "", c.err))
		if agent && c.err != nil { // Podman refuses a directory there
			t.Errorf("%s, in the place of a link the sandbox planted: %v", c.label, c.err)
		}
	}
	res, err, o := run(ctx, v, "what the copies left", sh(`cd /tmp/pl && ls out && cat out/f dst/file dst/rel/y`))
	obs = append(obs, o)
	if agent {
		want(t, res, err, "f\nkeep\nnew\ny", "", 0)
	}
	return obs
}

func filesSocket(ctx context.Context, t *testing.T, v vm.VM, agent bool) []observation {
	// busybox's syslogd binds the socket /dev/log; cp -a makes another.
	res, err := v.Run(ctx, sh(`syslogd -O /dev/null && sleep 0.2 && mkdir -p /tmp/so && cp -a /dev/log /tmp/so/sock && echo x > /tmp/so/f && test -S /tmp/so/sock`))
	if err != nil || res.ExitCode != 0 {
		t.Skipf("no socket can be made in this sandbox: %v %+v", err, res)
	}
	var obs []observation
	list, err := vm.ReadDir(ctx, v, "/tmp/so")
	obs = append(obs, observeFile("ReadDir", listDir(list), err))
	errOut := v.CopyOut(ctx, "/tmp/so", io.Discard)
	obs = append(obs, observeFile("CopyOut", "", errOut))
	errDir := vm.CopyDirOut(ctx, v, "/tmp/so", filepath.Join(t.TempDir(), "out"))
	obs = append(obs, observeFile("CopyDirOut", "", errDir))
	if !agent {
		return obs
	}
	if err != nil || len(list) != 2 || list[1].Name != "sock" || list[1].Mode.Type() != fs.ModeSocket {
		t.Errorf("ReadDir of a directory holding a socket: %v, %v; want f and sock, a socket", listDir(list), err)
	}
	for what, err := range map[string]error{"CopyOut": errOut, "CopyDirOut": errDir} {
		if !errors.Is(err, vm.ErrUnsafeArchive) || !strings.Contains(err.Error(), "sock") {
			t.Errorf("%s of a tree holding a socket: %v; want an error matching vm.ErrUnsafeArchive that names it", what, err)
		}
	}
	return obs
}

// endless reads 'z' forever.
type endless struct{}

func (endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'z'
	}
	return len(p), nil
}

func filesWriteSize(ctx context.Context, t *testing.T, v vm.VM) []observation {
	var obs []observation
	short := vm.WriteFileFrom(ctx, v, "/tmp/ws-short", strings.NewReader("abc"), 10, 0o644)
	obs = append(obs, observeFile("fewer bytes than the size", "", short))
	long := vm.WriteFileFrom(ctx, v, "/tmp/ws-long", endless{}, 10, 0o644)
	obs = append(obs, observeFile("an endless content", "", long))
	for what, err := range map[string]error{"fewer bytes than its size": short, "an endless content": long} {
		wantErr(t, "WriteFileFrom of "+what, err, fs.ErrInvalid)
	}
	const n = 3<<20 + 7
	err := vm.WriteFileFrom(ctx, v, "/tmp/ws-unknown", io.LimitReader(endless{}, n), -1, 0o600)
	obs = append(obs, observeFile("size -1", "", err))
	res, rerr, o := run(ctx, v, "its size", sh(`wc -c < /tmp/ws-unknown`))
	obs = append(obs, o)
	if err != nil {
		t.Errorf("WriteFileFrom of %d bytes of unknown size: %v", n, err)
	} else {
		want(t, res, rerr, "3145735\n", "", 0)
	}
	return obs
}
