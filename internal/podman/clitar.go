package podman

import (
	"archive/tar"
	"bytes"
	"io"
	"path"
	"strings"
	"sync"
)

// This file rewrites the tar streams of `podman cp`: the names a copy in
// is given under its directory, and the one tree a copy out keeps.

// firstHeader is a writer that keeps the first tar header written to it
// and calls stop once it has it, dropping the rest.
type firstHeader struct {
	mu   sync.Mutex
	buf  []byte
	h    *tar.Header
	stop func()
}

func (f *firstHeader) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.h != nil || len(f.buf) >= 64<<10 {
		return len(p), nil
	}
	f.buf = append(f.buf, p...)
	// A header may span PAX records; try to read it at every write.
	if h, err := tar.NewReader(bytes.NewReader(f.buf)).Next(); err == nil {
		f.h = h
		f.stop()
	}
	return len(p), nil
}

func (f *firstHeader) header() *tar.Header {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.h
}

// prefixTar copies the tar stream r to w with prefix, a relative path,
// in front of every entry's name and every hard link's target.
func prefixTar(w io.Writer, r io.Reader, prefix string) error {
	tr, tw := tar.NewReader(r), tar.NewWriter(w)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return tw.Close()
		}
		if err != nil {
			return err
		}
		h.Name = prefixName(prefix, h.Name)
		if h.Typeflag == tar.TypeLink {
			h.Linkname = prefixName(prefix, h.Linkname)
		}
		// The longer name may not fit the entry's format (USTAR holds
		// 100 bytes and PAX only UTF-8): let the writer choose.
		h.Format = tar.FormatUnknown
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}

// prefixName joins prefix and name, keeping a directory's trailing
// slash.
func prefixName(prefix, name string) string {
	p := path.Join(prefix, name)
	if strings.HasSuffix(name, "/") {
		p += "/"
	}
	return p
}

type keptResult struct {
	n   int
	err error
}

// keepTree copies to w the entries of tar stream r whose top-level name
// is top, and returns how many it kept.
func keepTree(w io.Writer, r io.Reader, top string) (int, error) {
	tr, tw := tar.NewReader(r), tar.NewWriter(w)
	n := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			_, err = io.Copy(io.Discard, r) // the padding after the trailer
			if err == nil {
				err = tw.Close()
			}
			return n, err
		}
		if err != nil {
			return n, err
		}
		if first, _, _ := strings.Cut(strings.TrimPrefix(h.Name, "./"), "/"); first != top {
			continue
		}
		n++
		if err := tw.WriteHeader(h); err != nil {
			return n, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return n, err
		}
	}
}
