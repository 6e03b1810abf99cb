package ckpt

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/testkit"
)

// entry is a file of a test archive.
type entry struct {
	name string
	body string
	dir  bool
}

// config and spec are a config.dump and a spec.dump as Podman 5.4 writes
// them, cut down, with a field podvm knows nothing of.
const (
	config = `{"id":"` + srcID + `","name":"src","rootfsImageName":"localhost/podvm-test:latest",` +
		`"labels":{"io.podvm.token":"t1"},"unknownToPodvm":{"kept":[1,2]}}`
	spec = `{"ociVersion":"1.0.0","mounts":[{"destination":"/proc","type":"proc","source":"proc"},` +
		`{"destination":"/.podvm/ch","type":"bind","source":"/run/podvm/ch-1","options":["ro"]}],"other":true}`
	srcID = "1111111111111111111111111111111111111111111111111111111111111111"
	newID = "2222222222222222222222222222222222222222222222222222222222222222"
)

// whole is an archive with every entry a restore needs, in Podman's
// order, and a page image that must pass through byte for byte.
var whole = []entry{
	{name: "checkpoint", dir: true},
	{name: "checkpoint/inventory.img", body: "inventory"},
	{name: "checkpoint/pages-1.img", body: strings.Repeat("\x00\x01pages", 2000)},
	{name: "checkpoint/" + strings.Repeat("a-long-name-", 12) + ".img", body: "an extended header before it"},
	{name: "config.dump", body: config},
	{name: "./spec.dump", body: spec},
	{name: "rootfs-diff.tar", body: "layer"},
}

func archive(t testing.TB, entries []entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		writeEntry(t, tw, e)
	}
	require.NoError(t, tw.Close())
	return b.Bytes()
}

// writeEntry writes e to tw.
func writeEntry(t testing.TB, tw *tar.Writer, e entry) {
	t.Helper()
	h := &tar.Header{Name: e.name, Mode: 0o600, Size: int64(len(e.body)), Typeflag: tar.TypeReg}
	if e.dir {
		h = &tar.Header{Name: e.name + "/", Mode: 0o700, Typeflag: tar.TypeDir}
	}
	require.NoError(t, tw.WriteHeader(h))
	_, err := tw.Write([]byte(e.body))
	require.NoError(t, err)
}

// entries reads an archive back: each entry's body by its name.
func entries(t *testing.T, b []byte) map[string]string {
	t.Helper()
	got := map[string]string{}
	for name, e := range read(t, b) {
		got[name] = e.body
	}
	return got
}

// read reads an archive back: each entry's header and body by its name.
func read(t *testing.T, b []byte) map[string]struct {
	h    *tar.Header
	body string
} {
	t.Helper()
	got := map[string]struct {
		h    *tar.Header
		body string
	}{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return got
		}
		require.NoError(t, err)
		body, err := io.ReadAll(tr)
		require.NoError(t, err)
		got[h.Name] = struct {
			h    *tar.Header
			body string
		}{h, string(body)}
	}
}

func TestInspect(t *testing.T) {
	t.Parallel()
	info, err := Inspect(bytes.NewReader(archive(t, whole)))
	require.NoError(t, err)
	assert.Equal(t, Info{ID: srcID, Name: "src", Image: "localhost/podvm-test:latest",
		Labels: map[string]string{"io.podvm.token": "t1"}}, info)
}

// A copy's identity goes into config.dump and spec.dump; everything else,
// fields podvm does not know included, is as it was.
func TestRewrite(t *testing.T) {
	t.Parallel()
	src := archive(t, whole)
	var out bytes.Buffer
	id := Identity{ID: newID, Name: "podvm-copy", Labels: map[string]string{"io.podvm.token": "t2", "a": "b"},
		Mounts: map[string]string{"/.podvm/ch": "/var/empty/ch"}}
	require.NoError(t, Rewrite(&out, bytes.NewReader(src), id))

	before, after := read(t, src), read(t, out.Bytes())
	require.Len(t, after, len(before), "entries")
	for name, e := range before {
		if name == "config.dump" || name == "./spec.dump" {
			continue
		}
		assert.Equal(t, e, after[name], "%s passes through, its header too", name)
	}
	assert.Equal(t, make([]byte, 2*blockSize), out.Bytes()[out.Len()-2*blockSize:], "the end of the archive")

	var c map[string]any
	require.NoError(t, json.Unmarshal([]byte(after["config.dump"].body), &c))
	assert.Equal(t, newID, c["id"])
	assert.Equal(t, "podvm-copy", c["name"])
	assert.Equal(t, map[string]any{"io.podvm.token": "t2", "a": "b"}, c["labels"])
	assert.Equal(t, map[string]any{"kept": []any{1.0, 2.0}}, c["unknownToPodvm"], "a field podvm does not know")
	assert.Equal(t, "localhost/podvm-test:latest", c["rootfsImageName"])

	var s struct {
		Mounts []struct{ Destination, Source string }
		Other  bool
	}
	require.NoError(t, json.Unmarshal([]byte(after["./spec.dump"].body), &s))
	assert.Equal(t, "proc", s.Mounts[0].Source, "a mount not named")
	assert.Equal(t, "/var/empty/ch", s.Mounts[1].Source, "the mount named")
	assert.True(t, s.Other)

	info, err := Inspect(bytes.NewReader(out.Bytes()))
	require.NoError(t, err, "the rewritten archive is whole")
	assert.Equal(t, newID, info.ID)
}

