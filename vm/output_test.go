package vm

import (
	"bytes"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An Output keeps its last bytes; readers read from any offset still
// kept, count what they missed, and end at the stream's end.
func TestOutput(t *testing.T) {
	t.Parallel()
	o := newOutput(8)
	o.write([]byte("abc"))
	from, b := o.Bytes()
	assert.Equal(t, int64(0), from)
	assert.Equal(t, "abc", string(b))

	r := o.Reader(0)
	p := make([]byte, 2)
	n, err := r.Read(p)
	require.NoError(t, err)
	assert.Equal(t, "ab", string(p[:n]))

	o.write([]byte("defghij")) // 10 bytes in all: "ab" fell out
	assert.Equal(t, int64(10), o.Len())
	assert.Equal(t, int64(2), o.Dropped())
	from, b = o.Bytes()
	assert.Equal(t, int64(2), from)
	assert.Equal(t, "cdefghij", string(b))

	late := o.Reader(0) // came back after the buffer moved on
	got, _ := readSome(t, late, 8)
	assert.Equal(t, "cdefghij", got)
	assert.Equal(t, int64(2), late.Skipped())
	assert.Equal(t, int64(10), late.Offset())

	got, _ = readSome(t, r, 8) // r stood at 2: nothing lost
	assert.Equal(t, "cdefghij", got)
	assert.Zero(t, r.Skipped())

	o.write([]byte(strings.Repeat("x", 20) + "tail")) // more than the buffer at once
	from, b = o.Bytes()
	assert.Equal(t, "xxxxtail", string(b))
	assert.Equal(t, int64(26), from)
	got, _ = readSome(t, r, 8)
	assert.Equal(t, "xxxxtail", got)
	assert.Equal(t, int64(16), r.Skipped(), "from 10 to 26")

	o.close()
	n, err = r.Read(p)
	assert.Zero(t, n)
	assert.Equal(t, io.EOF, err)
	all, err := io.ReadAll(o.Reader(30))
	require.NoError(t, err)
	assert.Equal(t, "tail", string(all))
}

// A Read waits for bytes to come, and Close ends a pending Read.
func TestOutputReaderBlocks(t *testing.T) {
	t.Parallel()
	o := newOutput(1 << 10)
	r := o.Reader(0)
	got := make(chan string, 1)
	go func() {
		p := make([]byte, 16)
		n, _ := r.Read(p)
		got <- string(p[:n])
	}()
	select {
	case s := <-got:
		t.Fatalf("Read returned %q before anything was written", s)
	case <-time.After(20 * time.Millisecond):
	}
	o.write([]byte("hello"))
	assert.Equal(t, "hello", <-got)

	errc := make(chan error, 1)
	go func() {
		_, err := r.Read(make([]byte, 1))
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, r.Close())
	assert.ErrorIs(t, <-errc, ErrReaderClosed)
}

// Many writers and readers at once: every reader that keeps up sees the
// stream whole.
func TestOutputConcurrent(t *testing.T) {
	t.Parallel()
	o := newOutput(64 << 10)
	var want bytes.Buffer
	for i := range 1000 {
		want.WriteString(strings.Repeat(string(rune('a'+i%26)), i%37+1))
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := io.ReadAll(o.Reader(0))
			assert.NoError(t, err)
			assert.Equal(t, want.String(), string(got))
		}()
	}
	src := want.Bytes()
	for len(src) > 0 {
		k := min(len(src), 100)
		o.write(src[:k])
		src = src[k:]
	}
	o.close()
	wg.Wait()
}

// readSome reads what r has now, up to n bytes, without waiting for more.
func readSome(t *testing.T, r *OutputReader, n int) (string, error) {
	t.Helper()
	p := make([]byte, n)
	k, err := r.Read(p)
	return string(p[:k]), err
}

// The buffer grows with what comes, wraps at its size, and a zero-length
// read returns at once.
func TestOutputGrows(t *testing.T) {
	t.Parallel()
	o := newOutput(1 << 20)
	assert.Zero(t, cap(o.buf), "a silent stream costs nothing")
	o.write([]byte("abc"))
	assert.Less(t, cap(o.buf), 1<<10)
	n, err := o.Reader(0).Read(nil)
	assert.Zero(t, n)
	assert.NoError(t, err)

	small := newOutput(5)
	for _, w := range []string{"ab", "cdefg", "h", "ijklmnopq"} {
		small.write([]byte(w))
	}
	from, b := small.Bytes()
	assert.Equal(t, int64(12), from)
	assert.Equal(t, "mnopq", string(b))
}
