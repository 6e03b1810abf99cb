package vm

import (
	"io/fs"
	"os"
	"syscall"
)

// ownedByCaller reports whether fi belongs to the calling user.
func ownedByCaller(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Geteuid()
}
