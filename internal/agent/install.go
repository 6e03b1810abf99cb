package agent

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Where the agent is in every sandbox.
const (
	// Dir is the agent's directory.
	Dir = "/.podvm"
	// Path is the agent binary, the sandbox's PID 1.
	Path = Dir + "/podvm-agent"
	// ChannelDir is where a directory of the host, made for one sandbox,
	// is bind-mounted read-only when the sandbox runs on the caller's
	// machine: the host's socket for the agent is there.
	ChannelDir = Dir + "/ch"
	// Socket is the host's socket in [ChannelDir], which the agent
	// connects to.
	Socket = ChannelDir + "/agent.sock"
)

// ConnectArgs are the agent's arguments when its channel is [Socket].
var ConnectArgs = []string{"-connect", Socket}

var hostDirs sync.Map // goarch → the directory HostDir made

// HostDir returns a directory of the user's cache holding the agent for
// linux/goarch as podvm-agent, to bind-mount read-only at [Dir]. It is
// named after the agent's digest and written once per process,
// atomically (aside, then renamed).
func HostDir(goarch string) (string, error) {
	if dir, ok := hostDirs.Load(goarch); ok {
		return dir.(string), nil
	}
	d, err := Digest(goarch)
	if err != nil {
		return "", err
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(cache, "podvm", "agent-"+strings.TrimPrefix(d, "sha256:")[:16]+"-"+goarch)
	// ChannelDir's mount point, in the read-only mount of dir.
	if err := os.MkdirAll(filepath.Join(dir, filepath.Base(ChannelDir)), 0o755); err != nil {
		return "", err
	}
	bin, err := Binary(goarch)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, filepath.Base(Path))
	if old, err := os.ReadFile(path); err != nil || !bytes.Equal(old, bin) {
		tmp, err := os.CreateTemp(dir, ".podvm-agent-*")
		if err != nil {
			return "", err
		}
		_, werr := tmp.Write(bin)
		cerr := tmp.Close()
		if err := errors.Join(werr, cerr, os.Chmod(tmp.Name(), 0o755), os.Rename(tmp.Name(), path)); err != nil {
			os.Remove(tmp.Name())
			return "", err
		}
	}
	hostDirs.Store(goarch, dir)
	return dir, nil
}

var tars sync.Map // goarch → []byte

// Tar returns the agent for linux/goarch as a tar stream to extract at
// "/" of a sandbox: [Dir] and the binary in it, owned by root, mode 0755.
// The caller must not modify it.
func Tar(goarch string) ([]byte, error) {
	if b, ok := tars.Load(goarch); ok {
		return b.([]byte), nil
	}
	bin, err := Binary(goarch)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	epoch := time.Unix(0, 0)
	for _, h := range []*tar.Header{
		{Name: strings.TrimPrefix(Dir, "/") + "/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: epoch},
		{Name: strings.TrimPrefix(Path, "/"), Mode: 0o755, Size: int64(len(bin)), Typeflag: tar.TypeReg, ModTime: epoch},
	} {
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
	}
	tw.Write(bin)
	tw.Close()
	tars.Store(goarch, b.Bytes())
	return b.Bytes(), nil
}
