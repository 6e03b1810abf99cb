package vm

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"
)

// The file calls: [WriteFile], [WriteFileFrom], [ReadFile], [ReadDir],
// [CopyDirIn] and [CopyDirOut] work on any [VM], the tar streams of its
// CopyIn and CopyOut carrying the files, unless the VM serves some of them
// itself ([FileServer]). Paths in the sandbox are absolute; whatever
// the sandbox sends is checked as the tar guard checks it ([ErrUnsafeArchive]).
//
// Errors, besides those of the VM ([ErrNotCreated], [ErrRemoved],
// [ErrNoSuchContainer], ...), are the same whichever way a call travels
// (podvm's agent, or Podman's copies with [Config.PodmanExec]); each
// failure matches one of these, with [errors.Is]:
//
//   - [fs.ErrNotExist]: the path, or a directory above it, is missing;
//   - [syscall.ENOTDIR]: a directory above the path, or the path where a
//     directory is wanted (ReadDir, CopyDirOut, CopyDirIn, CopyIn), is
//     not a directory;
//   - [syscall.EISDIR]: the path is a directory where a file is wanted
//     (WriteFile, ReadFile);
//   - [fs.ErrInvalid]: an invalid argument (a relative sandbox path, a
//     mode with a file type, a negative size or cap), or a file that
//     ReadFile cannot read: not a regular file (a device such as
//     /dev/null, a fifo, a socket), as [os.CopyFS] says of one;
//   - [syscall.ENAMETOOLONG]: a name of the path is longer than 255
//     bytes (NAME_MAX), or the path is longer than 4095 (PATH_MAX):
//     refused before the sandbox is asked;
//   - [syscall.ELOOP]: too many levels of symbolic links;
//   - [fs.ErrPermission]: the sandbox refused the access (EACCES, EPERM);
//     the file calls act as the sandbox's root, as Podman's copies do,
//     whatever [Config.User];
//   - [syscall.EROFS]: a write to a read-only filesystem
//     ([Config.ReadOnlyRootfs], a read-only mount);
//   - [syscall.ENOSPC]: the filesystem is full;
//   - [ErrFileTooLarge]: a file over ReadFile's cap;
//   - [ErrUnsafeArchive]: an entry refused by the tar guard;
//   - [fs.ErrExist]: CopyDirOut found a file in its way on the host.
//
// A failure that none describes matches [ErrPodman] (a copy that Podman
// failed for a reason it did not say, as podman-remote's cp does not),
// or no sentinel (the host's side of a copy failed).

// ErrFileTooLarge: [ReadFile] found a file larger than its cap. The error
// names the file's size and the cap.
var ErrFileTooLarge = errors.New("vm: file too large")

// FileInfo describes one entry of a sandbox directory, as [ReadDir] lists
// it.
type FileInfo struct {
	// Name is the entry's base name.
	Name string
	// Size is a regular file's length in bytes; 0 for other entries. A
	// hard link lists as a regular file whose Size is its target's when
	// the target is in the same directory, else 0.
	Size int64
	// Mode holds the type bits ([fs.ModeDir], [fs.ModeSymlink], ...) and
	// the permissions, setuid, setgid and sticky bits, as in io/fs.
	Mode fs.FileMode
	// ModTime is the modification time, to the second.
	ModTime time.Time
	// Link is a symlink's target, as stored (it may not exist); "" for
	// other entries.
	Link string
}

// FileServer is implemented by a [VM] that serves file calls natively,
// without a tar stream (a backend with an agent in the sandbox, say).
// [WriteFile], [WriteFileFrom], [ReadFile] and [ReadDir] check their
// arguments, then, when the VM is a FileServer, call it, with the sandbox
// path cleaned and absolute. A method that returns an error matching
// [ErrNotSupported] (before reading r, for WriteFile) sends the call
// through the VM's tar streams instead. Each method keeps the promises,
// errors included, of the function of the same name.
type FileServer interface {
	// WriteFile writes size bytes of r (all of r when size is -1).
	WriteFile(ctx context.Context, path string, r io.Reader, size int64, perm fs.FileMode) error
	ReadFile(ctx context.Context, path string, maxBytes int64) ([]byte, error)
	ReadDir(ctx context.Context, dir string) ([]FileInfo, error)
}

