package server

import (
	"net"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestProcAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0100007F:1F90":                         "127.0.0.1:8080",
		"00000000:0016":                         "0.0.0.0:22",
		"00000000000000000000000001000000:0050": "[::1]:80",
		"0000000000000000FFFF00000100007F:0050": "127.0.0.1:80",
		"junk":                                  "junk",
	} {
		assert.Equal(t, want, procAddr(in), in)
	}
}

// The census names this process's own listening socket and its holder.
func TestTCPSocketsNamesHolder(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	want := "pid " + strconv.Itoa(os.Getpid()) + " (" // comm is the test binary's
	var found bool
	for _, s := range tcpSockets() {
		if strings.HasPrefix(s, want) && strings.HasSuffix(s, "listening on "+l.Addr().String()) {
			found = true
		}
	}
	assert.True(t, found, "%q in %q", l.Addr(), tcpSockets())
}
