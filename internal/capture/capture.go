// Package capture holds podvm's bounded output capture, shared by the host
// executor and both sandbox backends so that they truncate identically.
package capture

import (
	"fmt"
	"strconv"
	"strings"
)

// Buffer is an io.Writer that keeps at most max bytes of what is written to
// it: the first half and the last half. Memory stays bounded however much is
// written. The zero value is not usable; call New.
type Buffer struct {
	max   int
	head  []byte // the first headCap bytes
	ring  []byte // the last len(ring) bytes, circular once full
	pos   int    // next write position in ring
	full  bool   // ring has wrapped at least once
	total int64
}

// New returns a Buffer keeping at most max bytes (max must be positive).
func New(max int) *Buffer { return &Buffer{max: max} }

func (b *Buffer) headCap() int { return b.max - b.max/2 }

// Write always consumes all of p and never fails.
func (b *Buffer) Write(p []byte) (int, error) {
	n := len(p)
	b.total += int64(n)
	if room := b.headCap() - len(b.head); room > 0 {
		k := min(room, len(p))
		b.head = append(b.head, p[:k]...)
		p = p[k:]
	}
	tailCap := b.max / 2
	if len(p) == 0 || tailCap == 0 {
		return n, nil
	}
	if b.ring == nil {
		b.ring = make([]byte, 0, tailCap)
	}
	if len(p) >= tailCap {
		// Only the last tailCap bytes of p can survive.
		b.ring = b.ring[:tailCap]
		copy(b.ring, p[len(p)-tailCap:])
		b.pos, b.full = 0, true
		return n, nil
	}
	if !b.full {
		if k := min(tailCap-len(b.ring), len(p)); k > 0 {
			b.ring = append(b.ring, p[:k]...)
			p = p[k:]
		}
		if len(b.ring) < tailCap {
			return n, nil
		}
		b.full = true
		b.pos = 0
	}
	for len(p) > 0 {
		k := copy(b.ring[b.pos:], p)
		p = p[k:]
		b.pos = (b.pos + k) % tailCap
	}
	return n, nil
}

// Total is the number of bytes written, kept or not.
func (b *Buffer) Total() int64 { return b.total }

// Truncated reports whether some bytes written were dropped.
func (b *Buffer) Truncated() bool { return b.total > int64(len(b.head)+len(b.ring)) }

// String returns what was kept. When bytes were dropped, a marker naming
// their count stands where they were: see Marker.
func (b *Buffer) String() string {
	var s strings.Builder
	kept := len(b.head) + len(b.ring)
	omitted := b.total - int64(kept)
	s.Grow(kept + 48)
	s.Write(b.head)
	if omitted > 0 {
		s.WriteString(Marker(omitted))
	}
	if b.full {
		s.Write(b.ring[b.pos:])
		s.Write(b.ring[:b.pos])
	} else {
		s.Write(b.ring)
	}
	return s.String()
}

// Marker is the text that stands in for omitted dropped bytes.
func Marker(omitted int64) string {
	return fmt.Sprintf("\n[... podvm: %d bytes omitted ...]\n", omitted)
}

// Suffix returns the part of captured output s that is known to reach the
// true end of a stream of total bytes: all of s when nothing was dropped,
// otherwise what follows the omission marker.
func Suffix(s string, total int64) string {
	if !strings.Contains(s, " bytes omitted ...]\n") {
		return s
	}
	// The kept length is len(s)-len(marker), and the marker's length
	// depends on the omitted count's digits: try each width.
	for digits := 1; digits <= 19; digits++ {
		kept := int64(len(s) - len(Marker(0)) + 1 - digits)
		omitted := total - kept
		if omitted <= 0 || len(strconv.FormatInt(omitted, 10)) != digits {
			continue
		}
		if i := strings.LastIndex(s, Marker(omitted)); i >= 0 {
			return s[i+len(Marker(omitted)):]
		}
	}
	return s
}

// Tail returns the last n lines of s (a trailing newline does not start a
// new line), each ending in "\n" except possibly the last.
func Tail(s string, n int) string {
	if n <= 0 || s == "" {
		return ""
	}
	end := len(s)
	if s[end-1] == '\n' {
		end--
	}
	i := end
	for ; n > 0; n-- {
		j := strings.LastIndexByte(s[:i], '\n')
		if j < 0 {
			return s
		}
		i = j
	}
	return s[i+1:]
}