// WriteFile writes data to the file name of the sandbox, creating it with
// perm (permission bits, and setuid, setgid or sticky), or replacing it,
// as [os.WriteFile] does; the file is owned by the sandbox's user. Its
// directory must exist, else the error matches [fs.ErrNotExist]
// ([syscall.ENOTDIR] when a file is in the way); a name that is a
// directory matches [syscall.EISDIR]; see the file calls' errors above
// for the rest. When WriteFile fails, the file may exist with part of
// data.
func WriteFile(ctx context.Context, v VM, name string, data []byte, perm fs.FileMode) error {
	return WriteFileFrom(ctx, v, name, bytes.NewReader(data), int64(len(data)), perm)
}

// WriteFileFrom is [WriteFile] with the file's content read from r: size
// bytes, or, when size is -1, all of r. A r that ends before size bytes,
// or holds more, fails the write with an error matching [fs.ErrInvalid]. A [FileServer] (every sandbox with
// podvm's agent) streams r into the file. Through a VM's CopyIn, a tar
// entry states its size before its content, so a content of unknown size
// is first spooled to a temporary file on the host (in [os.TempDir]),
// removed before WriteFileFrom returns.
func WriteFileFrom(ctx context.Context, v VM, name string, r io.Reader, size int64, perm fs.FileMode) error {
	const op = "write file"
	p, err := cleanFile(op, name)
	if err != nil {
		return err
	}
	if perm&^(fs.ModePerm|fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
		return fmt.Errorf("vm: %s %s: %w: mode %v is not permission bits", op, p, fs.ErrInvalid, perm)
	}
	if size < -1 {
		return fmt.Errorf("vm: %s %s: %w: size %d", op, p, fs.ErrInvalid, size)
	}
	if fsrv, ok := capability[FileServer](v); ok {
		if err := fsrv.WriteFile(ctx, p, r, size, perm); !errors.Is(err, ErrNotSupported) {
			return err
		}
	}
	if size == -1 {
		spool, n, err := spoolTemp(r)
		if err != nil {
			return fmt.Errorf("vm: %s %s: spooling the content: %w", op, p, err)
		}
		defer os.Remove(spool.Name())
		defer spool.Close()
		r, size = spool, n
	}
	h := &tar.Header{Typeflag: tar.TypeReg, Name: path.Base(p), Mode: tarMode(perm), Size: size, ModTime: time.Now()}
	err = copyIn(ctx, v, op, p, path.Dir(p), func(tw *tar.Writer) error {
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		return copyExactly(tw, r, size)
	})
	if errors.Is(err, ErrPodman) && isDir(ctx, v, p) {
		// Podman failed to replace a directory with the file, saying
		// why or not ("file exists", or nothing through podman-remote).
		return fmt.Errorf("vm: %s %s: %w: %w", op, p, syscall.EISDIR, nativeError(err))
	}
	return err
}

// isDir reports whether p is a directory of the sandbox, reading no more
// of its copy than the first entry.
func isDir(ctx context.Context, v VM, p string) bool {
	dir := false
	_ = walkOnce(ctx, v, "stat", p, false, func(h *tar.Header, _ io.Reader) error {
		dir = h.Name == "." && h.Typeflag == tar.TypeDir
		return errStop
	})
	return dir
}

