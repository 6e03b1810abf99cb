package vm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

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
// [fs.ErrNotExist]; one that is not a directory is an error.
func (s *sandbox) CopyIn(ctx context.Context, dir string, r io.Reader) error {
	dir, st, err := s.at("copy into", dir)
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
	return err
}

// CopyOut writes path of the sandbox to w as a tar stream, streamed
// through the archive guard; the archive is never held in memory. Its
// entries are named after path's base name, as `tar -C parent -c base`
// names them; when path is a symlink it is followed (as `podman cp`
// does), the entries still named after path. An entry that would land
// outside its root fails the copy with an error matching
// [ErrUnsafeArchive]; a path that does not exist matches
// [fs.ErrNotExist]; an archive with no entry at all (a link into /proc,
// say) is an error matching [ErrPodman]. Through the agent, a socket in
// the tree, which a tar stream cannot carry, fails the copy with
// [ErrUnsafeArchive], naming it; with [Config.PodmanExec], Podman leaves
// sockets out. When CopyOut fails, w may have received part of a
// stream.
func (s *sandbox) CopyOut(ctx context.Context, p string, w io.Writer) error {
	p, st, err := s.at("copy out", p)
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
		err = s.d.CopyOut(ctx, st.id, p, pw)
	}
	pw.Close()
	copyErr := <-copied
	switch {
	case copyErr != nil: // the guard's refusal, or w's failure, is why the driver failed
		return errors.Join(fmt.Errorf("vm: copy out %s: %w", p, copyErr), err)
	case err != nil:
		return err
	case g.Entries() == 0:
		return fmt.Errorf("%w: copy out %s: the archive holds no entry", ErrPodman, p)
	}
	return nil
}

// at returns path p of a copy (op) cleaned, and the sandbox's state.
func (s *sandbox) at(op, p string) (string, state, error) {
	if !path.IsAbs(p) || strings.IndexByte(p, 0) >= 0 {
		return "", state{}, fmt.Errorf("%w: %s %q: want an absolute path in the sandbox", ErrInvalidPath, op, p)
	}
	st, err := s.container()
	return path.Clean(p), st, err
}