// Without mounts to change, spec.dump is left byte for byte.
func TestRewriteLeavesSpecWithoutMounts(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	require.NoError(t, Rewrite(&out, bytes.NewReader(archive(t, whole)), Identity{ID: newID, Name: "c"}))
	got := entries(t, out.Bytes())
	assert.Equal(t, spec, got["./spec.dump"])
	var c struct{ Labels map[string]string }
	require.NoError(t, json.Unmarshal([]byte(got["config.dump"]), &c))
	assert.Equal(t, map[string]string{}, c.Labels, "nil labels leave none of the source's")
}

func TestRefused(t *testing.T) {
	t.Parallel()
	without := func(name string) []entry {
		var es []entry
		for _, e := range whole {
			if e.name != name {
				es = append(es, e)
			}
		}
		return es
	}
	full := archive(t, whole)
	tests := []struct {
		name string
		tar  []byte
		id   Identity
		want string
	}{
		{name: "no inventory", tar: archive(t, without("checkpoint/inventory.img")), want: "no checkpoint/inventory.img"},
		{name: "no config.dump", tar: archive(t, without("config.dump")), want: "no config.dump"},
		{name: "no spec.dump", tar: archive(t, without("./spec.dump")), want: "no spec.dump"},
		{name: "cut inside an entry", tar: full[:3*blockSize+100], want: "invalid"},
		{name: "cut between entries", tar: full[:len(full)-2*blockSize], want: "cut short"},
		{name: "not a tar", tar: []byte(strings.Repeat("not a tar ", 100)), want: "invalid"},
		{name: "empty", tar: nil, want: "no end-of-archive"},
		{name: "config.dump twice", tar: archive(t, append(whole, entry{name: "config.dump", body: config})), want: "config.dump twice"},
		{name: "config.dump not JSON", tar: archive(t, append(without("config.dump"), entry{name: "config.dump", body: "{"})), want: "config.dump"},
		{name: "config.dump null", tar: archive(t, append(without("config.dump"), entry{name: "config.dump", body: "null"})), want: "config.dump is null"},
		{name: "config.dump of the wrong shape", tar: archive(t, append(without("config.dump"), entry{name: "config.dump", body: `{"rootfsImageName":1}`})), want: "config.dump"},
		{name: "bad ID", tar: full, id: Identity{ID: "abc", Name: "c"}, want: "64 lowercase hex"},
		{name: "bad name", tar: full, id: Identity{ID: newID, Name: "-c"}, want: "container name"},
		{name: "no such mount", tar: full, id: Identity{ID: newID, Name: "c", Mounts: map[string]string{"/nowhere": "/x"}}, want: "no mount at /nowhere"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			id := tt.id
			if id.ID == "" {
				id = Identity{ID: newID, Name: "c"}
			}
			err := Rewrite(io.Discard, bytes.NewReader(tt.tar), id)
			require.ErrorIs(t, err, ErrInvalid)
			assert.Contains(t, err.Error(), tt.want)
			if tt.id.ID == "" {
				_, err := Inspect(bytes.NewReader(tt.tar))
				require.ErrorIs(t, err, ErrInvalid, "Inspect refuses it too")
			}
		})
	}
}

// A reader's own failure is returned as it is, not as a bad archive: the
// caller tells a disk error from a damaged checkpoint.
func TestReadFailure(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	full := archive(t, whole)
	for name, at := range map[string]int64{"inside a body": 2*blockSize + 100, "at a header": 2 * blockSize} {
		r := &failingAt{Reader: bytes.NewReader(full), at: at, err: boom}
		err := Rewrite(io.Discard, r, Identity{ID: newID, Name: "c"})
		require.ErrorIs(t, err, boom, name)
		assert.NotErrorIs(t, err, ErrInvalid, name)
	}
}

