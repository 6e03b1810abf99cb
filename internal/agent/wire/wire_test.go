package wire

import (
	"bytes"
	"io"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStartRoundTripKeepsRawBytes(t *testing.T) {
	t.Parallel()
	m := StartMsg{Argv: []string{"printf", "\xff\xfe", ""}, Env: []string{"X=\xff\xfe\n"}, Dir: "/d\xff", User: "1:2"}
	var buf bytes.Buffer
	require.NoError(t, Write(&buf, Frame{Type: Start, ID: 7, Payload: m.Encode()}))
	f, err := Read(&buf)
	require.NoError(t, err)
	require.Equal(t, Start, f.Type)
	require.Equal(t, uint32(7), f.ID)
	got, err := DecodeStart(f.Payload)
	require.NoError(t, err)
	require.Equal(t, m, got)
	_, err = Read(&buf)
	require.ErrorIs(t, err, io.EOF)
}

func TestMalformed(t *testing.T) {
	t.Parallel()
	good := ExitMsg{Code: 137, Killed: true, Msg: "x"}.Encode()
	tests := []struct {
		name string
		fn   func() error
	}{
		{"short exit", func() error { _, err := DecodeExit(good[:len(good)-1]); return err }},
		{"trailing bytes", func() error { _, err := DecodeExit(append(good, 0)); return err }},
		{"short started", func() error { _, err := DecodeStarted([]byte{0, 0, 1}); return err }},
		{"long signal", func() error { _, err := DecodeSignal([]byte{15, 0}); return err }},
		{"huge list", func() error { _, err := DecodeStart([]byte{0xff, 0xff, 0xff, 0xff}); return err }},
		{"huge frame", func() error {
			_, err := Read(bytes.NewReader([]byte{1, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}))
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			require.ErrorIs(t, tt.fn(), ErrProtocol)
		})
	}
	_, err := Read(bytes.NewReader([]byte{1, 0, 0, 0, 0, 0, 0, 0, 4, 'a'}))
	require.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

// ReadInto reads a payload into the buffer it is given, and allocates
// where it is given none.
func TestReadInto(t *testing.T) {
	var b bytes.Buffer
	for _, f := range []Frame{{Type: Stdout, ID: 1, Payload: []byte("hi")}, {Type: Start, ID: 2, Payload: []byte("go")}} {
		b.Write(f.Append(nil))
	}
	mine := make([]byte, 8)
	buf := func(t Type, n int) []byte {
		if t == Stdout {
			return mine[:n]
		}
		return nil
	}
	f, err := ReadInto(&b, buf)
	if err != nil || string(f.Payload) != "hi" || &f.Payload[0] != &mine[0] {
		t.Fatalf("stdout frame: %+v, %v; want its payload in the given buffer", f, err)
	}
	f, err = ReadInto(&b, buf)
	if err != nil || string(f.Payload) != "go" || &f.Payload[0] == &mine[0] {
		t.Fatalf("start frame: %+v, %v; want a payload of its own", f, err)
	}
}

// ReadStream reads stream payloads into pooled chunks, which Recycle
// takes back, and others into payloads of their own.
func TestReadStream(t *testing.T) {
	var b bytes.Buffer
	for _, f := range []Frame{{Type: Stdin, ID: 1, Payload: []byte("in")}, {Type: Start, ID: 2, Payload: []byte("go")}} {
		b.Write(f.Append(nil))
	}
	f, err := ReadStream(&b)
	require.NoError(t, err)
	require.Equal(t, "in", string(f.Payload))
	require.Equal(t, ChunkSize, cap(f.Payload), "a stdin payload in a pooled chunk")
	Recycle(f.Payload)
	f, err = ReadStream(&b)
	require.NoError(t, err)
	require.Equal(t, "go", string(f.Payload))
	require.Equal(t, 2, cap(f.Payload), "a start payload of its own")
}

func TestStartedSignalRoundTrip(t *testing.T) {
	t.Parallel()
	st, err := DecodeStarted(StartedMsg{PID: 1 << 22}.Encode())
	require.NoError(t, err)
	require.Equal(t, StartedMsg{PID: 1 << 22}, st)
	sg, err := DecodeSignal(SignalMsg{Signo: 15}.Encode())
	require.NoError(t, err)
	require.Equal(t, SignalMsg{Signo: 15}, sg)
	tm := StartMsg{Argv: []string{"sh"}, Env: []string{}, TTY: true, Rows: 50, Cols: 132}
	tg, err := DecodeStart(tm.Encode())
	require.NoError(t, err)
	require.Equal(t, tm, tg)
	rg, err := DecodeResize(ResizeMsg{Rows: 1, Cols: 65535}.Encode())
	require.NoError(t, err)
	require.Equal(t, ResizeMsg{Rows: 1, Cols: 65535}, rg)
	dm := DialMsg{Network: "unix", Address: "/run/x\xff.sock", Wait: true}
	dg, err := DecodeDial(dm.Encode())
	require.NoError(t, err)
	require.Equal(t, dm, dg)
}

func TestListenRoundTrip(t *testing.T) {
	t.Parallel()
	lm := ListenMsg{Key: []byte("0123456789abcdef0123456789abcdef"), Port: 7337}
	lg, err := DecodeListen(lm.Encode())
	require.NoError(t, err)
	require.Equal(t, lm, lg)
	for _, m := range []ListeningMsg{{Port: 65535, Addrs: []string{"10.244.0.7", "fd00::7"}}, {Err: "no network", Addrs: []string{}}} {
		got, err := DecodeListening(m.Encode())
		require.NoError(t, err)
		require.Equal(t, m, got)
	}
	_, err = DecodeListening(enc(nil).u32(70000).str("").strs(nil))
	require.ErrorIs(t, err, ErrProtocol, "a port past 65535")
	_, err = DecodeListening(enc(nil).u32(7337).str(""))
	require.ErrorIs(t, err, ErrProtocol, "a version 6 Listening, without addresses")
}

func TestFrozenRoundTrip(t *testing.T) {
	for _, m := range []FrozenMsg{{TCP: []string{}}, {TCP: []string{"pid 12 (nc) listening on 0.0.0.0:8080", ""}}} {
		got, err := DecodeFrozen(m.Encode())
		require.NoError(t, err)
		assert.Equal(t, m, got)
	}
	_, err := DecodeFrozen(nil)
	assert.ErrorIs(t, err, ErrProtocol)
}

func TestResumeRoundTrip(t *testing.T) {
	for _, m := range []ResumeMsg{{}, {Fresh: true}, {Fresh: true, Keep: []uint32{1, 7, 1 << 31}}} {
		got, err := DecodeResume(m.Encode())
		require.NoError(t, err)
		assert.Equal(t, m, got)
	}
	assert.Empty(t, ResumeMsg{Keep: []uint32{3}}.Encode(), "the same client's Resume carries nothing")
	for name, p := range map[string][]byte{
		"flag":     enc(nil).u8(2).u32(0),
		"count":    enc(nil).u8(1).u32(3).u32(1),
		"huge":     enc(nil).u8(1).u32(1 << 30),
		"trailing": enc(nil).u8(1).u32(1).u32(1).u8(0),
		"short":    {1},
	} {
		_, err := DecodeResume(p)
		assert.ErrorIs(t, err, ErrProtocol, name)
	}
}
