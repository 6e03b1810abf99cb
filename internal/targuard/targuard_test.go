package targuard

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"path"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// entry is one tar entry for a test archive: a file with Body, or a link.
type entry struct {
	Type     byte
	Name     string
	Linkname string
	Body     string
	Mode     int64
}

func archive(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Typeflag: e.Type, Name: e.Name, Linkname: e.Linkname, Mode: e.Mode, Size: int64(len(e.Body))}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		require.NoError(t, tw.WriteHeader(h))
		_, err := io.WriteString(tw, e.Body)
		require.NoError(t, err)
	}
	require.NoError(t, tw.Close())
	return buf.Bytes()
}

func TestGuardTarPassesSafeArchives(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 10<<10) // spans many chunks
	in := archive(t,
		entry{Type: tar.TypeDir, Name: "out/", Mode: 0o755},
		entry{Name: "out/bin", Body: "\x00\x01\xff binary", Mode: 0o755},
		entry{Name: "out/big", Body: big, Mode: 0o600},
		entry{Name: "./out/empty"},
		entry{Type: tar.TypeSymlink, Name: "out/link", Linkname: "bin"},
		entry{Type: tar.TypeSymlink, Name: "out/sub/up", Linkname: "../bin"},
		entry{Type: tar.TypeLink, Name: "out/hard", Linkname: "out/bin"},
		entry{Type: tar.TypeSymlink, Name: "out/sub/deep/chain", Linkname: "./../.././link"},
		entry{Type: tar.TypeSymlink, Name: "out/dots", Linkname: "..hidden/.x"},
		entry{Type: tar.TypeLink, Name: "out/hard2", Linkname: "./out/big"},
	)
	got, err := io.ReadAll(New(bytes.NewReader(in), ""))
	require.NoError(t, err)

	want := listTar(t, in)
	assert.Equal(t, want, listTar(t, got), "entries, modes and contents survive")
}

// listTar renders an archive as one line per entry, contents included.
func listTar(t *testing.T, b []byte) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		body, err := io.ReadAll(tr)
		require.NoError(t, err)
		out = append(out, strings.Join([]string{string(h.Typeflag), h.Name, h.Linkname, string(rune('0' + h.Mode&7)), string(body)}, "|"))
	}
}

func TestGuardTarRefusesEscapes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []entry
		culprit string
	}{
		{"absolute name", []entry{{Name: "/etc/passwd"}}, "/etc/passwd"},
		{"dot-dot", []entry{{Name: "../x"}}, "../x"},
		{"dot-dot inside", []entry{{Name: "a/../../x"}}, "a/../../x"},
		{"symlink up", []entry{{Type: tar.TypeSymlink, Name: "l", Linkname: "../x"}}, "l"},
		{"symlink deep up", []entry{{Type: tar.TypeSymlink, Name: "a/b/l", Linkname: "../../../x"}}, "a/b/l"},
		{"symlink absolute", []entry{{Type: tar.TypeSymlink, Name: "l", Linkname: "/etc"}}, "l"},
		{"hard link up", []entry{{Type: tar.TypeLink, Name: "h", Linkname: "../x"}}, "h"},
		{"hard link absolute", []entry{{Type: tar.TypeLink, Name: "h", Linkname: "/etc/shadow"}}, "h"},
		{"through a symlink", []entry{{Type: tar.TypeSymlink, Name: "d", Linkname: "."}, {Name: "d/f"}}, "d/f"},
		// Lexically "a/a/a/../../.." is ".", but with a -> . it climbs three levels.
		{"symlink chain", []entry{
			{Type: tar.TypeSymlink, Name: "a", Linkname: "."},
			{Type: tar.TypeSymlink, Name: "a/a/a/l", Linkname: "../../.."},
		}, "a/a/a/l"},
		// Lexically "s/.." is ".", but with s -> . it is "..": a ".."
		// after a name is refused, whether that name is a symlink already,
		// later in the archive, or never.
		{"symlink target through a symlink", []entry{
			{Type: tar.TypeSymlink, Name: "s", Linkname: "."},
			{Type: tar.TypeSymlink, Name: "x", Linkname: "s/.."},
		}, "x"},
		{"symlink target through a later symlink", []entry{
			{Type: tar.TypeSymlink, Name: "x", Linkname: "s/.."},
			{Type: tar.TypeSymlink, Name: "s", Linkname: "."},
		}, "x"},
		{"hard link through a symlink", []entry{
			{Type: tar.TypeSymlink, Name: "s", Linkname: "."},
			{Type: tar.TypeLink, Name: "h", Linkname: "s/../x"},
		}, "h"},
		// os.Link links a symlink itself: d/up -> .. copied to t is t -> ..
		{"hard link to a symlink", []entry{
			{Type: tar.TypeSymlink, Name: "d/up", Linkname: ".."},
			{Type: tar.TypeLink, Name: "t", Linkname: "d/up"},
		}, "t"},
		{"hard link to a symlink through a symlink", []entry{
			{Type: tar.TypeSymlink, Name: "d/up", Linkname: ".."},
			{Type: tar.TypeSymlink, Name: "s", Linkname: "d"},
			{Type: tar.TypeLink, Name: "t", Linkname: "s/up"},
		}, "t"},
		{"name through a symlink", []entry{
			{Type: tar.TypeSymlink, Name: "s", Linkname: "."},
			{Name: "s/../x"},
		}, "s/../x"},
		{"the destination replaced by a symlink", []entry{
			{Type: tar.TypeSymlink, Name: "./", Linkname: "."},
			{Name: "escaped"},
		}, "./"},
		{"device", []entry{{Type: tar.TypeChar, Name: "null"}}, "null"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := archive(t, append([]entry{{Name: "first", Body: "ok"}}, tc.entries...)...)
			got, err := io.ReadAll(New(bytes.NewReader(in), ""))
			require.ErrorIs(t, err, ErrUnsafe)
			assert.Contains(t, err.Error(), `"`+tc.culprit+`"`, "the error names the entry")
			// What came out before the refusal holds only the safe entries.
			var names []string
			tr := tar.NewReader(bytes.NewReader(got))
			for {
				h, err := tr.Next()
				if err != nil {
					break
				}
				names = append(names, h.Name)
			}
			assert.Equal(t, "first", names[0])
			assert.NotContains(t, names, tc.culprit, "nothing of the refused entry is emitted")
		})
	}
}

