// Command unixecho serves a unix socket for vmtest's service/unix case,
// where busybox serves none: each connection gets back what it sent,
// upper-cased, once it half-closed, and is then closed. Built static
// (CGO_ENABLED=0), it runs in any sandbox image of the host's
// architecture.
//
//	unixecho /path/to.sock
package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: unixecho /path/to.sock")
		os.Exit(2)
	}
	l, err := net.Listen("unix", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for {
		c, err := l.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		go func() {
			defer c.Close()
			b, err := io.ReadAll(c)
			if err == nil {
				_, _ = c.Write(bytes.ToUpper(b))
			}
		}()
	}
}
