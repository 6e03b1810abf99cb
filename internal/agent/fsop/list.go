package fsop

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"
)

// Entry is one entry of a directory, as list reports it.
type Entry struct {
	// Name is the entry's name: raw bytes, not necessarily UTF-8.
	Name string
	// Size is the length of a regular file; 0 for anything else.
	Size int64
	// Mode has Go's type bits and fs.ModeSetuid, fs.ModeSetgid and
	// fs.ModeSticky besides the permission bits.
	Mode fs.FileMode
	// ModTime is the modification time, to the nanosecond.
	ModTime time.Time
	// Link is a symlink's target as stored (raw bytes); "" otherwise.
	Link string
}

// The listing's encoding: the magic, then per entry a 1 byte, the name,
// size (int64), mode (uint32, fs.FileMode), mtime (int64 seconds, uint32
// nanoseconds) and link; then a 0 byte. Strings are a uint32 length and
// the bytes; numbers are big endian.
const listMagic = "pvl1"

// maxString bounds a decoded string: names are at most 255 bytes and link
// targets at most 4095 on Linux.
const maxString = 1 << 16

// listEncoder writes a listing.
type listEncoder struct {
	w   *bufio.Writer
	buf []byte
}

func newListEncoder(w io.Writer) *listEncoder {
	bw := bufio.NewWriterSize(w, bufSize)
	bw.WriteString(listMagic)
	return &listEncoder{w: bw}
}

func (e *listEncoder) add(x *Entry) error {
	b := append(e.buf[:0], 1)
	b = appendString(b, x.Name)
	b = binary.BigEndian.AppendUint64(b, uint64(x.Size))
	b = binary.BigEndian.AppendUint32(b, uint32(x.Mode))
	b = binary.BigEndian.AppendUint64(b, uint64(x.ModTime.Unix()))
	b = binary.BigEndian.AppendUint32(b, uint32(x.ModTime.Nanosecond()))
	b = appendString(b, x.Link)
	e.buf = b
	_, err := e.w.Write(b)
	return err
}

// close ends the listing and flushes it.
func (e *listEncoder) close() error {
	e.w.WriteByte(0)
	return e.w.Flush()
}

func appendString(b []byte, s string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// errBadList is the error of DecodeList for a stream that is not a
// listing or is cut short.
var errBadList = errors.New("fsop: not a complete listing")

// DecodeList reads a listing that list wrote. A stream that ends before
// the listing's end is an error: the listing may be incomplete.
func DecodeList(r io.Reader) ([]Entry, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	magic := make([]byte, len(listMagic))
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != listMagic {
		return nil, errBadList
	}
	var entries []Entry
	for {
		more, err := br.ReadByte()
		if err != nil || more > 1 {
			return nil, errBadList
		}
		if more == 0 {
			return entries, nil
		}
		var x Entry
		var fixed [24]byte
		if x.Name, err = readString(br); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(br, fixed[:]); err != nil {
			return nil, errBadList
		}
		x.Size = int64(binary.BigEndian.Uint64(fixed[0:]))
		x.Mode = fs.FileMode(binary.BigEndian.Uint32(fixed[8:]))
		x.ModTime = time.Unix(int64(binary.BigEndian.Uint64(fixed[12:])), int64(binary.BigEndian.Uint32(fixed[20:])))
		if x.Link, err = readString(br); err != nil {
			return nil, err
		}
		entries = append(entries, x)
	}
}

func readString(r io.Reader) (string, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return "", errBadList
	}
	size := binary.BigEndian.Uint32(n[:])
	if size > maxString {
		return "", fmt.Errorf("fsop: a string of %d bytes in a listing", size)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(r, b); err != nil {
		return "", errBadList
	}
	return string(b), nil
}
