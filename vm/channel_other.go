//go:build !linux

package vm

import "io/fs"

// ownedByCaller is false: a unix socket in a bind-mounted directory is
// podvm's channel on Linux only (Podman elsewhere runs its containers in
// a virtual machine, across a file share that carries no socket).
func ownedByCaller(fs.FileInfo) bool { return false }
