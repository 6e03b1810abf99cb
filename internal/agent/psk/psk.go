// Package psk secures a stream between two ends that share a secret key
// and nothing else: no certificate, no name. It is how a caller reaches
// a sandbox's agent over a network (a pod's address): the key goes to
// the agent over a channel that is already private (the attach stream),
// so only the caller and that agent hold it, and a connection that
// cannot prove it is dropped before a byte of the protocol flows.
//
// # Handshake
//
// The dialing end sends [Magic] and a 32-byte random nonce nC; the
// listening end answers with its own nonce nS and
// HMAC-SHA256(key, "podvm-psk server" ‖ nC ‖ nS); the dialing end checks
// it and answers HMAC-SHA256(key, "podvm-psk client" ‖ nC ‖ nS), which the
// listening end checks. Each end thus proves it holds the key to the
// other, over nonces the other chose fresh, so nothing recorded can be
// replayed.
//
// # Records
//
// Each direction has its own key, the first 16 bytes of
// HMAC-SHA256(key, label ‖ nC ‖ nS) with the labels "podvm-psk c2s" and
// "podvm-psk s2c", used with AES-128-GCM: TLS 1.3's first cipher suite,
// ample for keys that live one connection, and cheaper per byte than
// AES-256 (10 rounds, not 14) where the record layer of each end shares
// two cores with everything else.
// A record is a 4-byte big-endian length then that many bytes sealed
// (plaintext of at most [MaxRecord] bytes, then the 16-byte tag), the
// length as additional data and the record's sequence number, counted
// from 0 per direction, as nonce. So a record that was altered, dropped,
// reordered, replayed or sent back the other way fails to open, and the
// connection with it: a reader gets [ErrAuth] and nothing after. The end
// of the stream is not authenticated: a connection cut after a whole
// record reads as EOF there, so the protocol carried must say itself
// where it ends (the agent's does: Exit, Bye).
//
// What it does not give: forward secrecy (whoever later learns the key
// can read recorded traffic; keys live in the two processes' memory
// only) and hiding of record lengths and timing.
package psk

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
)

// KeySize is the size of a key, in bytes.
const KeySize = 32

// Magic opens a connection, its last byte the record layer's version (2:
// AES-128-GCM): a peer that speaks anything else, another version
// included, is dropped at once, saying so.
const Magic = "podvmPS2"

// MaxRecord bounds a record's plaintext.
const MaxRecord = 64 << 10

const (
	nonceSize = 32
	macSize   = sha256.Size
	tagSize   = 16
)

// ErrAuth reports a peer that does not hold the key, or a record that
// did not come from it as it was sent.
var ErrAuth = errors.New("psk: authentication failed")

// NewKey returns a fresh random key.
func NewKey() []byte {
	k := make([]byte, KeySize)
	_, _ = rand.Read(k) // crypto/rand.Read never fails (Go 1.24)
	return k
}

// Dial runs the dialing end's handshake on c and returns the secured
// connection. A deadline on c bounds it; on failure c is closed.
func Dial(c net.Conn, key []byte) (*Conn, error) {
	return handshake(c, key, true)
}

// Accept runs the listening end's handshake on c and returns the secured
// connection. A deadline on c bounds it; on failure c is closed.
func Accept(c net.Conn, key []byte) (*Conn, error) {
	return handshake(c, key, false)
}

func handshake(c net.Conn, key []byte, dialer bool) (*Conn, error) {
	if len(key) != KeySize {
		c.Close()
		return nil, fmt.Errorf("psk: a key is %d bytes, not %d", KeySize, len(key))
	}
	sc, err := exchange(c, key, dialer)
	if err != nil {
		c.Close()
		return nil, err
	}
	return sc, nil
}

func exchange(c net.Conn, key []byte, dialer bool) (*Conn, error) {
	var nc, ns [nonceSize]byte
	if dialer {
		_, _ = rand.Read(nc[:])
		if _, err := c.Write(append([]byte(Magic), nc[:]...)); err != nil {
			return nil, fmt.Errorf("psk: handshake: %w", err)
		}
		var in [nonceSize + macSize]byte
		if _, err := io.ReadFull(c, in[:]); err != nil {
			return nil, fmt.Errorf("psk: handshake: %w", err)
		}
		copy(ns[:], in[:nonceSize])
		if !hmac.Equal(in[nonceSize:], mac(key, "podvm-psk server", nc, ns)) {
			return nil, fmt.Errorf("%w: the listening end does not hold the key", ErrAuth)
		}
		if _, err := c.Write(mac(key, "podvm-psk client", nc, ns)); err != nil {
			return nil, fmt.Errorf("psk: handshake: %w", err)
		}
		return newConn(c, mac(key, "podvm-psk c2s", nc, ns), mac(key, "podvm-psk s2c", nc, ns))
	}
	var in [len(Magic) + nonceSize]byte
	if _, err := io.ReadFull(c, in[:]); err != nil {
		return nil, fmt.Errorf("psk: handshake: %w", err)
	}
	if !bytes.Equal(in[:len(Magic)], []byte(Magic)) {
		return nil, fmt.Errorf("%w: the peer does not speak psk", ErrAuth)
	}
	copy(nc[:], in[len(Magic):])
	_, _ = rand.Read(ns[:])
	if _, err := c.Write(append(ns[:], mac(key, "podvm-psk server", nc, ns)...)); err != nil {
		return nil, fmt.Errorf("psk: handshake: %w", err)
	}
	var proof [macSize]byte
	if _, err := io.ReadFull(c, proof[:]); err != nil {
		return nil, fmt.Errorf("psk: handshake: %w", err)
	}
	if !hmac.Equal(proof[:], mac(key, "podvm-psk client", nc, ns)) {
		return nil, fmt.Errorf("%w: the dialing end does not hold the key", ErrAuth)
	}
	return newConn(c, mac(key, "podvm-psk s2c", nc, ns), mac(key, "podvm-psk c2s", nc, ns))
}

