// Command gen builds podvm's agent for every architecture the module
// ships and writes bin/podvm-agent-linux-<arch>.gz, byte for byte the
// same on every machine: a static binary (no cgo) built with -trimpath,
// no VCS stamp and an empty build id, by the pinned Go release, gzipped
// with no name and no time stamp. It runs from `go generate` in
// internal/agent.
package main

import (
	"bytes"
	"compress/gzip"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
)

// toolchain is the Go release that builds (and gzips) the shipped
// binaries. The go command fetches it when another is installed
// (GOTOOLCHAIN); changing it changes the binaries.
const toolchain = "go1.26.8"

// arches are the architectures shipped, all for GOOS=linux.
var arches = []string{"amd64", "arm64"}

func main() {
	out := flag.String("out", "bin", "directory for the gzipped binaries")
	flag.Parse()
	if err := run(*out); err != nil {
		fmt.Fprintln(os.Stderr, "gen:", err)
		os.Exit(1)
	}
}

func run(out string) error {
	if runtime.Version() != toolchain {
		// gzip's output is part of the result: compress with the pinned
		// release too, by running this generator again under it.
		if os.Getenv("PODVM_GEN_REEXEC") != "" {
			return fmt.Errorf("running under %s, not %s", runtime.Version(), toolchain)
		}
		cmd := exec.Command("go", "run", "./gen", "-out", out)
		cmd.Env = append(os.Environ(), "GOTOOLCHAIN="+toolchain, "PODVM_GEN_REEXEC=1")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		return cmd.Run()
	}
	tmp, err := os.MkdirTemp("", "podvm-agent-gen")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, arch := range arches {
		exe := filepath.Join(tmp, "podvm-agent-"+arch)
		cmd := exec.Command("go", "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w -buildid=", "-o", exe, "./cmd/podvm-agent")
		cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+arch, "CGO_ENABLED=0", "GOTOOLCHAIN="+toolchain,
			"GOFLAGS=", "GOAMD64=v1", "GOARM64=v8.0", "GOEXPERIMENT=", "GOWORK=off")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("building for %s: %w", arch, err)
		}
		bin, err := os.ReadFile(exe)
		if err != nil {
			return err
		}
		var buf bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression) // the header: no name, no time
		if _, err := zw.Write(bin); err != nil {
			return err
		}
		if err := zw.Close(); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(out, "podvm-agent-linux-"+arch+".gz"), buf.Bytes(), 0o644); err != nil {
			return err
		}
	}
	return nil
}
