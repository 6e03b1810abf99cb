package psk

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// pair runs both handshakes over a TCP connection on loopback and
// returns their results.
func pair(t testing.TB, dialKey, acceptKey []byte) (d, a *Conn, derr, aerr error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err != nil {
			aerr = err
			return
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		a, aerr = Accept(c, acceptKey)
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	d, derr = Dial(c, dialKey)
	if derr != nil {
		c.Close() // so the accepting end's read ends
	}
	<-done
	for _, c := range []*Conn{d, a} {
		if c != nil {
			_ = c.SetDeadline(time.Time{})
			t.Cleanup(func() { c.Close() })
		}
	}
	return d, a, derr, aerr
}

func TestBothWaysCarryWhatWasWritten(t *testing.T) {
	key := NewKey()
	d, a, derr, aerr := pair(t, key, key)
	require.NoError(t, derr)
	require.NoError(t, aerr)

	// More than a record, written at once, in both directions together.
	big := make([]byte, 3*MaxRecord+17)
	_, _ = rand.Read(big)
	for _, w := range []struct{ from, to *Conn }{{d, a}, {a, d}} {
		go func() { _, _ = w.from.Write(big) }()
		got := make([]byte, len(big))
		_, err := io.ReadFull(w.to, got)
		require.NoError(t, err)
		assert.True(t, bytes.Equal(big, got), "bytes differ")
	}

	// A half-close is EOF at the other end, after what came before.
	_, err := d.Write([]byte("last"))
	require.NoError(t, err)
	require.NoError(t, d.CloseWrite())
	rest, err := io.ReadAll(a)
	require.NoError(t, err)
	assert.Equal(t, "last", string(rest))
}

func TestAWrongKeyIsRefusedAtBothEnds(t *testing.T) {
	_, _, derr, aerr := pair(t, NewKey(), NewKey())
	assert.ErrorIs(t, derr, ErrAuth, "the dialer must not accept a listener without the key")
	assert.Error(t, aerr, "the listener must not accept a dialer without the key")
}

func TestABadKeySizeIsRefused(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	_, err := Dial(a, []byte("short"))
	assert.ErrorContains(t, err, "a key is 32 bytes")
}

func TestAPeerThatDoesNotSpeakItIsDropped(t *testing.T) {
	for name, hello := range map[string]string{
		"http": "GET / HTTP/1.1\r\nHost: podvm.example\r\nAccept: */*\r\n\r\n",
		// The first version's (AES-256 records): told at once, not at the
		// first record.
		"another version": "podvmPSK" + strings.Repeat("n", nonceSize),
	} {
		a, b := net.Pipe()
		go func() { _, _ = b.Write([]byte(hello)) }()
		_, err := Accept(a, NewKey())
		assert.ErrorIs(t, err, ErrAuth, name)
		assert.ErrorContains(t, err, "does not speak psk", name)
		b.Close()
	}
}

// tamper is the dialer's side of a connection that alters what the
// dialer writes once the handshake is through.
type tamper struct {
	net.Conn
	after int // bytes to pass before change applies
	seen  int
	// change rewrites a write; nil passes it on.
	change func(p []byte) []byte
}

func (t *tamper) Write(p []byte) (int, error) {
	t.seen += len(p)
	if t.seen > t.after && t.change != nil {
		q := t.change(append([]byte(nil), p...))
		if _, err := t.Conn.Write(q); err != nil {
			return 0, err
		}
		return len(p), nil
	}
	return t.Conn.Write(p)
}

// handshakeBytes is what the dialer writes in a handshake.
const handshakeBytes = len(Magic) + nonceSize + macSize

// tampered connects a dialer and a listener over a pipe, the dialer's
// writes after the handshake rewritten by change, and returns both ends
// and the listener's side of the pipe.
func tampered(t *testing.T, change func([]byte) []byte) (d, a *Conn, y net.Conn) {
	t.Helper()
	key := NewKey()
	x, y := net.Pipe()
	done := make(chan *Conn)
	go func() {
		c, err := Accept(y, key)
		assert.NoError(t, err)
		done <- c
	}()
	d, err := Dial(&tamper{Conn: x, after: handshakeBytes, change: change}, key)
	require.NoError(t, err)
	return d, <-done, y
}

func TestAnAlteredRecordEndsTheConnection(t *testing.T) {
	for name, change := range map[string]func([]byte) []byte{
		"a flipped bit":      func(p []byte) []byte { p[len(p)-1] ^= 1; return p },
		"a longer length":    func(p []byte) []byte { p[3]++; return p },
		"a record replayed":  func(p []byte) []byte { return append(p, p...) },
		"a record truncated": func(p []byte) []byte { return p[:len(p)-1] },
	} {
		t.Run(name, func(t *testing.T) {
			d, a, _ := tampered(t, change)
			defer a.Close()
			go func() {
				_, _ = d.Write([]byte("first record"))
				d.Close()
			}()
			got, err := io.ReadAll(a)
			if name == "a record replayed" {
				// The first copy is good; the second does not open.
				assert.Equal(t, "first record", string(got))
			}
			assert.ErrorIs(t, err, ErrAuth)
			_, again := a.Read(make([]byte, 1))
			assert.ErrorIs(t, again, ErrAuth, "once a record failed, every Read fails")
		})
	}
}

func TestARecordSentBackIsRefused(t *testing.T) {
	// Capture what the dialer sends after the handshake, then feed it to
	// the dialer's own reader, as if the listener had sent it.
	var sent bytes.Buffer
	d, a, y := tampered(t, func(p []byte) []byte { sent.Write(p); return p })
	go func() { _, _ = d.Write([]byte("to the listener")) }()
	buf := make([]byte, 64)
	n, err := a.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "to the listener", string(buf[:n]))

	go func() { _, _ = y.Write(sent.Bytes()); y.Close() }()
	_, err = io.ReadAll(d)
	assert.True(t, errors.Is(err, ErrAuth), "a reflected record opened: %v", err)
}