// mac is HMAC-SHA256(key, label ‖ nc ‖ ns).
func mac(key []byte, label string, nc, ns [nonceSize]byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(label))
	h.Write(nc[:])
	h.Write(ns[:])
	return h.Sum(nil)
}

// Conn is a secured connection. Read and Write may be called at once
// from two goroutines; Writes are serialized, as are Reads.
type Conn struct {
	net.Conn

	wmu  sync.Mutex
	seal cipher.AEAD
	wseq uint64
	wbuf []byte

	rmu  sync.Mutex
	open cipher.AEAD
	rseq uint64
	r    *bufio.Reader // the records, read ahead
	rbuf []byte        // a plaintext that Read's buffer could not hold
	left []byte        // what of it Read has not returned
	rerr error
}

// readAhead is how much of the stream a Conn reads at once: records
// (headers included) are opened where they were read, and a read fetches
// as many as have come, not a header and then a body, so a record costs
// a fraction of a system call.
const readAhead = 2 * (4 + MaxRecord + tagSize)

func newConn(c net.Conn, wkey, rkey []byte) (*Conn, error) {
	seal, err := gcm(wkey)
	if err != nil {
		return nil, err
	}
	open, err := gcm(rkey)
	if err != nil {
		return nil, err
	}
	return &Conn{Conn: c, seal: seal, open: open, r: bufio.NewReaderSize(c, readAhead)}, nil
}

// recordKey is how many bytes of a derived key the records use:
// AES-128.
const recordKey = 16

func gcm(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key[:recordKey])
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// nonce is the GCM nonce of record seq.
func nonce(seq uint64) []byte {
	var n [12]byte
	binary.BigEndian.PutUint64(n[4:], seq)
	return n[:]
}

// Write seals p into records of at most MaxRecord bytes, written to the
// connection in one call.
func (c *Conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	b := c.wbuf[:0]
	for rest := p; len(rest) > 0; {
		chunk := rest[:min(len(rest), MaxRecord)]
		rest = rest[len(chunk):]
		var hdr [4]byte
		binary.BigEndian.PutUint32(hdr[:], uint32(len(chunk)+tagSize))
		b = append(b, hdr[:]...)
		b = c.seal.Seal(b, nonce(c.wseq), chunk, hdr[:])
		c.wseq++
	}
	if cap(b) <= 4*(MaxRecord+tagSize+4) {
		c.wbuf = b
	}
	if _, err := c.Conn.Write(b); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Read returns plaintext of records that opened. A record that does not
// open ends the connection for reading: that Read and every later one
// return an error matching [ErrAuth].
func (c *Conn) Read(p []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for len(c.left) == 0 {
		if c.rerr != nil {
			return 0, c.rerr
		}
		n, err := c.readRecord(p)
		if err != nil {
			if !errors.Is(err, ErrAuth) && !errors.Is(err, io.EOF) {
				return 0, err // a timeout, say: the stream is still whole
			}
			c.rerr = err
		}
		if n > 0 {
			return n, nil
		}
	}
	n := copy(p, c.left)
	c.left = c.left[n:]
	return n, nil
}

// readRecord reads and opens one record: into p when its plaintext fits
// there, returning its length, else into c.left. A read that fails
// mid-record ends reading too, unless it timed out (see cut).
func (c *Conn) readRecord(p []byte) (int, error) {
	hdr, err := c.r.Peek(4)
	if err != nil {
		return 0, c.cut(err)
	}
	size := int(binary.BigEndian.Uint32(hdr))
	if size < tagSize || size > MaxRecord+tagSize {
		return 0, fmt.Errorf("%w: a record of %d bytes", ErrAuth, size)
	}
	rec, err := c.r.Peek(4 + size)
	if err != nil {
		return 0, c.cut(err)
	}
	direct := len(p) >= size-tagSize
	dst := p[:0]
	if !direct {
		if c.rbuf == nil {
			c.rbuf = make([]byte, MaxRecord)
		}
		dst = c.rbuf[:0]
	}
	plain, err := c.open.Open(dst, nonce(c.rseq), rec[4:], rec[:4])
	_, _ = c.r.Discard(4 + size) // Peek has it: Discard cannot fail
	if err != nil {
		return 0, fmt.Errorf("%w: record %d does not open", ErrAuth, c.rseq)
	}
	c.rseq++
	if direct {
		return len(plain), nil
	}
	c.left = plain
	return 0, nil
}

// cut is the error of a read that did not bring a whole record. A
// timeout (a deadline) consumed nothing: what came of the record stays
// read ahead, and a later Read goes on with it. Otherwise, where the
// read brought part of a record, that record was cut short, which ends
// reading.
func (c *Conn) cut(err error) error {
	if c.r.Buffered() == 0 || errors.Is(err, os.ErrDeadlineExceeded) {
		return err
	}
	return fmt.Errorf("%w: a record cut short: %w", ErrAuth, err)
}

// CloseWrite shuts down the writing side of the connection beneath, when
// it has one (a TCP connection): the peer reads EOF.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