func TestGuardTarEmptyAndCorrupt(t *testing.T) {
	got, err := io.ReadAll(New(bytes.NewReader(archive(t)), ""))
	require.NoError(t, err)
	assert.Empty(t, listTar(t, got))

	in := archive(t, entry{Name: "f", Body: strings.Repeat("x", 2000)})
	_, err = io.ReadAll(New(bytes.NewReader(in[:700]), ""))
	require.Error(t, err, "a truncated stream is an error, not a short archive")
	assert.False(t, errors.Is(err, ErrUnsafe))
}

// FuzzCheckEntry builds archives from lines "TYPE NAME [TARGET]" (TYPE f,
// d, s or h) and checks the guard's promise against a model of extraction
// that follows symlinks: an accepted archive never places an entry or a
// link's destination outside the root, as it is extracted nor once all of
// it is (a symlink may be made safe by the links before it and unsafe by
// those after).
func FuzzCheckEntry(f *testing.F) {
	for _, s := range []string{
		"f a\ns l a",
		"s a .\ns a/a/a/l ../../..",
		"d x\ns x/y ../..\nf x/y/z",
		"s l ../x",
		"h h a/../b",
		"f ./a/./b\ns c a/b",
		"s s .\ns x s/..",
		"s x s/..\ns s .",
		"s s .\nh h s/../x",
		"s a b\ns b/c ../..",
		"s d/up ..\nh t d/up",
		"s ./ .\nf x",
		"s d/up ..\ns s d\nh t s/up",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		links := map[string]string{}
		defer func() {
			for l := range links {
				if resolve(l+"/x", links) < 0 {
					t.Fatalf("accepted symlink %q -> %q, which points outside the root once the archive is out", l, links[l])
				}
			}
		}()
		for _, line := range strings.Split(spec, "\n") {
			typ, rest, _ := strings.Cut(line, " ")
			name, target, _ := strings.Cut(rest, " ")
			h := &tar.Header{Name: name, Linkname: target, Typeflag: tar.TypeReg}
			switch typ {
			case "d":
				h.Typeflag = tar.TypeDir
			case "s":
				h.Typeflag = tar.TypeSymlink
			case "h":
				h.Typeflag = tar.TypeLink
			}
			set := map[string]bool{}
			for l := range links {
				set[l] = true
			}
			if Check(h, set) != nil {
				continue
			}
			clean := path.Clean(name)
			if clean == "." && h.Typeflag != tar.TypeDir {
				t.Fatalf("accepted %q, which replaces the destination itself", line)
			}
			if resolve(clean, links) < 0 {
				t.Fatalf("accepted %q, which lands outside the root", line)
			}
			switch h.Typeflag {
			case tar.TypeSymlink:
				links[clean] = target
				if resolve(clean+"/x", links) < 0 {
					t.Fatalf("accepted symlink %q, which points outside the root", line)
				}
			case tar.TypeLink:
				if resolve(path.Clean(target), links) < 0 {
					t.Fatalf("accepted hard link %q to outside the root", line)
				}
				// link(2) does not follow a final symlink: it copies it.
				if p, ok := physical(path.Clean(target), links); ok {
					if to, isLink := links[p]; isLink {
						links[clean] = to
						if resolve(clean+"/x", links) < 0 {
							t.Fatalf("accepted hard link %q to symlink %q -> %q, which points outside the root from its new place", line, p, to)
						}
					}
				}
			}
		}
	})
}

