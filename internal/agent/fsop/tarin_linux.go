package fsop

import (
	"archive/tar"
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// errOut is the failure of an entry whose path leads out of the
// destination through a symlink.
var errOut = failf(CodeUnsafe, "a symlink under the destination leads out of it")

// errSymlink is the failure, without openat2, of an entry with a symlink
// among its parents: it is not followed, wherever it leads.
var errSymlink = failf(CodeUnsafe, "a symlink under the destination is followed only where the kernel has openat2")

// extractor extracts a tar stream beneath a directory.
type extractor struct {
	root    int  // the destination: an O_PATH descriptor
	beneath bool // resolve with openat2(RESOLVE_BENEATH); else walk
	buf     []byte
	dirs    []dirAttrs // applied at the end, last first
}

// dirAttrs are what a directory entry sets once its contents are in.
type dirAttrs struct {
	name  string
	parts []string
	mode  uint32
	mtime time.Time
}

func tarIn(dir string, r io.Reader) error { return extract(dir, r, hasOpenat2()) }

// extract is tar-in, resolving paths with openat2 if beneath, else by a
// walk that follows no symlink.
func extract(dir string, r io.Reader, beneath bool) error {
	root, err := openFollow(dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	defer unix.Close(root)
	x := &extractor{root: root, beneath: beneath, buf: make([]byte, bufSize)}
	br := bufio.NewReaderSize(r, bufSize)
	tr := tar.NewReader(br)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			// Take what follows the end (GNU tar pads to a 10 KiB record),
			// so the writer does not fail writing it.
			if _, err := io.Copy(io.Discard, br); err != nil {
				return err
			}
			break
		}
		if err != nil {
			return fmt.Errorf("reading the tar stream: %w", err)
		}
		if err := x.entry(hdr, tr); err != nil {
			// Only the destination is "not there" (CodeNotExist): an
			// entry's ENOENT (a parent removed meanwhile) is a failure.
			if errors.Is(err, unix.ENOENT) {
				return failf(CodeFailed, "entry %q: %v", hdr.Name, err)
			}
			return fmt.Errorf("entry %q: %w", hdr.Name, err)
		}
	}
	for i := len(x.dirs) - 1; i >= 0; i-- {
		if err := x.setDir(&x.dirs[i]); err != nil {
			return fmt.Errorf("entry %q: %w", x.dirs[i].name, err)
		}
	}
	return nil
}

// splitName is name's components, refusing an absolute name or "..".
// "." and empty components are dropped: no components is the destination.
func splitName(name string) ([]string, error) {
	if strings.HasPrefix(name, "/") {
		return nil, failf(CodeUnsafe, "an absolute name")
	}
	var parts []string
	for p := range strings.SplitSeq(name, "/") {
		switch p {
		case "", ".":
		case "..":
			return nil, failf(CodeUnsafe, `a name with ".."`)
		default:
			parts = append(parts, p)
		}
	}
	return parts, nil
}

// resolve opens the directory parts beneath the destination with flags,
// following no symlink that leads out of it (without openat2, none at
// all; with O_NOFOLLOW in flags, not parts' last one either).
func (x *extractor) resolve(parts []string, flags int) (int, error) {
	flags |= unix.O_DIRECTORY | unix.O_CLOEXEC
	if x.beneath {
		path := "."
		if len(parts) > 0 {
			path = strings.Join(parts, "/")
		}
		fd, err := unix.Openat2(x.root, path, &unix.OpenHow{
			Flags:   uint64(flags),
			Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
		})
		if err == unix.EXDEV {
			return -1, errOut
		}
		return fd, err
	}
	walk := unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	if len(parts) == 0 {
		walk = flags
	}
	fd, err := unix.Openat(x.root, ".", walk, 0)
	for i := 0; i < len(parts) && err == nil; i++ {
		if i == len(parts)-1 {
			walk = flags | unix.O_NOFOLLOW
		}
		var next int
		next, err = unix.Openat(fd, parts[i], walk, 0)
		if err == unix.ENOTDIR || err == unix.ELOOP {
			var st unix.Stat_t
			if unix.Fstatat(fd, parts[i], &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
				err = errSymlink
			}
		}
		unix.Close(fd)
		fd = next
	}
	return fd, err
}

// parent opens the directory parts beneath the destination, creating
// what is missing of it.
func (x *extractor) parent(parts []string) (int, error) {
	fd, err := x.resolve(parts, unix.O_PATH)
	if err != unix.ENOENT || len(parts) == 0 {
		return fd, err
	}
	up, err := x.parent(parts[:len(parts)-1])
	if err != nil {
		return -1, err
	}
	err = unix.Mkdirat(up, parts[len(parts)-1], 0o777)
	unix.Close(up)
	if err != nil && err != unix.EEXIST {
		return -1, err
	}
	return x.resolve(parts, unix.O_PATH)
}

