package libpod_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/podvm/podvm/internal/capture"
	"github.com/podvm/podvm/internal/libpod"
	"github.com/podvm/podvm/internal/libpod/libpodtest"
)

// stream is the multiplexed stream of a recorded exec start.
func stream(name string) []byte {
	return libpodtest.Load(name)[libpodtest.HeaderEnd(name):]
}

// frame encodes one frame of the multiplexed protocol.
func frame(typ byte, payload []byte) []byte {
	h := make([]byte, 8, 8+len(payload))
	h[0] = typ
	binary.BigEndian.PutUint32(h[4:], uint32(len(payload)))
	return append(h, payload...)
}

// chunky returns r's bytes in reads of random sizes, frames split
// anywhere, headers included.
type chunky struct {
	r   io.Reader
	rnd *rand.Rand
}

func (c *chunky) Read(p []byte) (int, error) {
	return c.r.Read(p[:min(len(p), 1+c.rnd.IntN(13))])
}

func TestDemuxRecorded(t *testing.T) {
	t.Parallel()
	var wantOut, wantErr strings.Builder
	for i := range 2000 {
		fmt.Fprintf(&wantOut, "out %d\n", i)
		fmt.Fprintf(&wantErr, "err %d\n", i)
	}
	for _, c := range []struct {
		name, stdout, stderr string
	}{
		{"exec-start-exit-3", "hi\n", "oops\n"},
		{"exec-start-interleaved", wantOut.String(), wantErr.String()},
		{"exec-start-big", strings.Repeat("x", 256<<10), ""},
	} {
		for _, rd := range []struct {
			how  string
			wrap func(io.Reader) io.Reader
		}{
			{"whole", func(r io.Reader) io.Reader { return r }},
			{"one byte a read", iotest.OneByteReader},
			{"random reads", func(r io.Reader) io.Reader { return &chunky{r, rand.New(rand.NewPCG(1, 2))} }},
		} {
			var out, errs bytes.Buffer
			err := libpod.Demux(rd.wrap(bytes.NewReader(stream(c.name))), &out, &errs)
			require.NoError(t, err, "%s, %s", c.name, rd.how)
			assert.Equal(t, c.stdout, out.String(), "%s, %s: stdout", c.name, rd.how)
			assert.Equal(t, c.stderr, errs.String(), "%s, %s: stderr", c.name, rd.how)
		}
	}
}

func TestDemuxFrames(t *testing.T) {
	t.Parallel()
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB in one frame
	join := func(fs ...[]byte) []byte { return bytes.Join(fs, nil) }
	for _, c := range []struct {
		name           string
		in             []byte
		stdout, stderr string
		err            func(error) bool
	}{
		{"empty stream", nil, "", "", nil},
		{"big frames", join(frame(1, big), frame(2, big[:70000]), frame(1, []byte("end"))), string(big) + "end", string(big[:70000]), nil},
		{"empty frame", join(frame(1, nil), frame(2, []byte("e"))), "", "e", nil},
		{"stdin echo dropped", join(frame(0, []byte("typed")), frame(1, []byte("o"))), "o", "", nil},
		{"interleaved", join(frame(1, []byte("a")), frame(2, []byte("b")), frame(1, []byte("c")), frame(2, []byte("d"))), "ac", "bd", nil},
		{"service error frame", join(frame(1, []byte("partial")), frame(3, []byte("conmon died"))), "partial", "",
			func(err error) bool {
				var le *libpod.Error
				return errors.As(err, &le) && le.Status == 500 && le.Message == "conmon died"
			}},
		{"unknown stream type", frame(7, []byte("x")), "", "", func(err error) bool {
			var le *libpod.Error
			return errors.As(err, &le) && strings.Contains(err.Error(), "unknown stream type")
		}},
		{"dropped inside a header", join(frame(1, []byte("ok")), frame(2, []byte("x"))[:5]), "ok", "", unexpectedEOF},
		{"dropped inside a frame", join(frame(1, []byte("ok")), frame(2, []byte("abcdef"))[:10]), "ok", "ab", unexpectedEOF},
	} {
		var out, errs bytes.Buffer
		err := libpod.Demux(iotest.HalfReader(bytes.NewReader(c.in)), &out, &errs)
		if c.err == nil {
			assert.NoError(t, err, c.name)
		} else {
			assert.True(t, c.err(err), "%s: got error %v", c.name, err)
		}
		assert.Equal(t, c.stdout, out.String(), "%s: stdout", c.name)
		assert.Equal(t, c.stderr, errs.String(), "%s: stderr", c.name)
	}
}

func unexpectedEOF(err error) bool {
	var le *libpod.Error
	return errors.As(err, &le) && le.Unreachable() && errors.Is(err, io.ErrUnexpectedEOF)
}

func TestDemuxWriterError(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	err := libpod.Demux(bytes.NewReader(frame(2, []byte("x"))), io.Discard, writerFunc(func([]byte) (int, error) { return 0, boom }))
	assert.ErrorIs(t, err, boom)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// Demux holds nothing beyond its buffer: 64 MiB through a capture capped
// at 1 KiB allocate a small constant, not the frame.
func TestDemuxMemoryBounded(t *testing.T) {
	const size = 64 << 20
	hdr := frame(1, nil)
	binary.BigEndian.PutUint32(hdr[4:], size)
	in := io.MultiReader(bytes.NewReader(hdr), io.LimitReader(zeros{}, size), bytes.NewReader(frame(2, []byte("tail"))))
	out := capture.NewStream(1024, nil)
	errs := capture.NewStream(1024, nil)

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	require.NoError(t, libpod.Demux(in, out, errs))
	runtime.ReadMemStats(&after)
	assert.Equal(t, int64(size), out.Total())
	assert.True(t, out.Truncated())
	assert.Equal(t, "tail", errs.String())
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(1<<20), "bytes allocated to demultiplex 64 MiB")
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// writes records each Write it is given.
type writes [][]byte

func (w *writes) Write(p []byte) (int, error) {
	*w = append(*w, bytes.Clone(p))
	return len(p), nil
}

// A frame that fits in Demux's buffer reaches its writer in one Write,
// however the stream is split, so that a writer judging whole frames
// (Exec's filter of Podman's attach-reset line) sees them whole; a larger
// one arrives in buffer-sized pieces.
func TestDemuxFrameInOneWrite(t *testing.T) {
	t.Parallel()
	small := []byte("Error: write unixpacket @->/proc/self/fd/16/attach: write: broken pipe\n")
	big := bytes.Repeat([]byte("x"), 80<<10)
	var in bytes.Buffer
	for _, f := range [][]byte{small, big} {
		in.Write([]byte{2, 0, 0, 0})
		in.Write(binary.BigEndian.AppendUint32(nil, uint32(len(f))))
		in.Write(f)
	}
	var stderr writes
	require.NoError(t, libpod.Demux(iotest.OneByteReader(&in), io.Discard, &stderr))
	var sizes []int
	for _, w := range stderr {
		sizes = append(sizes, len(w))
	}
	require.Equal(t, []int{len(small), 32 << 10, 32 << 10, 16 << 10}, sizes, "the sizes of the writes")
	assert.Equal(t, small, stderr[0])
}
