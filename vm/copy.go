package vm

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"strings"
	"syscall"

	"github.com/podvm/podvm/internal/targuard"
)

// ErrUnsafeArchive: a tar stream handed to CopyIn, or coming out of the
// sandbox in CopyOut, holds an entry that would land outside its
// destination. The error names the entry.
var ErrUnsafeArchive = targuard.ErrUnsafe

// ErrInvalidPath: a path given to CopyIn or CopyOut is not an absolute
// path in the sandbox (or holds a NUL byte); nothing was copied.
var ErrInvalidPath = errors.New("vm: invalid sandbox path")

// CopyIn extracts the tar stream r into directory dir of the sandbox,
// streaming r through the archive guard: an entry that would land outside
// dir by the archive's own names and links fails the copy with an error
// matching [ErrUnsafeArchive] (entries before it may have been
// extracted). dir is a path, never a pattern. Through the agent, every
// entry is made beneath dir without following a symlink out of it: one
// that code in the sandbox planted under dir fails the copy with
// [ErrUnsafeArchive] too. With [Config.PodmanExec], Podman extracts
// inside the sandbox's root, and such a symlink is followed, within the
// sandbox, never onto the host (the kube backend's exec path refuses it
// as the agent does; see package vm/kube). A dir that does not exist matches
// [fs.ErrNotExist]; one that is not a directory, or is under a file,
// [syscall.ENOTDIR]; a path too long [syscall.ENAMETOOLONG]; an entry
// that cannot be made the sentinel of the file calls for its reason
// ([syscall.EROFS], [syscall.EISDIR], ...: see [WriteFile]), on every
// path.
func (s *sandbox) CopyIn(ctx context.Context, dir string, r io.Reader) error {
	dir, st, err := s.checkedPath("copy into", dir)
	if err != nil {
		return err
	}
	if st.agent != nil {
		return s.copyInAgent(ctx, dir, r)
	}
	in := &errReader{r: targuard.New(r, "")}
	err = s.d.CopyIn(ctx, st.id, dir, in)
	if in.Err() != nil {
		return fmt.Errorf("vm: copy into %s: %w", dir, in.Err())
	}
	return s.copyError(ctx, st.id, "copy into", dir, dir, err)
}

// CopyOut writes path of the sandbox to w as a tar stream, streamed
// through the archive guard; the archive is never held in memory. Its
// entries are named after path's base name, as `tar -C parent -c base`
// names them; when path is a symlink it is followed (as `podman cp`
// does), the entries still named after path. An entry that would land
// outside its root fails the copy with an error matching
// [ErrUnsafeArchive]; a path that does not exist matches
// [fs.ErrNotExist] (under a file, [syscall.ENOTDIR]); a path too long
// [syscall.ENAMETOOLONG]; an archive with no entry at all (a link into
// /proc, say) is an error matching [ErrPodman]. Through the agent, a socket in
// the tree, which a tar stream cannot carry, fails the copy with
// [ErrUnsafeArchive], naming it; with [Config.PodmanExec], Podman leaves
// sockets out. When CopyOut fails, w may have received part of a
// stream.
func (s *sandbox) CopyOut(ctx context.Context, p string, w io.Writer) error {
	p, st, err := s.checkedPath("copy out", p)
	if err != nil {
		return err
	}
	base := path.Base(p)
	if base == "/" {
		base = "" // the whole root: nothing to name
	}
	pr, pw := io.Pipe()
	g := targuard.New(pr, base)
	copied := make(chan error, 1)
	go func() {
		_, err := io.Copy(w, g)
		if err == nil {
			_, err = io.Copy(io.Discard, pr) // the padding after the trailer
		}
		pr.CloseWithError(err) // the driver's further output is dropped
		copied <- err
	}()
	if st.agent != nil {
		err = s.fileOp(ctx, "copy out", p, nil, pw, "tar-out", p)
	} else {
		err = s.copyError(ctx, st.id, "copy out", p, path.Dir(p), s.d.CopyOut(ctx, st.id, p, pw))
	}
	pw.Close()
	copyErr := <-copied
	switch {
	case copyErr != nil: // the guard's refusal, or w's failure, is why the driver failed
		return errors.Join(fmt.Errorf("vm: copy out %s: %w", p, copyErr), err)
	case err != nil:
		return err
	case g.Entries() == 0:
		return fmt.Errorf("%w: copy out %s: %w", ErrPodman, p, errNoEntry)
	}
	return nil
}