// entry extracts one entry, whose content r holds.
func (x *extractor) entry(hdr *tar.Header, r io.Reader) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader { // a comment, as git archive writes
		return nil
	}
	parts, err := splitName(hdr.Name)
	if err != nil {
		return err
	}
	mode := uint32(hdr.Mode & 0o7777)
	if len(parts) == 0 { // the destination itself
		if hdr.Typeflag != tar.TypeDir {
			return unix.EISDIR
		}
		x.dirs = append(x.dirs, dirAttrs{hdr.Name, nil, mode, hdr.ModTime})
		return nil
	}
	dirfd, err := x.parent(parts[:len(parts)-1])
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	base := parts[len(parts)-1]
	switch hdr.Typeflag {
	case tar.TypeDir:
		err := unix.Mkdirat(dirfd, base, 0o700)
		var st unix.Stat_t
		if err == unix.EEXIST && unix.Fstatat(dirfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err = unix.Unlinkat(dirfd, base, 0); err == nil {
				err = unix.Mkdirat(dirfd, base, 0o700)
			}
		}
		if err != nil && err != unix.EEXIST {
			return err
		}
		x.dirs = append(x.dirs, dirAttrs{hdr.Name, parts, mode, hdr.ModTime})
		return nil
	case tar.TypeReg, tar.TypeGNUSparse: // r fills a sparse file's holes
		err = x.file(dirfd, base, mode, r)
	case tar.TypeSymlink:
		err = replace(dirfd, base, func() error { return unix.Symlinkat(hdr.Linkname, dirfd, base) })
	case tar.TypeLink:
		err = x.link(dirfd, base, hdr.Linkname)
	case tar.TypeFifo:
		err = replace(dirfd, base, func() error { return unix.Mkfifoat(dirfd, base, 0o600) })
		if err == nil {
			err = chmodFifo(dirfd, base, mode)
		}
	case tar.TypeChar, tar.TypeBlock:
		return failf(CodeUnsafe, "a device cannot be created")
	default:
		return failf(CodeUnsafe, "tar entry type %q is not supported", hdr.Typeflag)
	}
	if err != nil {
		return err
	}
	return setMtime(dirfd, base, hdr.ModTime, unix.AT_SYMLINK_NOFOLLOW)
}

// replace runs create, and if something is in its way removes that (but
// not a directory) and runs create again.
func replace(dirfd int, name string, create func() error) error {
	err := create()
	if err != unix.EEXIST {
		return err
	}
	if err := unix.Unlinkat(dirfd, name, 0); err != nil && err != unix.ENOENT {
		return err
	}
	return create()
}

// file creates regular file name in dirfd with r's content and mode.
func (x *extractor) file(dirfd int, name string, mode uint32, r io.Reader) error {
	var fd int
	err := replace(dirfd, name, func() (err error) {
		fd, err = unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		return err
	})
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if _, err := io.CopyBuffer(onlyWriter{f}, onlyReader{r}, x.buf); err != nil {
		return err
	}
	if err := unix.Fchmod(fd, mode); err != nil { // after the data: writing clears setuid
		return err
	}
	return f.Close()
}

// link makes name in dirfd a hard link to target, an earlier entry.
func (x *extractor) link(dirfd int, name, target string) error {
	parts, err := splitName(target)
	if err != nil {
		return fmt.Errorf("link target: %w", err)
	}
	if len(parts) == 0 {
		return unix.EISDIR
	}
	tdir, err := x.resolve(parts[:len(parts)-1], unix.O_PATH)
	if err != nil {
		return fmt.Errorf("link target: %w", err)
	}
	defer unix.Close(tdir)
	return replace(dirfd, name, func() error { return unix.Linkat(tdir, parts[len(parts)-1], dirfd, name, 0) })
}

// setDir applies a directory entry's mode and mtime.
func (x *extractor) setDir(d *dirAttrs) error {
	fd, err := x.resolve(d.parts, unix.O_RDONLY|unix.O_NOFOLLOW)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, d.mode); err != nil {
		return err
	}
	return setMtime(fd, ".", d.mtime, 0)
}

// chmodFifo sets the mode of FIFO name in dirfd, through a descriptor:
// what was put in its place since it was made is left alone.
func chmodFifo(dirfd int, name string, mode uint32) error {
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return failf(CodeFailed, "replaced while extracted")
	}
	return unix.Fchmod(fd, mode)
}

// setMtime sets the mtime of name in dirfd, leaving its atime.
func setMtime(dirfd int, name string, mtime time.Time, flags int) error {
	ts, err := unix.TimeToTimespec(mtime)
	if err != nil {
		return err
	}
	return unix.UtimesNanoAt(dirfd, name, []unix.Timespec{{Nsec: unix.UTIME_OMIT}, ts}, flags)
}
