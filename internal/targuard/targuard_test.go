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

	"github.com/podvm/podvm/internal/testkit"
)

func TestGuardTarPassesSafeArchives(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 10<<10) // spans many chunks
	in := testkit.Tar(t,
		testkit.Dir("out/", 0o755),
		testkit.File("out/bin", "\x00\x01\xff binary", 0o755),
		testkit.File("out/big", big, 0o600),
		testkit.File("./out/empty", "", 0o644),
		testkit.Symlink("out/link", "bin"),
		testkit.Symlink("out/sub/up", "../bin"),
		testkit.Link("out/hard", "out/bin"),
		testkit.Symlink("out/sub/deep/chain", "./../.././link"),
		testkit.Symlink("out/dots", "..hidden/.x"),
		testkit.Link("out/hard2", "./out/big"),
	)
	got, err := io.ReadAll(New(bytes.NewReader(in), ""))
	require.NoError(t, err)

	want := listTar(t, in)
	assert.Equal(t, want, listTar(t, got), "entries, modes and contents survive")
}

// listTar renders an archive as one line per entry, contents included.
func listTar(t *testing.T, b []byte) []string {
	t.Helper()
	entries, err := testkit.Untar(b)
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, strings.Join([]string{string(e.Typeflag), e.Name, e.Linkname, string(rune('0' + e.Mode&7)), e.Body}, "|"))
	}
	return out
}

func TestGuardTarRefusesEscapes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []testkit.Entry
		culprit string
	}{
		{"absolute name", []testkit.Entry{testkit.File("/etc/passwd", "", 0o644)}, "/etc/passwd"},
		{"dot-dot", []testkit.Entry{testkit.File("../x", "", 0o644)}, "../x"},
		{"dot-dot inside", []testkit.Entry{testkit.File("a/../../x", "", 0o644)}, "a/../../x"},
		{"symlink up", []testkit.Entry{testkit.Symlink("l", "../x")}, "l"},
		{"symlink deep up", []testkit.Entry{testkit.Symlink("a/b/l", "../../../x")}, "a/b/l"},
		{"symlink absolute", []testkit.Entry{testkit.Symlink("l", "/etc")}, "l"},
		{"hard link up", []testkit.Entry{testkit.Link("h", "../x")}, "h"},
		{"hard link absolute", []testkit.Entry{testkit.Link("h", "/etc/shadow")}, "h"},
		{"through a symlink", []testkit.Entry{testkit.Symlink("d", "."), testkit.File("d/f", "", 0o644)}, "d/f"},
		// Lexically "a/a/a/../../.." is ".", but with a -> . it climbs three levels.
		{"symlink chain", []testkit.Entry{
			testkit.Symlink("a", "."),
			testkit.Symlink("a/a/a/l", "../../.."),
		}, "a/a/a/l"},
		// Lexically "s/.." is ".", but with s -> . it is "..": a ".."
		// after a name is refused, whether that name is a symlink already,
		// later in the archive, or never.
		{"symlink target through a symlink", []testkit.Entry{
			testkit.Symlink("s", "."),
			testkit.Symlink("x", "s/.."),
		}, "x"},
		{"symlink target through a later symlink", []testkit.Entry{
			testkit.Symlink("x", "s/.."),
			testkit.Symlink("s", "."),
		}, "x"},
		{"hard link through a symlink", []testkit.Entry{
			testkit.Symlink("s", "."),
			testkit.Link("h", "s/../x"),
		}, "h"},
		// os.Link links a symlink itself: d/up -> .. copied to t is t -> ..
		{"hard link to a symlink", []testkit.Entry{
			testkit.Symlink("d/up", ".."),
			testkit.Link("t", "d/up"),
		}, "t"},
		{"hard link to a symlink through a symlink", []testkit.Entry{
			testkit.Symlink("d/up", ".."),
			testkit.Symlink("s", "d"),
			testkit.Link("t", "s/up"),
		}, "t"},
		{"name through a symlink", []testkit.Entry{
			testkit.Symlink("s", "."),
			testkit.File("s/../x", "", 0o644),
		}, "s/../x"},
		{"the destination replaced by a symlink", []testkit.Entry{
			testkit.Symlink("./", "."),
			testkit.File("escaped", "", 0o644),
		}, "./"},
		{"device", []testkit.Entry{{Header: tar.Header{Typeflag: tar.TypeChar, Name: "null", Mode: 0o644}}}, "null"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := testkit.Tar(t, append([]testkit.Entry{testkit.File("first", "ok", 0o644)}, tc.entries...)...)
			got, err := io.ReadAll(New(bytes.NewReader(in), ""))
			require.ErrorIs(t, err, ErrUnsafe)
			assert.Contains(t, err.Error(), `"`+tc.culprit+`"`, "the error names the entry")
			// What came out before the refusal holds only the safe entries.
			entries, _ := testkit.Untar(got) // cut short by the refusal
			names := testkit.Names(entries)
			assert.Equal(t, "first", names[0])
			assert.NotContains(t, names, tc.culprit, "nothing of the refused entry is emitted")
		})
	}
}

func TestGuardTarEmptyAndCorrupt(t *testing.T) {
	got, err := io.ReadAll(New(bytes.NewReader(testkit.Tar(t)), ""))
	require.NoError(t, err)
	assert.Empty(t, listTar(t, got))

	in := testkit.Tar(t, testkit.File("f", strings.Repeat("x", 2000), 0o644))
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
	in := testkit.Tar(t,
		testkit.Dir("d/", 0o755),
		testkit.File("d/f", "x", 0o644),
		testkit.Link("d/h", "d/f"),
		testkit.Symlink("d/s", "f"),
	)
	g := New(bytes.NewReader(in), "dl")
	got, err := io.ReadAll(g)
	require.NoError(t, err)
	assert.Equal(t, 4, g.Entries())
	entries, _ := testkit.Untar(got)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name+">"+e.Linkname)
	}
	assert.Equal(t, []string{"dl/>", "dl/f>", "dl/h>dl/f", "dl/s>f"}, names)

	// The same name, or no root, renames nothing.
	for _, root := range []string{"d", ""} {
		got, err := io.ReadAll(New(bytes.NewReader(in), root))
		require.NoError(t, err)
		assert.Equal(t, listTar(t, in), listTar(t, got), "root %q", root)
	}
	// An empty stream has no entry.
	g = New(bytes.NewReader(testkit.Tar(t)), "x")
	_, err = io.ReadAll(g)
	require.NoError(t, err)
	assert.Zero(t, g.Entries())
}
