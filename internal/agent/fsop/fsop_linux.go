package fsop

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// errnoCode maps the errno in err, if any, to an exit code.
func errnoCode(err error) Code {
	var errno unix.Errno
	if errors.As(err, &errno) {
		if code, ok := errnoCodes[errno]; ok {
			return code
		}
	}
	return CodeFailed
}

// errnoCodes are the errno values with a code of their own.
var errnoCodes = map[unix.Errno]Code{
	unix.ENOENT:       CodeNotExist,
	unix.EINVAL:       CodeInvalid,
	unix.EISDIR:       CodeIsDir,
	unix.ENOTDIR:      CodeNotDir,
	unix.ENAMETOOLONG: CodeNameTooLong,
	unix.EACCES:       CodePermission,
	unix.EPERM:        CodePermission,
	unix.EROFS:        CodeReadOnly,
	unix.ELOOP:        CodeLoop,
	unix.ENOSPC:       CodeNoSpace,
	unix.EDQUOT:       CodeNoSpace,
	unix.EEXIST:       CodeExist,
	unix.ENOTEMPTY:    CodeExist,
	unix.EFBIG:        CodeTooLarge,
}

// hasOpenat2 reports whether the kernel has openat2 (Linux 5.6).
var hasOpenat2 = sync.OnceValue(func() bool {
	fd, err := unix.Openat2(unix.AT_FDCWD, "/", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC})
	if err == nil {
		unix.Close(fd)
	}
	return err != unix.ENOSYS
})

// openFollow opens path, following symlinks but, where the kernel has
// openat2, no magic link.
func openFollow(path string, flags int) (int, error) {
	flags |= unix.O_CLOEXEC
	if !hasOpenat2() {
		return unix.Open(path, flags, 0)
	}
	return unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{Flags: uint64(flags), Resolve: unix.RESOLVE_NO_MAGICLINKS})
}

// statFollow is the stat of path, as openFollow resolves it.
func statFollow(path string) (unix.Stat_t, error) {
	var st unix.Stat_t
	fd, err := openFollow(path, unix.O_PATH)
	if err != nil {
		return st, err
	}
	defer unix.Close(fd)
	return st, unix.Fstat(fd, &st)
}

// fileMode is st's mode as an fs.FileMode.
func fileMode(st *unix.Stat_t) fs.FileMode {
	m := fs.FileMode(st.Mode & 0o777)
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFBLK:
		m |= fs.ModeDevice
	case unix.S_IFCHR:
		m |= fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFDIR:
		m |= fs.ModeDir
	case unix.S_IFIFO:
		m |= fs.ModeNamedPipe
	case unix.S_IFLNK:
		m |= fs.ModeSymlink
	case unix.S_IFSOCK:
		m |= fs.ModeSocket
	}
	if st.Mode&unix.S_ISUID != 0 {
		m |= fs.ModeSetuid
	}
	if st.Mode&unix.S_ISGID != 0 {
		m |= fs.ModeSetgid
	}
	if st.Mode&unix.S_ISVTX != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func mtime(st *unix.Stat_t) time.Time { return time.Unix(st.Mtim.Unix()) }

// notRegular is the error for a file that is not a regular file.
func notRegular(st *unix.Stat_t) error {
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return unix.EISDIR
	}
	return failf(CodeInvalid, "not a regular file (%v)", fileMode(st).Type())
}

// readlinkAt returns the target of symlink name in dirfd.
func readlinkAt(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		b := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, b)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(b[:n]), nil
		}
	}
}

// onlyWriter and onlyReader hide ReadFrom and WriteTo, so io.CopyBuffer
// uses its large buffer: between a file and a pipe, os.File falls back to
// io.Copy's 32 KiB.
type onlyWriter struct{ io.Writer }
type onlyReader struct{ io.Reader }

