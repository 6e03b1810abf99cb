package libpod

import (
	"encoding/binary"
	"errors"
	"io"
	"net/http"
)

// Stream types of the multiplexed attach protocol: each frame starts with
// an 8-byte header, [type, 0, 0, 0, size (big-endian uint32)].
const (
	streamStdin  = 0
	streamStdout = 1
	streamStderr = 2
	streamSystem = 3 // an error from the service itself
)

// demuxBuffer is the one buffer a Demux copies through; a frame of any
// size passes in pieces of this many bytes, the last one shorter.
const demuxBuffer = 32 << 10

// maxSystemFrame bounds what is kept of a service error frame.
const maxSystemFrame = 64 << 10

// Demux copies the multiplexed stream r to stdout and stderr, frame by
// frame (a frame of up to 32 KiB in one Write), through one fixed buffer: it holds nothing
// beyond it, however large a frame or the stream. Frames echoing stdin
// are dropped. It returns nil when r ends between two frames; an
// [*Error] with Status 0 when r ends inside a frame or fails (the
// connection was dropped mid-stream); an [*Error] with libpod's message
// for a service error frame; and the first error of stdout or stderr.
func Demux(r io.Reader, stdout, stderr io.Writer) error {
	buf := make([]byte, demuxBuffer)
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if err == io.EOF {
				return nil
			}
			return &Error{Op: "exec stream", Err: err}
		}
		size := int64(binary.BigEndian.Uint32(hdr[4:]))
		var w io.Writer
		switch hdr[0] {
		case streamStdout:
			w = stdout
		case streamStderr:
			w = stderr
		case streamStdin:
			w = io.Discard
		case streamSystem:
			msg, err := io.ReadAll(io.LimitReader(r, min(size, maxSystemFrame)))
			if err != nil {
				return &Error{Op: "exec stream", Err: err}
			}
			return &Error{Op: "exec stream", Status: http.StatusInternalServerError, Message: string(msg)}
		default:
			return &Error{Op: "exec stream", Err: errors.New("unknown stream type in frame header (not a multiplexed stream?)")}
		}
		if err := copyFrame(w, r, size, buf); err != nil {
			return err
		}
	}
}

// copyFrame copies size bytes of r to w through buf, a buffer's worth
// per Write: a frame that fits in buf reaches w in one Write, however r
// splits it, so that a writer can judge a frame whole.
func copyFrame(w io.Writer, r io.Reader, size int64, buf []byte) error {
	for size > 0 {
		n, err := io.ReadFull(r, buf[:min(size, int64(len(buf)))])
		if n > 0 {
			size -= int64(n)
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return &Error{Op: "exec stream", Err: err}
		}
	}
	return nil
}
