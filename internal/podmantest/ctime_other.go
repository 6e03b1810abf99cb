//go:build !linux

package podmantest

import (
	"io/fs"
	"time"
)

// changeTime is the modification time where the change time is not read.
func changeTime(info fs.FileInfo) time.Time { return info.ModTime() }