// ReadFile returns the content of the file name of the sandbox, following
// symlinks, as [os.ReadFile] does. A file larger than maxBytes (0 allows
// only empty files) is not read: the error names its size and matches
// [ErrFileTooLarge]. A missing path matches [fs.ErrNotExist], a
// directory [syscall.EISDIR], any other file that is not regular (a
// device, a fifo, a socket) [fs.ErrInvalid]; see the file calls' errors
// above for the rest.
func ReadFile(ctx context.Context, v VM, name string, maxBytes int64) ([]byte, error) {
	const op = "read file"
	p, err := cleanFile(op, name)
	if err != nil {
		return nil, err
	}
	if maxBytes < 0 {
		return nil, fmt.Errorf("vm: %s %s: %w: maxBytes %d", op, p, fs.ErrInvalid, maxBytes)
	}
	if fsrv, ok := capability[FileServer](v); ok {
		if data, err := fsrv.ReadFile(ctx, p, maxBytes); !errors.Is(err, ErrNotSupported) {
			return data, err
		}
	}
	var data []byte
	seen := false // p's own entry
	err = walkOut(ctx, v, op, p, true, func(h *tar.Header, r io.Reader) error {
		switch {
		case h.Name != ".":
			return nil // nothing but p is expected
		case h.Typeflag == tar.TypeDir:
			return fmt.Errorf("vm: %s %s: %w", op, p, syscall.EISDIR)
		case h.Typeflag != tar.TypeReg:
			return fmt.Errorf("vm: %s %s: %w: not a regular file (%v)", op, p, fs.ErrInvalid, h.FileInfo().Mode().Type())
		case h.Size > maxBytes:
			return fmt.Errorf("vm: %s %s: %d bytes, over the cap of %d: %w", op, p, h.Size, maxBytes, ErrFileTooLarge)
		}
		seen = true
		var err error
		data, err = io.ReadAll(r)
		return err
	})
	if !seen && (err == nil || errors.Is(err, errNoEntry)) {
		// Podman's copies leave devices and sockets out.
		return nil, fmt.Errorf("vm: %s %s: %w: not a regular file (a copy of it holds no entry)", op, p, fs.ErrInvalid)
	}
	if err != nil {
		return nil, err
	}
	return data, nil
}

// ReadDir lists the directory dir of the sandbox, following symlinks to
// it, sorted by name, as [os.ReadDir] does. A missing dir matches
// [fs.ErrNotExist]; a file that is not a directory [syscall.ENOTDIR].
// A listing is names, modes and link targets, and writes nothing: a
// symlink to an absolute path, or one leading out of dir, is listed,
// whichever way the call travels. Through the tar stream of CopyOut the
// whole tree beneath dir travels, contents included, and is read and
// dropped: only dir's own entries are kept in memory; a VM that is a
// [FileServer] (every sandbox with podvm's agent) sends the listing
// alone. Through the CopyOut of a VM other than podvm's own, a tree
// holding an entry that its tar guard refuses cannot be listed: the
// error matches [ErrUnsafeArchive].
func ReadDir(ctx context.Context, v VM, dir string) ([]FileInfo, error) {
	const op = "read dir"
	p, err := cleanFile(op, dir)
	if err != nil {
		return nil, err
	}
	if fsrv, ok := capability[FileServer](v); ok {
		if list, err := fsrv.ReadDir(ctx, p); !errors.Is(err, ErrNotSupported) {
			return list, err
		}
	}
	var list []FileInfo
	sizes := map[string]int64{} // of the regular files listed, for hard links
	seen := false               // dir's own entry
	err = walkOut(ctx, v, op, p, false, func(h *tar.Header, _ io.Reader) error {
		switch {
		case h.Name == ".":
			if h.Typeflag != tar.TypeDir {
				return fmt.Errorf("vm: %s %s: %w", op, p, syscall.ENOTDIR)
			}
			seen = true
			return nil
		case strings.Contains(h.Name, "/"):
			return nil // deeper down
		}
		fi := FileInfo{Name: h.Name, Mode: h.FileInfo().Mode(), ModTime: h.ModTime}
		switch h.Typeflag {
		case tar.TypeReg:
			fi.Size = h.Size
			sizes[h.Name] = h.Size
		case tar.TypeSymlink:
			fi.Link = h.Linkname
		case tar.TypeLink:
			fi.Mode &^= fs.ModeType
			fi.Size = sizes[h.Linkname] // relative to dir by now, or absent
		}
		list = append(list, fi)
		return nil
	})
	if !seen && (err == nil || errors.Is(err, errNoEntry)) {
		return nil, fmt.Errorf("vm: %s %s: %w (a copy of it holds no entry)", op, p, syscall.ENOTDIR)
	}
	if err != nil {
		return nil, err
	}
	slices.SortFunc(list, func(a, b FileInfo) int { return strings.Compare(a.Name, b.Name) })
	return list, nil
}

