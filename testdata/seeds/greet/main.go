// Command greet is the seed the podvm demo compiles in sandboxes started
// from a snapshot: it needs the module example.com/greeting, which only
// the snapshot's module cache holds (the sandboxes have no network and
// GOPROXY=off).
package main

import (
	"fmt"
	"os"
	"strings"

	"example.com/greeting"
)

func main() {
	fmt.Println(greeting.Hello(strings.Join(os.Args[1:], " ")))
}
