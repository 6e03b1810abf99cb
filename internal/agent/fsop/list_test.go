package fsop

import (
	"bytes"
	"io/fs"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestDecodeList(t *testing.T) {
	t.Parallel()
	want := []Entry{
		{Name: "a\nb", Size: 3, Mode: fs.ModeSetuid | 0o755, ModTime: time.Unix(1e9, 123)},
		{Name: "bad-\xff\xfe", Mode: fs.ModeSymlink | 0o777, ModTime: time.Unix(-5, 0), Link: "../\xff"},
	}
	var buf bytes.Buffer
	enc := newListEncoder(&buf)
	for i := range want {
		require.NoError(t, enc.add(&want[i]))
	}
	require.NoError(t, enc.close())
	got, err := DecodeList(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	assert.Equal(t, want, got)

	// Any cut is an error: the listing may be incomplete.
	for n := range buf.Len() {
		_, err := DecodeList(bytes.NewReader(buf.Bytes()[:n]))
		assert.Error(t, err, "cut at %d of %d bytes", n, buf.Len())
	}
	_, err = DecodeList(bytes.NewReader([]byte("pvl1\x01\xff\xff\xff\xff")))
	assert.Error(t, err, "a string of 4 GiB")
}
