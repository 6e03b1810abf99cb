// Package targuard checks tar streams on their way into and out of a
// sandbox: an entry that would land outside the stream's destination,
// whether by its own name or through the stream's own links, is refused.
// It streams, holding one chunk at a time, never the whole archive.
package targuard

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"strings"
)

// ErrUnsafe: a tar stream holds an entry that would land outside its
// destination. The error names the entry.
var ErrUnsafe = errors.New("vm: unsafe archive entry")

// New returns a reader that yields the tar stream r, entry by entry,
// re-encoded, and fails with an error wrapping [ErrUnsafe] at the
// first entry that [Check] refuses. Nothing of a refused entry is
// emitted. It pulls from r only as it is read, so it holds one chunk of
// the stream in memory, never the whole archive.
//
// When root is not empty, the archive is one tree to be named root: if
// its first entry's top-level name is another (Podman names a followed
// symlink's entries after its target), that name is replaced by root in
// every entry and hard link.
func New(r io.Reader, root string) *Reader {
	g := &Reader{tr: tar.NewReader(r), links: map[string]bool{}, root: root}
	g.tw = tar.NewWriter(&g.out)
	return g
}

// Reader is a tar stream being checked; see [New].
type Reader struct {
	tr      *tar.Reader
	tw      *tar.Writer
	out     bytes.Buffer // encoded bytes not yet read
	inEntry bool         // the current entry's content is being copied
	links   map[string]bool
	err     error // sticky; io.EOF once the trailer is out
	// root names the tree; from is the top-level name it replaces.
	root, from string
	entries    int // emitted
}

// Entries counts the entries read so far, all of them accepted.
func (g *Reader) Entries() int { return g.entries }

// rename replaces the top-level name g.from of name with g.root.
func (g *Reader) rename(name string) string {
	if g.from == g.root {
		return name
	}
	top, rest, found := strings.Cut(name, "/")
	if top != g.from {
		return name
	}
	if !found {
		return g.root
	}
	return g.root + "/" + rest
}

func (g *Reader) Read(p []byte) (int, error) {
	for g.out.Len() == 0 && g.err == nil {
		g.err = g.fill()
	}
	if g.out.Len() > 0 {
		return g.out.Read(p)
	}
	return 0, g.err
}

// fill encodes the next piece of the stream into g.out: a chunk of the
// current entry, the next header, or the trailer.
func (g *Reader) fill() error {
	if g.inEntry {
		_, err := io.CopyN(g.tw, g.tr, 32<<10)
		if err == io.EOF {
			g.inEntry = false
			return nil
		}
		return err
	}
	h, err := g.tr.Next()
	if err == io.EOF {
		if err := g.tw.Close(); err != nil {
			return err
		}
		return io.EOF
	}
	if err != nil {
		return fmt.Errorf("vm: reading tar stream: %w", err)
	}
	if g.root != "" {
		if g.entries == 0 {
			g.from, _, _ = strings.Cut(strings.TrimPrefix(h.Name, "./"), "/")
		}
		h.Name = g.rename(strings.TrimPrefix(h.Name, "./"))
		if h.Typeflag == tar.TypeLink {
			h.Linkname = g.rename(strings.TrimPrefix(h.Linkname, "./"))
		}
	}
	if err := Check(h, g.links); err != nil {
		return err
	}
	g.entries++
	if err := g.tw.WriteHeader(h); err != nil {
		return fmt.Errorf("vm: tar entry %q: %w", h.Name, err)
	}
	g.inEntry = true
	return nil
}

// checkEntry refuses an entry whose name is absolute or has a ".."
// component, that lies beneath a symlink of the same archive (which could
// redirect it anywhere), a symlink whose target is absolute, climbs above
// the archive's root, or has a ".." after a name (that name may be, now or
// later in the archive, a symlink to anywhere, and ".." climbs from
// there), a hard link whose target is absolute or has a ".." at all, and
// device nodes, and a hard link to, or through, a symlink of the archive.
// links collects the archive's symlinks seen so far.
//
// So every symlink the archive makes first climbs through real
// directories, by no more than its own depth, then only descends, through
// symlinks that do the same: however they chain, in whatever order they
// arrive, nothing resolves outside the root.
func Check(h *tar.Header, links map[string]bool) error {
	unsafe := func(why string) error {
		return fmt.Errorf("%w %q: %s", ErrUnsafe, h.Name, why)
	}
	name := path.Clean(h.Name)
	switch {
	case strings.ContainsRune(h.Name, 0):
		return unsafe("NUL byte in name")
	case path.IsAbs(name):
		return unsafe("absolute path")
	case escapes(name):
		return unsafe("path leaves the destination")
	case hasDotDot(h.Name):
		return unsafe(`".." in the path`)
	case name == "." && h.Typeflag != tar.TypeDir:
		// An extractor may replace the destination itself with it.
		return unsafe("names the destination, and is not a directory")
	}
	if l := symlinkAt(path.Dir(name), links); l != "" {
		return unsafe(fmt.Sprintf("lies beneath symlink %q", l))
	}
	switch h.Typeflag {
	case tar.TypeSymlink:
		switch {
		case path.IsAbs(h.Linkname):
			return unsafe(fmt.Sprintf("symlink to absolute path %q", h.Linkname))
		case escapes(path.Join(path.Dir(name), h.Linkname)):
			return unsafe(fmt.Sprintf("symlink %q points outside the destination", h.Linkname))
		case climbsAfterName(h.Linkname):
			return unsafe(fmt.Sprintf(`symlink %q has ".." after a name, which may be a symlink`, h.Linkname))
		}
		links[name] = true
	case tar.TypeLink:
		if path.IsAbs(h.Linkname) || hasDotDot(h.Linkname) {
			return unsafe(fmt.Sprintf("hard link to %q, which may be outside the destination", h.Linkname))
		}
		// A hard link to a symlink is a copy of that symlink at another
		// depth, where its relative target may climb out.
		if l := symlinkAt(path.Clean(h.Linkname), links); l != "" {
			return unsafe(fmt.Sprintf("hard link to %q, through or to symlink %q", h.Linkname, l))
		}
	case tar.TypeChar, tar.TypeBlock:
		return unsafe("device node")
	}
	return nil
}

// escapes reports whether the cleaned relative path p climbs above its root.
func escapes(p string) bool { return p == ".." || strings.HasPrefix(p, "../") }

// symlinkAt returns the first of the cleaned relative path p and its
// parents that is one of links, or "".
func symlinkAt(p string, links map[string]bool) string {
	for ; p != "." && p != "/"; p = path.Dir(p) {
		if links[p] {
			return p
		}
	}
	return ""
}

// hasDotDot reports whether slash-separated p has a ".." component.
func hasDotDot(p string) bool { return slices.Contains(strings.Split(p, "/"), "..") }

// climbsAfterName reports whether slash-separated p has a ".." component
// after one that is a name (not "", "." or "..").
func climbsAfterName(p string) bool {
	parts := strings.Split(p, "/")
	for i, part := range parts {
		if part != "" && part != "." && part != ".." {
			return slices.Contains(parts[i+1:], "..")
		}
	}
	return false
}
