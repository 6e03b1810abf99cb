// Package wire is the frame format shared by podvm's agent, its per-run
// shims and the host-side client. See package agent's documentation for
// the protocol it carries.
package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Version is the protocol version the agent announces in its Hello frame.
// A client refuses an agent with another version. Version 2: frames of
// 128 KiB in 1 MiB windows, and file operations (-fs). Version 3: Started
// and Signal frames, for processes held by handle; Dial frames, for
// connections to the sandbox's network; terminals (StartMsg.TTY, Resize).
// Version 4: Listen and Listening frames, for channels over a network.
// Version 5: Freeze, Frozen, Thaw and Resume, for checkpoints. Version
// 6: a Resume's ResumeMsg, for copies restored from a checkpoint, and a
// Frozen's FrozenMsg. Version 7: a Listening's Addrs.
const Version = 7

// Type is a frame's type.
type Type uint8

// The frame types. The comment says who sends each one.
const (
	Hello     Type = 1 + iota // agent→client, first frame, run id 0: a HelloMsg (shim→agent: empty, ready)
	Start                     // client→agent: a StartMsg for a new run id
	Stdin                     // client→agent: stdin bytes; an empty payload is EOF
	Stdout                    // agent→client: stdout bytes
	Stderr                    // agent→client: stderr bytes
	Credit                    // both ways: a CreditMsg, more room in a stream's window
	Kill                      // client→agent: kill every process of the run
	Exit                      // agent→client: an ExitMsg, the run's last frame
	Shutdown                  // client→agent, run id 0: kill every run, say Bye, exit
	Bye                       // agent→client, run id 0: a ByeMsg, the agent's last frame
	Started                   // agent→client (shim→agent): a StartedMsg, the command runs
	Signal                    // client→agent (agent→shim): a SignalMsg for the run's process group
	Dial                      // client→agent: a DialMsg for a new run id, a connection instead of a command
	Resize                    // client→agent: a ResizeMsg for the run's terminal
	Listen                    // client→agent, run id 0: a ListenMsg, serve channels on a TCP port
	Listening                 // agent→client, run id 0: a ListeningMsg, the answer to Listen
	Freeze                    // client→agent, run id 0: send nothing more on this channel until Thaw
	Frozen                    // agent→client, run id 0: a FrozenMsg, the answer to Freeze, its last frame before Thaw
	Thaw                      // client→agent, run id 0: the session goes on
	Resume                    // client→agent, run id 0: Thaw on a channel the client came back on, a ResumeMsg (empty: the same client); the agent says Hello first
)

// The streams a Credit frame refers to.
const (
	StreamStdin uint8 = iota
	StreamStdout
	StreamStderr
)

const (
	// HeaderSize is the size of a frame header: type (1 byte), run id
	// (4 bytes, big endian) and payload length (4 bytes, big endian).
	HeaderSize = 9
	// MaxPayload bounds a frame's payload; a longer one is a protocol
	// error. It leaves room for a Start frame of a full ARG_MAX.
	MaxPayload = 4 << 20
	// ChunkSize is the largest stream payload a sender puts in one frame.
	ChunkSize = 128 << 10
	// Window is each stream's initial credit, in bytes: a sender has at
	// most this many unacknowledged bytes in flight per stream of a run.
	Window = 1 << 20
	// CreditBatch is how many bytes a receiver consumes before it grants
	// them back: a quarter of the window keeps the sender going without a
	// Credit frame per chunk, and a short stream costs no Credit at all.
	CreditBatch = Window / 4
)

// ErrProtocol reports a malformed frame or message.
var ErrProtocol = errors.New("agent: protocol error")

// Frame is one frame: a type, the run it belongs to and its payload.
type Frame struct {
	Type    Type
	ID      uint32
	Payload []byte
}

// Append appends the encoded frame to b.
func (f Frame) Append(b []byte) []byte {
	return append(AppendHeader(b, f.Type, f.ID, len(f.Payload)), f.Payload...)
}

// AppendHeader appends the header of a frame of type typ for run id
// whose payload is n bytes: for a writer that sends the payload itself.
func AppendHeader(b []byte, typ Type, id uint32, n int) []byte {
	b = append(b, byte(typ))
	b = binary.BigEndian.AppendUint32(b, id)
	return binary.BigEndian.AppendUint32(b, uint32(n))
}

// Write writes f to w in a single Write call, so writers that serialize
// their calls never interleave frames.
func Write(w io.Writer, f Frame) error {
	if len(f.Payload) > MaxPayload {
		return fmt.Errorf("%w: payload of %d bytes", ErrProtocol, len(f.Payload))
	}
	_, err := w.Write(f.Append(make([]byte, 0, HeaderSize+len(f.Payload))))
	return err
}

// Read reads one frame from r. The payload is freshly allocated. It
// returns io.EOF only when r ends cleanly between frames.
func Read(r io.Reader) (Frame, error) { return ReadInto(r, nil) }

// ReadInto is [Read] with the payload read into buf(type, length) where
// that returns a slice of the length, freshly allocated where it returns
// nil (or buf is nil).
func ReadInto(r io.Reader, buf func(t Type, n int) []byte) (Frame, error) {
	var h [HeaderSize]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return Frame{}, err
	}
	return readPayload(r, h, buf)
}

// chunks holds buffers of ChunkSize bytes for stream payloads: a
// receiver hands each back once written on, so streaming allocates next
// to nothing per byte (a fresh 128 KiB a frame keeps the collector and
// the kernel busy handing memory back and faulting it in again).
var chunks = sync.Pool{New: func() any { return new([ChunkSize]byte) }}

// ReadStream is [Read] with the payloads of stream frames (Stdin, Stdout,
// Stderr) of up to ChunkSize bytes read into pooled buffers, which the
// receiver may hand back with [Recycle] once done with them.
func ReadStream(r io.Reader) (Frame, error) {
	return ReadInto(r, func(t Type, n int) []byte {
		if (t == Stdin || t == Stdout || t == Stderr) && n <= ChunkSize {
			return chunks.Get().(*[ChunkSize]byte)[:n]
		}
		return nil
	})
}

// Recycle hands a stream payload of [ReadStream] back to the pool; p
// must not be used afterwards. Other slices are left to the collector.
func Recycle(p []byte) {
	if cap(p) == ChunkSize {
		chunks.Put((*[ChunkSize]byte)(p[:ChunkSize]))
	}
}

// ReadPayload reads the payload announced by header h from r.
func ReadPayload(r io.Reader, h [HeaderSize]byte) (Frame, error) { return readPayload(r, h, nil) }

func readPayload(r io.Reader, h [HeaderSize]byte, buf func(Type, int) []byte) (Frame, error) {
	f := Frame{Type: Type(h[0]), ID: binary.BigEndian.Uint32(h[1:5])}
	n := binary.BigEndian.Uint32(h[5:9])
	if n > MaxPayload {
		return Frame{}, fmt.Errorf("%w: payload of %d bytes", ErrProtocol, n)
	}
	if n > 0 {
		if buf != nil {
			f.Payload = buf(f.Type, int(n))
		}
		if f.Payload == nil {
			f.Payload = make([]byte, n)
		}
		if _, err := io.ReadFull(r, f.Payload); err != nil {
			return Frame{}, unexpected(err)
		}
	}
	return f, nil
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
