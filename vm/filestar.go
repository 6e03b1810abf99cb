package vm

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	"github.com/podvm/podvm/internal/targuard"
)

// This file is how the file calls travel on a VM's tar streams: walking
// what CopyOut sends, writing what CopyIn takes, and spooling a stream of
// unknown size.

// errStop ends a walk that has what it wanted.
var errStop = errors.New("vm: stop the walk")

// spoolTemp copies r to a new temporary file, rewound, and its size.
func spoolTemp(r io.Reader) (*os.File, int64, error) {
	f, err := os.CreateTemp("", "podvm-write-*")
	if err != nil {
		return nil, 0, err
	}
	n, err := io.Copy(f, r)
	if err == nil {
		_, err = f.Seek(0, io.SeekStart)
	}
	if err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, 0, err
	}
	return f, n, nil
}

// copyExactly copies size bytes of r to w and fails when r holds fewer
// or more.
func copyExactly(w io.Writer, r io.Reader, size int64) error {
	n, err := io.CopyN(w, r, size)
	switch {
	case err == io.EOF:
		return fmt.Errorf("%w: the content ended after %d of its %d bytes", fs.ErrInvalid, n, size)
	case err != nil:
		return err
	}
	if m, _ := r.Read(make([]byte, 1)); m > 0 {
		return fmt.Errorf("%w: the content holds more than its %d bytes", fs.ErrInvalid, size)
	}
	return nil
}

// tarMode is the tar header mode of perm's permission and special bits.
func tarMode(perm fs.FileMode) int64 {
	m := int64(perm.Perm())
	for _, b := range []struct {
		fs  fs.FileMode
		tar int64
	}{{fs.ModeSetuid, 0o4000}, {fs.ModeSetgid, 0o2000}, {fs.ModeSticky, 0o1000}} {
		if perm&b.fs != 0 {
			m |= b.tar
		}
	}
	return m
}

// checkedCopier is a VM that can take an archive whose every entry was
// checked as the tar guard checks it already (writeTree does, and
// WriteFile's one entry is its own): the guard's second pass, which
// decodes and encodes the archive again, is saved.
type checkedCopier interface {
	copyInChecked(ctx context.Context, dir string, r io.Reader) error
}

// errStreamEnded closes the pipe of a copy that ended before its stream.
var errStreamEnded = errors.New("vm: the copy ended before its tar stream")

// copyIn streams the tar archive that write makes into directory dir of
// the sandbox, for the call op on p. write's errors come first: a VM
// that failed because its reader did says less.
func copyIn(ctx context.Context, v VM, op, p, dir string, write func(*tar.Writer) error) error {
	pr, pw := io.Pipe()
	wrote := make(chan error, 1)
	go func() {
		tw := tar.NewWriter(pw)
		err := write(tw)
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
		wrote <- err
	}()
	var err error
	if c, ok := capability[checkedCopier](v); ok {
		err = c.copyInChecked(ctx, dir, pr)
	} else {
		err = v.CopyIn(ctx, dir, pr)
	}
	pr.CloseWithError(errStreamEnded)
	werr := <-wrote
	switch {
	case werr != nil && !errors.Is(werr, errStreamEnded):
		if errors.Is(werr, ErrUnsafeArchive) {
			return werr // it names the entry and says why already
		}
		return fmt.Errorf("vm: %s %s: %w", op, p, werr)
	case err != nil:
		return fileError(op, p, err)
	case werr != nil:
		return fmt.Errorf("vm: %s %s: CopyIn returned before reading the whole archive", op, p)
	}
	return nil
}

// walkOut streams CopyOut of p and calls fn for each entry in order, its
// names made relative to p as [walkTar] does, having checked it as the
// tar guard does when check is set. The root of the archive is its first
// entry, whatever its name (a backend that follows a symlink may name it
// after the target); an entry outside it is refused. When p is a symlink
// that CopyOut sends as one, walkOut follows it, as the system would, up
// to 40 times. An error of fn ends the copy and is returned as it is.
//
// Without check, nothing is written where the entries point, and a VM
// that can send an archive without its tar guard ([uncheckedCopier])
// sends it so: what the guard refuses is what extracting it would make
// unsafe.
func walkOut(ctx context.Context, v VM, op, p string, check bool, fn func(h *tar.Header, r io.Reader) error) error {
	for range 40 {
		var link string
		err := walkOnce(ctx, v, op, p, check, func(h *tar.Header, r io.Reader) error {
			if h.Name == "." && h.Typeflag == tar.TypeSymlink {
				link = h.Linkname
				return errFollow
			}
			return fn(h, r)
		})
		if err != errFollow {
			return err
		}
		if !path.IsAbs(link) {
			link = path.Join(path.Dir(p), link)
		}
		p = path.Clean(link)
	}
	return fmt.Errorf("vm: %s %s: %w", op, p, syscall.ELOOP)
}