// resolve walks p component by component from the root, following the
// symlinks in links, and returns the lowest depth it reached (negative:
// it left the root).
func resolve(p string, links map[string]string) int {
	lowest := 0
	var walk func(parts []string, depth int, cur []string, hops int)
	walk = func(parts []string, depth int, cur []string, hops int) {
		for i, part := range parts {
			switch part {
			case "", ".":
				continue
			case "..":
				depth--
				if depth < lowest {
					lowest = depth
				}
				if len(cur) > 0 {
					cur = cur[:len(cur)-1]
				}
				continue
			}
			cur = append(cur, part)
			depth++
			if target, ok := links[strings.Join(cur, "/")]; ok {
				if hops == 40 {
					return // a loop: the kernel says ELOOP, nothing is reached
				}
				cur = cur[:len(cur)-1]
				depth--
				if strings.HasPrefix(target, "/") {
					lowest = -1 << 30
					return
				}
				walk(append(strings.Split(target, "/"), parts[i+1:]...), depth, cur, hops+1)
				return
			}
		}
	}
	walk(strings.Split(p, "/"), 0, nil, 0)
	return lowest
}

// physical is where p leads, its symlinks followed but for the last
// component, as link(2) resolves its target; ok is false when it leaves
// the root or loops.
func physical(p string, links map[string]string) (string, bool) {
	parts := strings.Split(p, "/")
	var cur []string
	for hops := 0; len(parts) > 0; {
		part := parts[0]
		parts = parts[1:]
		switch part {
		case "", ".":
			continue
		case "..":
			if len(cur) == 0 {
				return "", false
			}
			cur = cur[:len(cur)-1]
			continue
		}
		cur = append(cur, part)
		target, isLink := links[strings.Join(cur, "/")]
		if !isLink || len(parts) == 0 {
			continue
		}
		if hops++; hops > 40 || strings.HasPrefix(target, "/") {
			return "", false
		}
		cur = cur[:len(cur)-1]
		parts = append(strings.Split(target, "/"), parts...)
	}
	return strings.Join(cur, "/"), true
}

// Podman names the entries of a followed symlink after its target; a
// root names them after the path that was asked for, links included.
func TestGuardTarRenamesTheRoot(t *testing.T) {
	in := archive(t,
		entry{Type: tar.TypeDir, Name: "d/", Mode: 0o755},
		entry{Name: "d/f", Body: "x"},
		entry{Type: tar.TypeLink, Name: "d/h", Linkname: "d/f"},
		entry{Type: tar.TypeSymlink, Name: "d/s", Linkname: "f"},
	)
	g := New(bytes.NewReader(in), "dl")
	got, err := io.ReadAll(g)
	require.NoError(t, err)
	assert.Equal(t, 4, g.Entries())
	var names []string
	tr := tar.NewReader(bytes.NewReader(got))
	for h, err := tr.Next(); err == nil; h, err = tr.Next() {
		names = append(names, h.Name+">"+h.Linkname)
	}
	assert.Equal(t, []string{"dl/>", "dl/f>", "dl/h>dl/f", "dl/s>f"}, names)

	// The same name, or no root, renames nothing.
	for _, root := range []string{"d", ""} {
		got, err := io.ReadAll(New(bytes.NewReader(in), root))
		require.NoError(t, err)
		assert.Equal(t, listTar(t, in), listTar(t, got), "root %q", root)
	}
	// An empty stream has no entry.
	g = New(bytes.NewReader(archive(t)), "x")
	_, err = io.ReadAll(g)
	require.NoError(t, err)
	assert.Zero(t, g.Entries())
}
