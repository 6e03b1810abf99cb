package podman

import (
	"io"
	"sync/atomic"
)

// This file holds the stream helpers of the CLI's exec: a stdin whose end
// is known, and the tail of what podman printed.

// endReader records that its reader has ended (io.EOF or an error), and
// whether a Read is waiting for it.
type endReader struct {
	r       io.Reader
	ended   atomic.Bool
	waiting atomic.Int32
}

func (e *endReader) Read(p []byte) (int, error) {
	e.waiting.Add(1)
	n, err := e.r.Read(p)
	e.waiting.Add(-1)
	if err != nil {
		e.ended.Store(true)
	}
	return n, err
}

// pending reports that, when podman exited, it still had stdin to send:
// the reader had neither ended nor made podman wait for more.
func (e *endReader) pending() bool {
	return e != nil && !e.ended.Load() && e.waiting.Load() == 0
}

// reader returns e as an io.Reader, nil when e is nil.
func (e *endReader) reader() io.Reader {
	if e == nil {
		return nil
	}
	return e
}

// tailWriter keeps the last max bytes written to it.
type tailWriter struct {
	b   []byte
	max int
}

func (t *tailWriter) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}