// uncheckedCopier is a VM whose CopyOut can skip its tar guard, for a
// caller that writes nothing where the entries point (a listing).
type uncheckedCopier interface {
	copyOutUnchecked(ctx context.Context, p string, w io.Writer) error
}

// errFollow stops a walk that found its root to be a symlink.
var errFollow = errors.New("vm: follow the symlink")

// callbackError marks an error of walkOnce's callback, which ends the
// copy and is returned as it is.
type callbackError struct{ err error }

func (e callbackError) Error() string { return e.err.Error() }

func walkOnce(ctx context.Context, v VM, op, p string, check bool, fn func(h *tar.Header, r io.Reader) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	copied := make(chan error, 1)
	copyOut := v.CopyOut
	if u, ok := capability[uncheckedCopier](v); ok && !check {
		copyOut = u.copyOutUnchecked
	}
	go func() {
		err := copyOut(ctx, p, pw)
		pw.CloseWithError(err)
		copied <- err
	}()
	err := walkTar(pr, check, func(h *tar.Header, r io.Reader) error {
		if err := fn(h, r); err != nil {
			return callbackError{err}
		}
		return nil
	})
	if err == nil {
		_, err = io.Copy(io.Discard, pr) // the padding after the trailer
	}
	if err != nil {
		cancel()
		pr.CloseWithError(err)
	}
	cerr := <-copied
	var cb callbackError
	switch {
	case errors.As(err, &cb):
		return cb.err
	case cerr != nil:
		return fileError(op, p, cerr)
	case err != nil:
		return fmt.Errorf("vm: %s %s: %w", op, p, err)
	}
	return nil
}

// walkTar reads the tar stream r and calls fn for each entry, its Name,
// and a hard link's Linkname, made relative to the archive's root, its
// first entry ("." for the root itself). With check, each entry is first
// checked as the tar guard checks it, under its own name. An entry
// outside the root is refused with [ErrUnsafeArchive]. Global pax
// headers are skipped.
func walkTar(r io.Reader, check bool, fn func(h *tar.Header, r io.Reader) error) error {
	tr := tar.NewReader(r)
	links := map[string]bool{}
	root := ""
	for {
		h, err := tr.Next()
		switch {
		case err == io.EOF:
			return nil
		case err != nil:
			return fmt.Errorf("reading the tar stream: %w", err)
		case h.Typeflag == tar.TypeXGlobalHeader:
			continue
		}
		name := path.Clean(h.Name)
		if root == "" && h.Typeflag == tar.TypeSymlink && name != ".." && !strings.Contains(name, "/") {
			// The copied path is a symlink, sent as one: nothing is
			// written where it points, the caller may follow it.
			h.Name = "."
			if err := fn(h, tr); err != nil {
				return err
			}
			continue
		}
		if check {
			if err := targuard.Check(h, links); err != nil {
				return err
			}
		}
		if root == "" {
			root, _, _ = strings.Cut(name, "/")
		}
		rel, ok := relTo(root, name)
		if !ok {
			return fmt.Errorf("%w %q: outside the copied path %q", ErrUnsafeArchive, h.Name, root)
		}
		if h.Typeflag == tar.TypeLink {
			target, ok := relTo(root, path.Clean(h.Linkname))
			if !ok {
				return fmt.Errorf("%w %q: hard link to %q, outside the copied path %q", ErrUnsafeArchive, h.Name, h.Linkname, root)
			}
			h.Linkname = target
		}
		h.Name = rel
		if err := fn(h, tr); err != nil {
			return err
		}
	}
}

// relTo returns the cleaned path name relative to root, and whether it
// is root or beneath it.
func relTo(root, name string) (string, bool) {
	if name == root {
		return ".", true
	}
	rel, ok := strings.CutPrefix(name, root+"/")
	return rel, ok && root != "."
}
