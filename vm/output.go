package vm

import (
	"errors"
	"io"
	"sync"
)

// Output is one output stream of a [Process] (its stdout or its stderr),
// kept as it comes in a bounded buffer: its last Command.MaxOutputBytes
// bytes (exec.DefaultMaxOutputBytes by default). Readers read it from any
// offset still in the buffer, as often as they like, and block for what
// has not come yet; what fell out of the buffer before a reader got to it
// is counted, never silently skipped. Writing to it never blocks, so a
// process whose output nobody reads is never held back. Its methods are
// safe for concurrent use.
type Output struct {
	mu     sync.Mutex
	cond   sync.Cond
	size   int    // the most bytes kept
	buf    []byte // grows to size; then circular: offset o is at buf[o%size] while o >= end-size
	end    int64  // bytes written so far
	closed bool   // the stream ended: no more bytes will come
}

func newOutput(size int) *Output {
	o := &Output{size: max(size, 1)}
	o.cond.L = &o.mu
	return o
}

// write appends p, dropping the oldest bytes past the buffer's size. The
// buffer grows with what comes, up to its size: a quiet process costs
// next to nothing.
func (o *Output) write(p []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := int64(o.size)
	if room := o.size - len(o.buf); room > 0 {
		// Still growing: nothing has been dropped, buf[o] is offset o.
		k := min(room, len(p))
		o.buf = append(o.buf, p[:k]...)
		o.end += int64(k)
		p = p[k:]
	}
	if int64(len(p)) > n {
		o.end += int64(len(p)) - n
		p = p[int64(len(p))-n:]
	}
	for len(p) > 0 {
		at := o.end % n
		k := copy(o.buf[at:], p)
		p = p[k:]
		o.end += int64(k)
	}
	o.cond.Broadcast()
}

// close ends the stream: readers get io.EOF once they have read all that
// is left.
func (o *Output) close() {
	o.mu.Lock()
	o.closed = true
	o.cond.Broadcast()
	o.mu.Unlock()
}

// Len is how many bytes the process has written so far: the offset of
// the next byte.
func (o *Output) Len() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.end
}

// Dropped is how many of the first bytes have fallen out of the buffer:
// the earliest offset a reader can still read.
func (o *Output) Dropped() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.start()
}

func (o *Output) start() int64 { return max(0, o.end-int64(o.size)) }

// Bytes returns what the buffer holds now, and the offset of its first
// byte.
func (o *Output) Bytes() (from int64, b []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	from = o.start()
	b = make([]byte, o.end-from)
	o.copyAt(b, from)
	return from, b
}

// copyAt copies the bytes at offset off into p, all of which are in the
// buffer; o.mu is held.
func (o *Output) copyAt(p []byte, off int64) {
	n := int64(o.size)
	for len(p) > 0 {
		k := copy(p, o.buf[off%n:])
		p, off = p[k:], off+int64(k)
	}
}

// Reader returns a reader of the stream from offset from (0: its start).
// When from has already fallen out of the buffer, the reader starts at
// the earliest byte kept and counts the bytes it missed ([OutputReader.Skipped]).
func (o *Output) Reader(from int64) *OutputReader {
	return &OutputReader{o: o, off: max(from, 0)}
}

// ErrReaderClosed is returned by a read on an [OutputReader] that was
// closed.
var ErrReaderClosed = errors.New("vm: output reader closed")

// OutputReader reads an [Output] from an offset: it blocks until bytes at
// its offset come, and returns io.EOF once the stream has ended and it
// has read everything. It is for one goroutine at a time, but for Close.
type OutputReader struct {
	o       *Output
	off     int64
	skipped int64
	closed  bool // under o.mu
}

// Read reads the next bytes of the stream, blocking until there are
// some, the stream ends (io.EOF) or the reader is closed
// ([ErrReaderClosed]). Bytes that fell out of the buffer while the reader
// was away are skipped and counted.
func (r *OutputReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	o := r.o
	o.mu.Lock()
	defer o.mu.Unlock()
	for {
		if r.closed {
			return 0, ErrReaderClosed
		}
		if s := o.start(); r.off < s {
			r.skipped += s - r.off
			r.off = s
		}
		if r.off < o.end {
			n := min(int64(len(p)), o.end-r.off)
			o.copyAt(p[:n], r.off)
			r.off += n
			return int(n), nil
		}
		if o.closed {
			return 0, io.EOF
		}
		o.cond.Wait()
	}
}

// Offset is the offset of the next byte the reader will return.
func (r *OutputReader) Offset() int64 {
	r.o.mu.Lock()
	defer r.o.mu.Unlock()
	return r.off
}

// Skipped is how many bytes the reader missed: they fell out of the
// buffer before it read them.
func (r *OutputReader) Skipped() int64 {
	r.o.mu.Lock()
	defer r.o.mu.Unlock()
	return r.skipped
}

// Close makes a pending and every later Read return [ErrReaderClosed].
func (r *OutputReader) Close() error {
	r.o.mu.Lock()
	r.closed = true
	r.o.cond.Broadcast()
	r.o.mu.Unlock()
	return nil
}

// outputWriter is the io.Writer of an Output, for the agent's client.
type outputWriter struct{ o *Output }

func (w outputWriter) Write(p []byte) (int, error) {
	w.o.write(p)
	return len(p), nil
}
