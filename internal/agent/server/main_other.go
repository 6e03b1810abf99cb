//go:build !linux

package server

import (
	"fmt"
	"os"
)

// Main reports that the agent runs on Linux only.
func Main(args []string) int {
	fmt.Fprintln(os.Stderr, "podvm-agent: runs on Linux only")
	return 2
}