func readFile(path string, max int64, w io.Writer) error {
	// Look before opening: opening a FIFO, device or socket for reading
	// blocks, has effects or fails.
	st, err := statFollow(path)
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return notRegular(&st)
	}
	fd, err := openFollow(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	if err := unix.Fstat(fd, &st); err != nil { // it may have been replaced since
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return notRegular(&st)
	}
	if max < 0 {
		max = math.MaxInt64
	} else if st.Size > max {
		return failf(CodeTooLarge, "%d bytes, over the cap of %d", st.Size, max)
	}
	n, err := io.CopyBuffer(onlyWriter{w}, onlyReader{io.LimitReader(f, max)}, make([]byte, bufSize))
	if err != nil || n < max {
		return err
	}
	if k, _ := f.Read(make([]byte, 1)); k > 0 {
		return failf(CodeTooLarge, "over the cap of %d (the file grew while read)", max)
	}
	return nil
}

func writeFile(path string, size int64, perm uint32, r io.Reader) error {
	i := len(path) - 1
	for path[i] != '/' {
		i--
	}
	dir, base := path[:i+1], path[i+1:]
	if base == "" || base == "." || base == ".." {
		return unix.EISDIR
	}
	dfd, err := openFollow(dir, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	fd, err := createAt(dfd, base)
	unix.Close(dfd)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	buf := make([]byte, bufSize)
	var n int64
	if size < 0 {
		n, err = io.CopyBuffer(onlyWriter{f}, onlyReader{r}, buf)
	} else {
		n, err = io.CopyBuffer(onlyWriter{f}, onlyReader{io.LimitReader(r, size)}, buf)
		if err == nil && n == size {
			var more int64
			more, err = io.CopyBuffer(io.Discard, onlyReader{r}, buf)
			n += more
		}
	}
	if err != nil {
		return err
	}
	if size >= 0 && n != size {
		return failf(CodeInvalid, "%d bytes came, not %d", n, size)
	}
	// After the data: writing clears setuid and setgid.
	if err := unix.Fchmod(fd, perm); err != nil {
		return err
	}
	return f.Close()
}

// createAt opens name in dirfd for writing, truncated: an existing
// regular file in place, anything else but a directory removed first.
func createAt(dirfd int, name string) (int, error) {
	for range 3 {
		var st unix.Stat_t
		flags := unix.O_WRONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
		switch err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); {
		case err == unix.ENOENT:
			flags |= unix.O_CREAT | unix.O_EXCL
		case err != nil:
			return -1, err
		case st.Mode&unix.S_IFMT == unix.S_IFDIR:
			return -1, unix.EISDIR
		case st.Mode&unix.S_IFMT == unix.S_IFREG:
			flags |= unix.O_TRUNC
		default:
			if err := unix.Unlinkat(dirfd, name, 0); err != nil && err != unix.ENOENT {
				return -1, err
			}
			flags |= unix.O_CREAT | unix.O_EXCL
		}
		fd, err := unix.Openat(dirfd, name, flags, 0o600)
		switch err {
		case nil:
		case unix.EEXIST, unix.ENOENT, unix.ELOOP, unix.ENXIO: // it changed under us
			continue
		default:
			return -1, err
		}
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
			unix.Close(fd)
			continue
		}
		return fd, nil
	}
	return -1, failf(CodeFailed, "the file kept changing while it was replaced")
}

func listDir(path string, w io.Writer) error {
	fd, err := openFollow(path, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return err
	}
	slices.Sort(names)
	enc := newListEncoder(w)
	for _, name := range names {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == unix.ENOENT {
			continue // removed since
		} else if err != nil {
			return fmt.Errorf("entry %q: %w", name, err)
		}
		x := Entry{Name: name, Mode: fileMode(&st), ModTime: mtime(&st)}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			x.Size = st.Size
		case unix.S_IFLNK:
			if x.Link, err = readlinkAt(fd, name); err == unix.ENOENT {
				continue // removed since
			} else if err != nil {
				return fmt.Errorf("entry %q: %w", name, err)
			}
		}
		if err := enc.add(&x); err != nil {
			return err
		}
	}
	return enc.close()
}