// Entries with a size and no data (a hard link's header may say one)
// are read past, not taken for a cut archive.
func TestHeaderOnlyEntries(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range whole {
		require.NoError(t, tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o600, Size: int64(len(e.body)), Typeflag: tar.TypeReg}))
		_, err := tw.Write([]byte(e.body))
		require.NoError(t, err)
	}
	require.NoError(t, tw.WriteHeader(&tar.Header{Name: "link", Linkname: "config.dump", Typeflag: tar.TypeLink, Size: 5000}))
	require.NoError(t, tw.Close())
	_, err := Inspect(bytes.NewReader(b.Bytes()))
	require.NoError(t, err)
}

// failingAt reads as its Reader does up to offset at, then fails with
// err.
type failingAt struct {
	*bytes.Reader
	at  int64
	err error
}

func (f *failingAt) Read(p []byte) (int, error) {
	pos := f.Size() - int64(f.Len())
	if pos >= f.at {
		return 0, f.err
	}
	return f.Reader.Read(p[:min(int64(len(p)), f.at-pos)])
}

// What a plan writes is as long as it says, and a source cut short
// since it was planned ends the copy with an error, never a shorter
// archive that ends as a whole one would; from a file to a file it is
// the same archive.
func TestPlanCopy(t *testing.T) {
	t.Parallel()
	src := archive(t, whole)
	id := Identity{ID: newID, Name: "c"}
	p, err := PlanRewrite(bytes.NewReader(src), id)
	require.NoError(t, err)
	var out bytes.Buffer
	n, err := p.Copy(&out, bytes.NewReader(src))
	require.NoError(t, err)
	assert.Equal(t, p.Size(), n)
	assert.Equal(t, int64(out.Len()), n)

	for _, cut := range []int{len(src) / 2, len(src) - 3*blockSize} {
		_, err := p.Copy(io.Discard, bytes.NewReader(src[:cut]))
		require.ErrorIs(t, err, ErrInvalid, "cut at %d", cut)
		require.ErrorIs(t, err, io.ErrUnexpectedEOF, "cut at %d", cut)
	}

	dir := t.TempDir()
	in, err := os.Create(filepath.Join(dir, "src.tar"))
	require.NoError(t, err)
	defer in.Close()
	_, err = in.Write(append([]byte("not the archive"), src...))
	require.NoError(t, err)
	_, err = in.Seek(int64(len("not the archive")), io.SeekStart) // it starts where the file is
	require.NoError(t, err)
	dst, err := os.Create(filepath.Join(dir, "copy.tar"))
	require.NoError(t, err)
	defer dst.Close()
	require.NoError(t, Rewrite(dst, in, id))
	got, err := os.ReadFile(dst.Name())
	require.NoError(t, err)
	assert.Equal(t, out.Bytes(), got)
}

// Whatever the bytes, Rewrite and Inspect return an error or an archive
// that restores as the identity given, and never panic.
func FuzzRewrite(f *testing.F) {
	f.Add(archive(f, whole))
	f.Add(archive(f, whole)[:1500])
	f.Add([]byte{})
	for _, config := range []string{"null", `{"rootfsImageName":1}`, `[]`} {
		var es []entry
		for _, e := range whole {
			if e.name == "config.dump" {
				e.body = config
			}
			es = append(es, e)
		}
		f.Add(archive(f, es))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, ierr := Inspect(bytes.NewReader(b))
		var out bytes.Buffer
		err := Rewrite(&out, bytes.NewReader(b), Identity{ID: newID, Name: "c"})
		if (err == nil) != (ierr == nil) {
			t.Fatalf("Inspect: %v, Rewrite: %v", ierr, err)
		}
		if err != nil {
			return
		}
		info, err := Inspect(bytes.NewReader(out.Bytes()))
		if err != nil {
			t.Fatalf("the rewritten archive: %v", err)
		}
		p, err := PlanRewrite(bytes.NewReader(b), Identity{ID: newID, Name: "c"})
		if err != nil {
			t.Fatalf("Rewrite took it, PlanRewrite did not: %v", err)
		}
		if p.Size() != int64(out.Len()) {
			t.Fatalf("planned %d bytes, wrote %d", p.Size(), out.Len())
		}
		if info.ID != newID || info.Name != "c" {
			t.Fatalf("rewritten as %+v", info)
		}
	})
}

// Inspect of a file seeks past the bodies it does not need (CRIU's
// pages, the layer), and still tells one cut short.
func TestInspectSeeksPastBodies(t *testing.T) {
	t.Parallel()
	pages := strings.Repeat("p", 8<<20)
	a := archive(t, append(slices.Clone(whole), entry{name: "checkpoint/pages-2.img", body: pages}, entry{name: "rootfs-diff-2.tar", body: "x"}))
	r := &readCounter{ReadSeeker: bytes.NewReader(a)}
	_, err := Inspect(r)
	require.NoError(t, err)
	assert.Less(t, r.n, int64(1<<20), "the pages were read, not skipped")

	cut := a[:len(a)-len(pages)/2]
	_, err = Inspect(&readCounter{ReadSeeker: bytes.NewReader(cut)})
	require.ErrorIs(t, err, ErrInvalid)
	assert.ErrorContains(t, err, "pages-2.img cut short")
}

