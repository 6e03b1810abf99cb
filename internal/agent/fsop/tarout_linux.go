package fsop

import (
	"archive/tar"
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// tarWriter writes a tree to a tar stream.
type tarWriter struct {
	tw      *tar.Writer
	buf     []byte
	links   map[fileID]string // first name of each file with several links
	changed error             // the first file that changed size while read
}

type fileID struct{ dev, ino uint64 }

// opener opens a file of the tree with the given flags: a file beneath
// the root never through a symlink, the root through any.
type opener func(flags int) (int, error)

func tarOut(path string, w io.Writer) error {
	name, err := tarName(path)
	if err != nil {
		return err
	}
	return writeTar(path, name, w)
}

// tarName is what tar-out names the root of path: its last component, or
// "." for "/".
func tarName(path string) (string, error) {
	name := strings.TrimRight(path, "/")
	name = name[strings.LastIndexByte(name, '/')+1:]
	switch name {
	case "":
		return ".", nil
	case ".", "..":
		return "", failf(CodeInvalid, "a path ending in %q", name)
	}
	return name, nil
}

// writeTar writes the tree at path to w as a tar stream, its root named
// name.
func writeTar(path, name string, w io.Writer) error {
	st, err := statFollow(path)
	if err != nil {
		return err
	}
	open := func(flags int) (int, error) {
		fd, err := openFollow(path, flags)
		if err != nil {
			return -1, err
		}
		var now unix.Stat_t
		if err := unix.Fstat(fd, &now); err != nil || now.Dev != st.Dev || now.Ino != st.Ino {
			unix.Close(fd)
			return -1, failf(CodeFailed, "replaced while read")
		}
		return fd, nil
	}
	bw := bufio.NewWriterSize(w, bufSize)
	t := &tarWriter{tw: tar.NewWriter(bw), buf: make([]byte, bufSize), links: map[fileID]string{}}
	if err := t.add(name, &st, open, nil); err != nil {
		return err
	}
	if err := t.tw.Close(); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	return t.changed
}

// add writes file name, whose lstat is st, and what is beneath it.
// readlink is nil for the root, which is never a symlink.
func (t *tarWriter) add(name string, st *unix.Stat_t, open opener, readlink func() (string, error)) error {
	sec, _ := st.Mtim.Unix()
	hdr := &tar.Header{
		Name:    name,
		Mode:    int64(st.Mode & 0o7777),
		Uid:     int(st.Uid),
		Gid:     int(st.Gid),
		ModTime: time.Unix(sec, 0),
		Format:  tar.FormatGNU, // raw bytes of any length in names
	}
	typ := st.Mode & unix.S_IFMT
	if typ != unix.S_IFDIR && st.Nlink > 1 {
		id := fileID{uint64(st.Dev), st.Ino}
		if first, ok := t.links[id]; ok {
			hdr.Typeflag, hdr.Linkname = tar.TypeLink, first
			return t.header(hdr)
		}
		t.links[id] = name
	}
	switch typ {
	case unix.S_IFREG:
		return t.file(hdr, open)
	case unix.S_IFDIR:
		hdr.Typeflag, hdr.Name = tar.TypeDir, name+"/"
		if err := t.header(hdr); err != nil {
			return err
		}
		return t.dir(name, open)
	case unix.S_IFLNK:
		target, err := readlink()
		if err != nil {
			return fmt.Errorf("entry %q: %w", name, err)
		}
		hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, target
	case unix.S_IFIFO:
		hdr.Typeflag = tar.TypeFifo
	case unix.S_IFCHR, unix.S_IFBLK:
		hdr.Typeflag = tar.TypeChar
		if typ == unix.S_IFBLK {
			hdr.Typeflag = tar.TypeBlock
		}
		hdr.Devmajor, hdr.Devminor = int64(unix.Major(uint64(st.Rdev))), int64(unix.Minor(uint64(st.Rdev)))
	case unix.S_IFSOCK:
		return failf(CodeUnsafe, "entry %q: a socket cannot be put in a tar", name)
	default:
		return failf(CodeUnsafe, "entry %q: a file of unknown type %#o", name, typ)
	}
	return t.header(hdr)
}

func (t *tarWriter) header(hdr *tar.Header) error {
	if err := t.tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("entry %q: %w", hdr.Name, err)
	}
	return nil
}

// file writes a regular file: exactly the size of its header.
func (t *tarWriter) file(hdr *tar.Header, open opener) error {
	fd, err := open(unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY)
	if err != nil {
		return fmt.Errorf("entry %q: %w", hdr.Name, err)
	}
	f := os.NewFile(uintptr(fd), hdr.Name)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("entry %q: %w", hdr.Name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return failf(CodeFailed, "entry %q: replaced while read", hdr.Name)
	}
	hdr.Size = st.Size
	if err := t.header(hdr); err != nil {
		return err
	}
	n, err := io.CopyBuffer(onlyWriter{t.tw}, onlyReader{io.LimitReader(f, hdr.Size)}, t.buf)
	if err != nil {
		return fmt.Errorf("entry %q: %w", hdr.Name, err)
	}
	short := n < hdr.Size
	for n < hdr.Size { // it shrank: pad
		zero := t.buf[:min(int64(len(t.buf)), hdr.Size-n)]
		clear(zero)
		k, err := t.tw.Write(zero)
		if err != nil {
			return err
		}
		n += int64(k)
	}
	if err := unix.Fstat(fd, &st); short || err == nil && st.Size != hdr.Size {
		if t.changed == nil {
			t.changed = failf(CodeFailed, "entry %q: changed size while read", hdr.Name)
		}
	}
	return nil
}

// dir writes what is in directory name, sorted by name.
func (t *tarWriter) dir(name string, open opener) error {
	fd, err := open(unix.O_RDONLY | unix.O_DIRECTORY)
	if err != nil {
		return fmt.Errorf("entry %q: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("entry %q: %w", name, err)
	}
	slices.Sort(names)
	for _, base := range names {
		child := name + "/" + base
		if name == "." {
			child = base
		}
		var st unix.Stat_t
		if err := unix.Fstatat(fd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err == unix.ENOENT {
			continue // removed since
		} else if err != nil {
			return fmt.Errorf("entry %q: %w", child, err)
		}
		open := func(flags int) (int, error) {
			return unix.Openat(fd, base, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		}
		readlink := func() (string, error) { return readlinkAt(fd, base) }
		if err := t.add(child, &st, open, readlink); err != nil {
			return err
		}
	}
	return nil
}
