// Command hellosrv is the bench's hello server: it writes "hello\n" to
// each connection on 127.0.0.1:PORT and closes it, in the process that
// accepted it. busybox's servers fork a process per connection, and on
// a machine slow to start processes that fork, not podvm's connection,
// was what "vm.Dial to the first byte" measured. Built static, it runs
// in any sandbox image of the host's architecture.
//
//	hellosrv PORT
package main

import (
	"fmt"
	"net"
	"os"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: hellosrv PORT")
		os.Exit(2)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+os.Args[1])
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
		_, _ = c.Write([]byte("hello\n"))
		c.Close()
	}
}