// readCounter counts the bytes read through it.
type readCounter struct {
	io.ReadSeeker
	n int64
}

func (r *readCounter) Read(p []byte) (int, error) {
	n, err := r.ReadSeeker.Read(p)
	r.n += int64(n)
	return n, err
}

// An archive cut just after a long name's own header (PAX or GNU), before
// the entry it names, is cut short: that header is no end of archive.
func TestCutAfterLongNameHeader(t *testing.T) {
	t.Parallel()
	long := "checkpoint/" + strings.Repeat("n", 200) + ".img"
	for _, format := range []tar.Format{tar.FormatPAX, tar.FormatGNU} {
		a := archive(t, append(slices.Clone(whole), entry{name: long, body: "x"}))
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		tr := tar.NewReader(bytes.NewReader(a))
		var at int // where the long entry's first header begins
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			require.NoError(t, err)
			require.NoError(t, tw.Flush())
			if h.Name == long {
				at = b.Len()
			}
			h.Format, h.PAXRecords = format, nil
			if h.Name != long {
				h.Format = tar.FormatUnknown
			}
			require.NoError(t, tw.WriteHeader(h))
			_, err = io.Copy(tw, tr)
			require.NoError(t, err)
		}
		require.NoError(t, tw.Close())
		for cut := at + blockSize; cut < at+4*blockSize && cut < b.Len(); cut += blockSize {
			for _, r := range []io.Reader{bytes.NewReader(b.Bytes()[:cut]), io.LimitReader(bytes.NewReader(b.Bytes()), int64(cut))} {
				_, err := Inspect(r)
				require.ErrorIs(t, err, ErrInvalid, "%v cut at %d (the entry at %d)", format, cut, at)
			}
		}
	}
}

// A PAX global header, whose body archive/tar reads before Next returns,
// passes through with its padding, the entry after it where it was.
func TestGlobalHeaderBeforeARewrittenEntry(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range whole {
		if e.name == "config.dump" {
			require.NoError(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{"comment": "from elsewhere"}}))
		}
		writeEntry(t, tw, e)
	}
	require.NoError(t, tw.Close())
	var out bytes.Buffer
	require.NoError(t, Rewrite(&out, bytes.NewReader(b.Bytes()), Identity{ID: newID, Name: "c"}))
	info, err := Inspect(bytes.NewReader(out.Bytes()))
	require.NoError(t, err)
	assert.Equal(t, newID, info.ID)
	assert.Equal(t, entries(t, archive(t, whole))["checkpoint/pages-1.img"], entries(t, out.Bytes())["checkpoint/pages-1.img"])
}

// A sparse file's body in the archive is not its size: an archive with
// one (GNU tar's two ways; Podman writes none) is refused, not copied
// to a wrong place.
func TestSparseRefused(t *testing.T) {
	t.Parallel()
	if _, err := osexec.LookPath("tar"); err != nil {
		testkit.SkipOrFail(t, "", "needs GNU tar to make a sparse archive")
	}
	dir := t.TempDir()
	for _, e := range whole {
		p := filepath.Join(dir, e.name)
		if e.dir {
			require.NoError(t, os.MkdirAll(p, 0o700))
			continue
		}
		require.NoError(t, os.WriteFile(p, []byte(e.body), 0o600))
	}
	holes, err := os.Create(filepath.Join(dir, "checkpoint", "pages-2.img"))
	require.NoError(t, err)
	_, err = holes.WriteAt([]byte("data after a hole"), 1<<20)
	require.NoError(t, err)
	require.NoError(t, holes.Close())
	for _, format := range []string{"gnu", "posix"} {
		out := filepath.Join(t.TempDir(), format+".tar")
		// The sparse file first, everything a restore needs after it.
		b, err := osexec.Command("tar", "-C", dir, "--sparse", "--format="+format, "-cf", out,
			"checkpoint/pages-2.img", "checkpoint/inventory.img", "checkpoint/pages-1.img", "config.dump", "spec.dump", "rootfs-diff.tar").CombinedOutput()
		require.NoError(t, err, "%s", b)
		archive, err := os.ReadFile(out)
		require.NoError(t, err)
		err = Rewrite(io.Discard, bytes.NewReader(archive), Identity{ID: newID, Name: "c"})
		require.ErrorIs(t, err, ErrInvalid, format)
		assert.ErrorContains(t, err, "sparse", format)
		_, err = Inspect(bytes.NewReader(archive))
		assert.ErrorContains(t, err, "sparse", "Inspect refuses it too (%s)", format)
	}
}