// errNoEntry: a copy out gave an archive without a single entry (Podman
// leaves devices and sockets out).
var errNoEntry = errors.New("the archive holds no entry")

// copyOutUnchecked implements uncheckedCopier: CopyOut without the tar
// guard, for a listing. Through the agent it is CopyOut.
func (s *sandbox) copyOutUnchecked(ctx context.Context, p string, w io.Writer) error {
	p, st, err := s.checkedPath("copy out", p)
	if err != nil {
		return err
	}
	if st.agent != nil {
		return s.CopyOut(ctx, p, w)
	}
	return s.copyError(ctx, st.id, "copy out", p, path.Dir(p), s.d.CopyOut(ctx, st.id, p, w))
}

// copyError returns err, Podman's failure of a copy (op) of p in the
// sandbox id, as the agent reports the same failure: the system's reason
// when Podman passed it on ([copyError]), and for a path that Podman
// could not find, or that it says is no directory to copy into, which of
// the two it is: [syscall.ENOTDIR] when p, or a directory above it, is a
// file, else [fs.ErrNotExist]. Podman's messages cannot tell (`podman cp
// -` says the same of both, its service a 404): a copy out of from (p,
// or its parent when p is known to be missing) and of each missing
// directory above it, each read to its first entry, does. Nothing is
// probed when the copy succeeded or failed otherwise.
func (s *sandbox) copyError(ctx context.Context, id, op, p, from string, err error) error {
	if err == nil {
		return nil
	}
	if e := copyError(op, p, err); e != nil {
		err = e
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for q := from; q != "/"; q = path.Dir(q) {
		h, qerr := s.firstEntry(ctx, id, q)
		switch {
		case errors.Is(qerr, fs.ErrNotExist):
			continue
		case qerr != nil || h.Typeflag == tar.TypeDir || h.Typeflag == tar.TypeSymlink:
			// A directory (or a link, which may lead to one) above a
			// missing path: it is missing.
			return err
		}
		return fmt.Errorf("vm: %s %s: %w: %s is not a directory: %w", op, p, syscall.ENOTDIR, q, nativeError(err))
	}
	return err
}

// firstEntry returns the first entry of Podman's copy out of p in the
// sandbox id, reading no more of it.
func (s *sandbox) firstEntry(ctx context.Context, id, p string) (*tar.Header, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	pr, pw := io.Pipe()
	copied := make(chan error, 1)
	go func() {
		err := s.d.CopyOut(ctx, id, p, pw)
		pw.CloseWithError(err)
		copied <- err
	}()
	tr := tar.NewReader(pr)
	h, err := tr.Next()
	for err == nil && h.Typeflag == tar.TypeXGlobalHeader {
		h, err = tr.Next()
	}
	cancel()
	pr.CloseWithError(errStop)
	cerr := <-copied
	switch {
	case err == nil:
		return h, nil
	case cerr != nil:
		return nil, cerr
	}
	return nil, fmt.Errorf("%w: copy out %s: %w", ErrPodman, p, errNoEntry)
}

// checkedPath returns path p of a copy (op) cleaned, and the sandbox's state.
func (s *sandbox) checkedPath(op, p string) (string, state, error) {
	if !path.IsAbs(p) || strings.IndexByte(p, 0) >= 0 {
		return "", state{}, fmt.Errorf("%w: %s %q: want an absolute path in the sandbox", ErrInvalidPath, op, p)
	}
	p = path.Clean(p)
	if err := checkLength(op, p); err != nil {
		return "", state{}, err
	}
	st, err := s.container()
	return p, st, err
}
