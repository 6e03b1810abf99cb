package exec_test

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// rename changes the process's name (comm), as malware hiding as a kernel
// thread does.
func rename(name string) {
	b := append([]byte(name), 0)
	unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&b[0])), 0, 0, 0)
}
