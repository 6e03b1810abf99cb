package podmantest

import (
	"io/fs"
	"syscall"
	"time"
)

// changeTime is the inode's change time.
func changeTime(info fs.FileInfo) time.Time {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return time.Unix(st.Ctim.Unix())
	}
	return info.ModTime()
}
