package capture

import "io"

// Stream is one output stream of a run: a bounded [Buffer] plus an
// optional live writer that receives everything. A failing live writer is
// dropped and its first error kept; the capture goes on.
type Stream struct {
	*Buffer
	live    io.Writer
	liveErr error
}

// NewStream returns a Stream capturing at most max bytes and copying all
// output to live, if non-nil.
func NewStream(max int, live io.Writer) *Stream {
	return &Stream{Buffer: New(max), live: live}
}

// Write captures p and passes it to the live writer. It never fails, so a
// producer copying into it is never stopped by a slow or broken consumer.
func (s *Stream) Write(p []byte) (int, error) {
	s.Buffer.Write(p)
	if s.live != nil && s.liveErr == nil {
		if _, err := s.live.Write(p); err != nil {
			s.liveErr = err
		}
	}
	return len(p), nil
}

// LiveErr is the first error of the live writer, if any.
func (s *Stream) LiveErr() error { return s.liveErr }
