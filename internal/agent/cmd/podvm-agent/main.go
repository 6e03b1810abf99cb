// Command podvm-agent is podvm's agent, PID 1 of every sandbox podvm
// creates. It speaks the protocol of package
// github.com/podvm/podvm/internal/agent on its stdin and stdout.
package main

import (
	"os"

	"github.com/podvm/podvm/internal/agent/server"
)

func main() { os.Exit(server.Main(os.Args[1:])) }
