package testkit

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Entry is one entry of a tar stream: its header, and its content.
// [Tar] writes the Header as it is, any field of it, and Body after it;
// [Untar] fills both.
type Entry struct {
	tar.Header
	Body string
}

// modTime is the ModTime of the entries File, Dir, Symlink and Link
// make: 2023-11-14 22:13:20 UTC, Unix time 1700000000.
var modTime = time.Unix(1700000000, 0)

// File is a regular file name holding body, with mode.
func File(name, body string, mode int64) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(body)), ModTime: modTime}, Body: body}
}

// Dir is a directory name, with mode. The name is kept as it is: with or
// without its trailing slash.
func Dir(name string, mode int64) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, ModTime: modTime}}
}

// Symlink is a symbolic link name to target, with mode 0644 (a link's
// own mode means nothing on Linux; podvm's tests have always given it a
// file's).
func Symlink(name, target string) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o644, ModTime: modTime}}
}

// Link is a hard link name to the entry named target, with mode 0644.
func Link(name, target string) Entry {
	return Entry{Header: tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Mode: 0o644, ModTime: modTime}}
}

// Tar is the tar stream of entries, in order, each header as it is (its
// name raw: "..", an absolute name, no slash after a directory's are
// kept) followed by its Body, which must hold Size bytes. It fails t when
// archive/tar refuses an entry.
func Tar(t testing.TB, entries ...Entry) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range entries {
		if err := tw.WriteHeader(&e.Header); err != nil {
			t.Fatalf("testkit: tar header %q: %v", e.Name, err)
		}
		if _, err := io.WriteString(tw, e.Body); err != nil {
			t.Fatalf("testkit: tar entry %q: %v", e.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatalf("testkit: tar: %v", err)
	}
	return b.Bytes()
}

// Untar reads the tar stream b: its entries in order, each with its
// content, up to the first error, and that error; nil when the archive
// ended. An entry whose content was cut short is returned with what
// there was of it, and the error.
func Untar(b []byte) ([]Entry, error) {
	var out []Entry
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		body, err := io.ReadAll(tr)
		out = append(out, Entry{Header: *h, Body: string(body)})
		if err != nil {
			return out, err
		}
	}
}

// Names returns the names of entries, in order, as they are.
func Names(entries []Entry) []string {
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
	}
	return names
}

// Paths returns the names of entries, in order, slash-separated, a
// directory's with one trailing slash whether or not its header had one.
func Paths(entries []Entry) []string {
	var names []string
	for _, e := range entries {
		name := filepath.ToSlash(e.Name)
		if e.Typeflag == tar.TypeDir {
			name = strings.TrimSuffix(name, "/") + "/"
		}
		names = append(names, name)
	}
	return names
}

// Lines describes entries, in order, one line each: "name type mode size
// linkname|content", the type its tar type flag, the mode in octal.
func Lines(entries []Entry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, fmt.Sprintf("%s %c %o %d %s%s", e.Name, e.Typeflag, e.Mode, e.Size, e.Linkname, e.Body))
	}
	return out
}

// Contents describes entries, in order, as "name=content": the name
// without a trailing slash, and "<dir>" as a directory's content.
func Contents(entries []Entry) []string {
	var out []string
	for _, e := range entries {
		content := e.Body
		if e.Typeflag == tar.TypeDir {
			content = "<dir>"
		}
		out = append(out, strings.TrimSuffix(e.Name, "/")+"="+content)
	}
	return out
}
