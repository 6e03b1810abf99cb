package testkit

import (
	"bytes"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// LockedBuffer is a [bytes.Buffer] safe for concurrent writers and
// readers: a command's stdout and stderr copied by goroutines while the
// test reads what came so far. The zero value is an empty buffer ready
// to use.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p to the buffer.
func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns what was written so far.
func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// FailingWriter fails every Write with Err, having written nothing.
type FailingWriter struct{ Err error }

// Write returns 0 and w.Err.
func (w FailingWriter) Write([]byte) (int, error) { return 0, w.Err }

// SlowWriter is a reader slower than the writer: each Write waits, then
// passes p on to W. The zero value discards at full speed.
type SlowWriter struct {
	// W receives what is written; if nil, it is discarded.
	W io.Writer
	// Delay is how long each Write waits, whatever its length.
	Delay time.Duration
	// Rate, if positive, is the bytes a second it takes: a Write of n
	// bytes waits n/Rate seconds more.
	Rate int64

	n atomic.Int64
}

// Write waits as Delay and Rate say, then writes p to W.
func (w *SlowWriter) Write(p []byte) (int, error) {
	wait := w.Delay
	if w.Rate > 0 {
		wait += time.Duration(int64(len(p)) * int64(time.Second) / w.Rate)
	}
	time.Sleep(wait)
	n := len(p)
	var err error
	if w.W != nil {
		n, err = w.W.Write(p)
	}
	w.n.Add(int64(n))
	return n, err
}

// N returns the bytes written so far.
func (w *SlowWriter) N() int64 { return w.n.Load() }
