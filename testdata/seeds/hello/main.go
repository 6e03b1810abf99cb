// Command hello is the seed the podvm demo compiles and runs in a sandbox.
// With no arguments it greets; with host:port arguments it tries to dial
// each one over TCP and reports what happened, exiting 1 if any connected.
package main

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"time"
)

func main() {
	if len(os.Args) == 1 {
		fmt.Printf("hello from %s %s/%s\n", runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return
	}
	code := 0
	for _, addr := range os.Args[1:] {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			fmt.Println(err)
			continue
		}
		c.Close()
		fmt.Println("connected to", addr)
		code = 1
	}
	os.Exit(code)
}
