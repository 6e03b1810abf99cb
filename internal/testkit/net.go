package testkit

import (
	"bufio"
	"io"
	"net"
	"strings"
	"time"
)

// UpperEcho serves one connection: each line it reads is written back
// upper-cased, until the connection ends; then it closes it.
func UpperEcho(c io.ReadWriteCloser) {
	defer c.Close()
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		if _, err := io.WriteString(c, strings.ToUpper(sc.Text())+"\n"); err != nil {
			return
		}
	}
}

// Freed reports whether nothing listens at TCP address addr, trying for
// up to within: it is free once a listener of the caller's can take it
// (and gives it back at once). A dial would not say: a closed
// listener's port is free for any listener on the machine, and a dial
// to a free port can connect to itself. A listener elsewhere can take
// the port too, but it would have to keep it for the whole of within.
func Freed(addr string, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for {
		l, err := net.Listen("tcp", addr)
		if err == nil {
			l.Close()
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
