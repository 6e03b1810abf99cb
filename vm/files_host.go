package vm

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"time"

	"github.com/podvm/podvm/internal/targuard"
)

// The host's side of CopyDirIn and CopyDirOut: a tree read into a tar
// stream, a tar stream written out as a tree, both through an [os.Root].

// writeTree writes the tree of root to tw, its entries named beneath
// prefix (root itself named prefix, and left out when prefix is ""),
// without following symlinks. Each entry is checked as the tar guard
// checks it, named relative to root: an absolute symlink, or one leading
// out of the tree, is refused with [ErrUnsafeArchive], as are devices,
// fifos and sockets.
func writeTree(tw *tar.Writer, root *os.Root, prefix string) error {
	links := map[string]bool{}
	return fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		// Times to the second, truncated: a tar header would round them.
		h := &tar.Header{Name: name, Mode: tarMode(info.Mode()), ModTime: info.ModTime().Truncate(time.Second)}
		var f *os.File
		switch info.Mode().Type() {
		case fs.ModeDir:
			h.Typeflag = tar.TypeDir
		case fs.ModeSymlink:
			h.Typeflag = tar.TypeSymlink
			if h.Linkname, err = root.Readlink(name); err != nil {
				return err
			}
		case 0:
			// Its size, mode and time as opened, for the header to match
			// the content.
			if f, err = root.Open(name); err != nil {
				return err
			}
			defer f.Close()
			if info, err = f.Stat(); err != nil {
				return err
			}
			if !info.Mode().IsRegular() {
				return fmt.Errorf("%s: replaced while copied", name)
			}
			h.Typeflag, h.Size, h.Mode, h.ModTime = tar.TypeReg, info.Size(), tarMode(info.Mode()), info.ModTime().Truncate(time.Second)
		default:
			return fmt.Errorf("%w %q: a %v is not copied: only directories, regular files and symlinks are", ErrUnsafeArchive, name, info.Mode().Type())
		}
		if err := targuard.Check(h, links); err != nil {
			return err
		}
		if name == "." && prefix == "" {
			return nil
		}
		h.Name = path.Join(prefix, name)
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if f == nil {
			return nil
		}
		if n, err := io.CopyN(tw, f, h.Size); err != nil {
			if err == io.EOF {
				return fmt.Errorf("%s: shrank from %d to %d bytes while copied", name, h.Size, n)
			}
			return err
		}
		return nil
	})
}

// extractor writes a tar stream's entries, named relative to the tree's
// root as [walkTar] names them, beneath the host directory dir.
type extractor struct {
	dir   string
	root  *os.Root
	links map[string]bool // the archive's symlinks, for targuard.Check
	dirs  []madeDir       // the directories made, dir included when it was
}

// madeDir is a directory whose mode and time are set once its entries
// are in.
type madeDir struct {
	name  string
	mode  fs.FileMode
	mtime time.Time
}

// extractTar writes the tree of the tar stream r beneath hostDir, as
// [CopyDirOut] does.
func extractTar(r io.Reader, hostDir string) error {
	x := &extractor{dir: hostDir}
	defer x.close()
	if err := walkTar(r, true, x.entry); err != nil {
		return err
	}
	return x.finish()
}

// entry writes one entry, whose content is r. The first must be the root
// ("."), a directory.
func (x *extractor) entry(h *tar.Header, r io.Reader) error {
	if x.root == nil {
		if h.Name != "." || h.Typeflag != tar.TypeDir {
			return fmt.Errorf("vm: copy dir out: the copied path is a %v, not a directory", h.FileInfo().Mode().Type())
		}
		return x.open(h)
	}
	if x.links == nil {
		x.links = map[string]bool{}
	}
	if err := targuard.Check(h, x.links); err != nil {
		return err
	}
	err := x.make(h, r)
	if errors.Is(err, fs.ErrNotExist) && h.Typeflag != tar.TypeLink {
		// An archive need not list a file's directories.
		if err = x.root.MkdirAll(path.Dir(h.Name), 0o755); err == nil {
			err = x.make(h, r)
		}
	}
	if err != nil {
		return fmt.Errorf("vm: copy dir out to %s: %w", x.dir, err)
	}
	return nil
}

// open opens dir, the root, making it when missing.
func (x *extractor) open(h *tar.Header) error {
	if _, err := os.Lstat(x.dir); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(x.dir, 0o700); err != nil {
			return fmt.Errorf("vm: copy dir out: %w", err)
		}
		x.dirs = append(x.dirs, madeDir{".", h.FileInfo().Mode().Perm(), h.ModTime})
	}
	root, err := os.OpenRoot(x.dir)
	if err != nil {
		return fmt.Errorf("vm: copy dir out: %w", err)
	}
	x.root = root
	return nil
}

// make writes the entry h, whose content is r, never replacing a file.
func (x *extractor) make(h *tar.Header, r io.Reader) error {
	mode := h.FileInfo().Mode().Perm() // setuid, setgid and sticky dropped
	switch h.Typeflag {
	case tar.TypeDir:
		err := x.root.Mkdir(h.Name, 0o700)
		if errors.Is(err, fs.ErrExist) {
			if fi, lerr := x.root.Lstat(h.Name); lerr == nil && fi.IsDir() {
				return nil // merged, its mode kept
			}
		}
		if err == nil {
			x.dirs = append(x.dirs, madeDir{h.Name, mode, h.ModTime})
		}
		return err
	case tar.TypeReg:
		f, err := x.root.OpenFile(h.Name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		if err == nil {
			err = f.Chmod(mode)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = x.root.Chtimes(h.Name, h.ModTime, h.ModTime)
		}
		return err
	case tar.TypeSymlink:
		return x.root.Symlink(h.Linkname, h.Name)
	case tar.TypeLink:
		// To a regular file only: a hard link to a symlink that was in
		// dir already is that symlink at another depth.
		fi, err := x.root.Lstat(h.Linkname)
		if err != nil {
			return err
		}
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%w %q: hard link to %q, a %v", ErrUnsafeArchive, h.Name, h.Linkname, fi.Mode().Type())
		}
		return x.root.Link(h.Linkname, h.Name)
	}
	return fmt.Errorf("%w %q: a %v is not copied to the host: only directories, regular files, symlinks and hard links are", ErrUnsafeArchive, h.Name, h.FileInfo().Mode().Type())
}

// finish sets the modes and times of the directories made, deepest
// first, now that their entries are in (a read-only one could not have
// taken them).
func (x *extractor) finish() error {
	for _, d := range slices.Backward(x.dirs) {
		err := x.root.Chmod(d.name, d.mode)
		if err == nil {
			err = x.root.Chtimes(d.name, d.mtime, d.mtime)
		}
		if err != nil {
			return fmt.Errorf("vm: copy dir out to %s: %w", x.dir, err)
		}
	}
	return nil
}

func (x *extractor) close() {
	if x.root != nil {
		x.root.Close()
	}
}
