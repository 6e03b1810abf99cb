//go:build !linux

package exec_test

// rename is Linux only; the containment tests that use it are too.
func rename(string) {}
