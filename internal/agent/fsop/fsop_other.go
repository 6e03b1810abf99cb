//go:build !linux

package fsop

import (
	"io"
	"runtime"
)

// The agent runs on Linux only; elsewhere every operation fails.

func errNotSupported() error {
	return failf(CodeFailed, "file operations are not supported on %s", runtime.GOOS)
}

func readFile(string, int64, io.Writer) error          { return errNotSupported() }
func writeFile(string, int64, uint32, io.Reader) error { return errNotSupported() }
func listDir(string, io.Writer) error                  { return errNotSupported() }
func tarOut(string, io.Writer) error                   { return errNotSupported() }
func tarIn(string, io.Reader) error                    { return errNotSupported() }
func errnoCode(error) Code                             { return CodeFailed }