// BenchmarkStream carries frames as the agent's channel does (a 9-byte
// header and a 128 KiB payload, one Write each) over loopback TCP, read
// through a 64 KiB bufio.Reader as the agent and the client read them.
func BenchmarkStream(b *testing.B) {
	const frame = 9 + 128<<10
	key := NewKey()
	d, a, derr, aerr := pair(b, key, key)
	if derr != nil || aerr != nil {
		b.Fatal(derr, aerr)
	}
	go func() {
		p := make([]byte, frame)
		for {
			if _, err := d.Write(p); err != nil {
				return
			}
		}
	}()
	br := bufio.NewReaderSize(a, 64<<10)
	hdr, payload := make([]byte, 9), make([]byte, frame-9)
	b.SetBytes(frame)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := io.ReadFull(br, hdr); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(br, payload); err != nil {
			b.Fatal(err)
		}
	}
}

// A read whose deadline passes in the middle of a record loses nothing:
// the next Read, without a deadline, returns the record whole. Reads of
// every size, a plaintext larger than the Read's buffer and an empty
// record come through as written.
func TestReadsOfEverySize(t *testing.T) {
	key := NewKey()
	d, a, derr, aerr := pair(t, key, key)
	require.NoError(t, derr)
	require.NoError(t, aerr)
	defer d.Close()
	defer a.Close()

	msg := make([]byte, MaxRecord+100)
	_, _ = rand.Read(msg)
	var sealed bytes.Buffer // the records of msg, as d would write them
	raw := d.Conn
	d.Conn = writerConn{Conn: raw, w: &sealed}
	_, err := d.Write(msg)
	d.Conn = raw
	require.NoError(t, err)
	half := sealed.Len() / 2
	_, err = raw.Write(sealed.Bytes()[:half])
	require.NoError(t, err)
	require.NoError(t, a.SetReadDeadline(time.Now().Add(100*time.Millisecond)))
	_, err = a.Read(make([]byte, 10))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.NotErrorIs(t, err, ErrAuth, "a timeout is no cut record")
	require.NoError(t, a.SetReadDeadline(time.Time{}))
	_, err = raw.Write(sealed.Bytes()[half:])
	require.NoError(t, err)
	_, err = d.Write(nil) // an empty record, then more
	require.NoError(t, err)
	_, err = d.Write([]byte("end"))
	require.NoError(t, err)

	var got []byte
	for size := 1; len(got) < len(msg)+3; size = size*3 + 1 {
		b := make([]byte, min(size, 9000))
		n, err := a.Read(b)
		require.NoError(t, err)
		got = append(got, b[:n]...)
	}
	assert.Equal(t, append(msg, "end"...), got)
}

// writerConn is a connection whose writes go to w instead.
type writerConn struct {
	net.Conn
	w io.Writer
}

func (c writerConn) Write(p []byte) (int, error) { return c.w.Write(p) }

// taped records what its Conn reads and writes.
type taped struct {
	net.Conn
	in, out bytes.Buffer
}

func (c *taped) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.in.Write(p[:n])
	return n, err
}

func (c *taped) Write(p []byte) (int, error) {
	c.out.Write(p)
	return c.Conn.Write(p)
}

// A record on the wire is what the package says: its length, then the
// plaintext sealed with AES-128-GCM under the first 16 bytes of
// HMAC-SHA256(key, "podvm-psk c2s" ‖ nC ‖ nS), the record's number as
// nonce and its length as additional data.
func TestRecordsAreAsDocumented(t *testing.T) {
	key := NewKey()
	c1, c2 := net.Pipe()
	tape := &taped{Conn: c1}
	accepted := make(chan *Conn, 1)
	go func() {
		a, err := Accept(c2, key)
		assert.NoError(t, err)
		accepted <- a
	}()
	d, err := Dial(tape, key)
	require.NoError(t, err)
	a := <-accepted
	require.NotNil(t, a)
	defer a.Close()
	handshake := tape.out.Len()
	go func() { _, _ = d.Write([]byte("hello")) }()
	got := make([]byte, 5)
	_, err = io.ReadFull(a, got)
	require.NoError(t, err)

	var nc, ns [nonceSize]byte
	copy(nc[:], tape.out.Bytes()[len(Magic):])
	copy(ns[:], tape.in.Bytes())
	record := tape.out.Bytes()[handshake:]
	require.Len(t, record, 4+5+tagSize)
	assert.Equal(t, uint32(5+tagSize), binary.BigEndian.Uint32(record))
	block, err := aes.NewCipher(mac(key, "podvm-psk c2s", nc, ns)[:16])
	require.NoError(t, err)
	g, err := cipher.NewGCM(block)
	require.NoError(t, err)
	plain, err := g.Open(nil, make([]byte, 12), record[4:], record[:4])
	require.NoError(t, err, "opens as AES-128-GCM")
	assert.Equal(t, "hello", string(plain))
}
