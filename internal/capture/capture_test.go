package capture

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// check compares what a Buffer kept of data written in chunks against data.
func check(t *testing.T, limit int, data []byte, chunks []int) {
	t.Helper()
	b := New(limit)
	rest := data
	for i := 0; len(rest) > 0; i++ {
		n := len(rest)
		if len(chunks) > 0 {
			n = min(max(1, chunks[i%len(chunks)]), len(rest))
		}
		k, err := b.Write(rest[:n])
		require.NoError(t, err)
		require.Equal(t, n, k)
		rest = rest[n:]
	}
	require.Equal(t, int64(len(data)), b.Total())
	if len(data) <= limit {
		require.False(t, b.Truncated())
		require.Equal(t, string(data), b.String())
		return
	}
	require.True(t, b.Truncated())
	head, tail := limit-limit/2, limit/2
	want := string(data[:head]) + Marker(int64(len(data)-head-tail)) + string(data[len(data)-tail:])
	require.Equal(t, want, b.String())
	require.Equal(t, string(data[len(data)-tail:]), Suffix(b.String(), b.Total()))
}

func TestBuffer(t *testing.T) {
	data := []byte(strings.Repeat("0123456789", 100))
	for _, max := range []int{1, 2, 7, 10, 100, 999, 1000, 1001, 5000} {
		for _, chunks := range [][]int{nil, {1}, {3}, {7, 1, 200}, {60, 13}} {
			check(t, max, data, chunks)
		}
	}
}

func TestSuffixUntruncated(t *testing.T) {
	assert.Equal(t, "abc", Suffix("abc", 3))
	s := "text that mentions [... podvm: 3 bytes omitted ...]\n but is whole"
	assert.Equal(t, s, Suffix(s, int64(len(s))), "a marker-looking text in a whole stream is just text")
}

func TestTail(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"", 3, ""},
		{"a\nb\nc\n", 0, ""},
		{"a\nb\nc\n", 1, "c\n"},
		{"a\nb\nc\n", 2, "b\nc\n"},
		{"a\nb\nc\n", 3, "a\nb\nc\n"},
		{"a\nb\nc\n", 9, "a\nb\nc\n"},
		{"a\nb\nc", 1, "c"},
		{"a\nb\nc", 2, "b\nc"},
		{"\n\n", 1, "\n"},
	} {
		assert.Equal(t, tc.want, Tail(tc.s, tc.n), "Tail(%q, %d)", tc.s, tc.n)
	}
}

func TestStreamLiveWriter(t *testing.T) {
	var live bytes.Buffer
	s := NewStream(4, &live)
	s.Write([]byte("hello "))
	s.Write([]byte("world"))
	assert.Equal(t, "hello world", live.String())
	assert.Equal(t, "he"+Marker(7)+"ld", s.String())
	assert.NoError(t, s.LiveErr())
}

func FuzzBuffer(f *testing.F) {
	f.Add([]byte("hello, world"), uint16(5), uint8(3))
	f.Add([]byte{0, 1, 2, '\n', 0xff}, uint16(1), uint8(1))
	f.Fuzz(func(t *testing.T, data []byte, max uint16, chunk uint8) {
		if max == 0 {
			max = 1
		}
		check(t, int(max), data, []int{int(chunk)})
	})
}