// CopyDirIn copies the tree of the host directory hostDir into the
// directory sandboxDir of the sandbox: directories, regular files and
// symlinks, with their permission, setuid, setgid and sticky bits and
// their modification times, owned by the sandbox's user. sandboxDir is
// created when missing (its parent must exist) and takes hostDir's mode;
// what it holds already stays unless the copy replaces it. Symlinks are
// copied as symlinks, never followed; like the tar guard, CopyDirIn
// refuses, with [ErrUnsafeArchive], a symlink that is absolute or leads
// out of hostDir, and devices, fifos and sockets. Hard-linked files are
// copied as separate files. A file that shrinks while it is copied fails
// the copy. A sandboxDir that is a file, or under one, matches
// [syscall.ENOTDIR]; one whose parent is missing [fs.ErrNotExist]. When
// CopyDirIn fails, part of the tree may have been copied.
func CopyDirIn(ctx context.Context, v VM, hostDir, sandboxDir string) error {
	const op = "copy dir in"
	p, err := cleanPath(op, sandboxDir)
	if err != nil {
		return err
	}
	root, err := os.OpenRoot(hostDir)
	if err != nil {
		return fmt.Errorf("vm: %s: %w", op, err)
	}
	defer root.Close()
	if p == "/" { // named relative to it, and "/" keeps its mode
		return copyIn(ctx, v, op, p, p, func(tw *tar.Writer) error { return writeTree(tw, root, "") })
	}
	// Entries are named relative to p, p's own first as "./", and
	// extracted in p, so that the destination of the copy is p itself:
	// through the agent, a symlink that code in the sandbox planted under
	// p cannot lead an entry out of it, not even into p's parent. A p
	// that is missing is made first, as an archive of p alone extracted
	// in its parent.
	var hostErr error // the host's side failed: not a missing p
	tree := func(tw *tar.Writer) error {
		err := writeTree(tw, root, ".")
		if !errors.Is(err, errStreamEnded) { // the copy ended first
			hostErr = err
		}
		return err
	}
	err = copyIn(ctx, v, op, p, p, tree)
	if hostErr != nil || !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	fi, err := root.Stat(".")
	if err != nil {
		return fmt.Errorf("vm: %s: %w", op, err)
	}
	h := &tar.Header{Typeflag: tar.TypeDir, Name: path.Base(p) + "/", Mode: tarMode(fi.Mode()), ModTime: fi.ModTime().Truncate(time.Second)}
	if err := copyIn(ctx, v, op, p, path.Dir(p), func(tw *tar.Writer) error { return tw.WriteHeader(h) }); err != nil {
		return err
	}
	return copyIn(ctx, v, op, p, p, tree)
}

// CopyDirOut copies the tree of the directory sandboxDir of the sandbox
// (following a symlink that sandboxDir itself is) into the host
// directory hostDir, which is created, with sandboxDir's mode, when
// missing. It copies directories, regular files, symlinks (as symlinks)
// and hard links within the tree, with their permission bits and
// modification times; setuid, setgid and sticky bits are dropped, and
// the files are owned by the calling user. Nothing is written outside
// hostDir, whatever the sandbox's tree holds: every entry is checked as
// the tar guard checks it, relative to hostDir, and written through an
// [os.Root]; an entry that is refused (a symlink leading out of the tree,
// a device, a fifo, a socket) fails the copy with an error matching
// [ErrUnsafeArchive] and naming it. CopyDirOut merges into directories
// that exist (keeping their modes) and never replaces a file: one that
// exists fails the copy with an error matching [fs.ErrExist], as
// [os.CopyFS] does. A sandboxDir that is missing matches
// [fs.ErrNotExist]; one that is not a directory [syscall.ENOTDIR]. When
// CopyDirOut fails, part of the tree may have been written.
func CopyDirOut(ctx context.Context, v VM, sandboxDir, hostDir string) error {
	const op = "copy dir out"
	p, err := cleanFile(op, sandboxDir)
	if err != nil {
		return err
	}
	x := &extractor{dir: hostDir}
	defer x.close()
	seen := false
	err = walkOut(ctx, v, op, p, true, func(h *tar.Header, r io.Reader) error {
		if h.Name == "." {
			if h.Typeflag != tar.TypeDir {
				return fmt.Errorf("vm: %s %s: %w", op, p, syscall.ENOTDIR)
			}
			seen = true
		}
		return x.entry(h, r)
	})
	if !seen && (err == nil || errors.Is(err, errNoEntry)) {
		return fmt.Errorf("vm: %s %s: %w (a copy of it holds no entry)", op, p, syscall.ENOTDIR)
	}
	if err == nil {
		err = x.finish()
	}
	return err
}
