package agent

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
)

//go:generate go run ./gen -out bin

//go:embed bin/podvm-agent-linux-amd64.gz bin/podvm-agent-linux-arm64.gz
var binaries embed.FS

// ErrArch reports an architecture the module carries no agent for.
var ErrArch = errors.New("agent: no agent binary for this architecture")

// Arches are the GOARCH values [Binary] serves, all for GOOS=linux.
var Arches = []string{"amd64", "arm64"}

// BinaryGzip returns the gzipped agent for linux/goarch, as embedded; the
// caller must not modify it. It wraps [ErrArch] for another goarch.
func BinaryGzip(goarch string) ([]byte, error) {
	b, err := binaries.ReadFile("bin/podvm-agent-linux-" + goarch + ".gz")
	if err != nil {
		return nil, fmt.Errorf("%w: %q (have %v)", ErrArch, goarch, Arches)
	}
	return b, nil
}

// Binary returns the agent for linux/goarch: a static executable to run
// as PID 1 of a sandbox. It wraps [ErrArch] for another goarch.
func Binary(goarch string) ([]byte, error) {
	gz, err := BinaryGzip(goarch)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, fmt.Errorf("agent: embedded binary for %s: %w", goarch, err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("agent: embedded binary for %s: %w", goarch, err)
	}
	return b, nil
}

// Digest returns "sha256:" and the hex SHA-256 of the gzipped agent for
// linux/goarch: a content version that changes with any change to the
// agent, for naming a cached copy (an image, a file) of it.
func Digest(goarch string) (string, error) {
	gz, err := BinaryGzip(goarch)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(gz)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}
