package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"
	"syscall"

	"github.com/podvm/podvm/internal/agent"
	"github.com/podvm/podvm/internal/agent/fsop"
	"github.com/podvm/podvm/internal/capture"
	"github.com/podvm/podvm/internal/targuard"
)

// agentSelf is what a file call runs: the agent's own binary, as the
// agent's process holds it (its command's /proc/self/exe, the shim's,
// which is the agent's), never the file at agent.Path, which code in the
// sandbox could replace where the agent's directory is writable (a kube
// pod's, whose PID 1 installs the agent there).
const agentSelf = "/proc/self/exe"

// This file is the file calls and the copies of a sandbox whose agent is
// there: the agent binary, run in the sandbox as `podvm-agent -fs OP`,
// reads, writes, lists and archives the files itself, the data on its
// stdin and stdout through the agent's channel. A path is only a path
// (Podman's archive endpoint and `podman cp` expand glob characters),
// names are bytes, nothing is spooled on the host, every entry of a copy
// into the sandbox is made beneath its destination without following a
// link out of it (openat2 RESOLVE_BENEATH), and what a tar stream cannot
// carry (a socket) is reported, not dropped. Without the agent
// ([Config.PodmanExec]) the copies go through Podman (copy.go) and the
// file calls through them (files.go).

// fileOp runs the agent's file operation args in the sandbox with stdin
// and stdout, for the call op on p, and maps its failure to the file
// calls' errors, the sentinel of each [fsop.Code]. It returns [ErrNotSupported] on a sandbox without the
// agent.
func (s *sandbox) fileOp(ctx context.Context, op, p string, stdin io.Reader, stdout io.Writer, args ...string) error {
	st, err := s.container()
	if err != nil {
		return err
	}
	if st.agent == nil {
		return ErrNotSupported
	}
	stderr := capture.New(4 << 10) // one line, from the agent
	req := agent.Request{Argv: append([]string{agentSelf, "-fs"}, args...), Dir: "/"}
	// A stdout that fails (the guard refused an entry, the caller's
	// writer broke, a reply over its bound) ends the operation at once.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var out *stopWriter
	if stdout != nil {
		out = &stopWriter{w: stdout, stop: cancel}
		stdout = out
	}
	c, done := st.agent.take()
	ex, err := c.Run(ctx, req, stdin, stdout, stderr)
	done()
	why := strings.TrimSpace(stderr.String())
	switch {
	case out != nil && out.err != nil:
		return fmt.Errorf("vm: %s %s: %w", op, p, out.err)
	case errors.Is(err, agent.ErrChannelClosed):
		return s.channelClosed(ctx, op+" "+p, err)
	case err != nil:
		return fmt.Errorf("vm: %s %s: %w", op, p, err)
	case ex.Code == 0:
		return nil
	}
	switch code := fsop.Code(ex.Code); {
	case code == fsop.CodeUnsafe:
		return fmt.Errorf("%w: %s %s: %s", ErrUnsafeArchive, op, p, why)
	case code == fsop.CodeFailed:
		return fmt.Errorf("vm: %s %s: %s", op, p, why)
	case codeErrors[code] != nil:
		return fmt.Errorf("vm: %s %s: %s: %w", op, p, why, codeErrors[code])
	}
	return fmt.Errorf("%w: %s %s: the agent's file operation exited %d: %s", ErrPodman, op, p, ex.Code, why)
}

// codeErrors are the sentinels of the agent's file operations' exit
// codes, as the file calls document them.
var codeErrors = map[fsop.Code]error{
	fsop.CodeNotExist:    fs.ErrNotExist,
	fsop.CodeTooLarge:    ErrFileTooLarge,
	fsop.CodeExist:       fs.ErrExist,
	fsop.CodeInvalid:     fs.ErrInvalid,
	fsop.CodeIsDir:       syscall.EISDIR,
	fsop.CodeNotDir:      syscall.ENOTDIR,
	fsop.CodeNameTooLong: syscall.ENAMETOOLONG,
	fsop.CodePermission:  fs.ErrPermission,
	fsop.CodeReadOnly:    syscall.EROFS,
	fsop.CodeLoop:        syscall.ELOOP,
	fsop.CodeNoSpace:     syscall.ENOSPC,
}

// stopWriter passes writes to w until one fails: it keeps that error and
// calls stop. Run returns only once no Write is in progress.
type stopWriter struct {
	w    io.Writer
	stop func()
	err  error
}

func (s *stopWriter) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.w.Write(p)
	if err != nil {
		s.err = err
		s.stop()
	}
	return n, err
}

// boundedBuffer holds what is written to it up to max bytes, and fails
// past that: what the agent sends the host is bounded whatever runs in
// the sandbox.
type boundedBuffer struct {
	bytes.Buffer
	max int64
}

// errOverBound: the agent sent more than the call can take.
var errOverBound = errors.New("the sandbox sent more than asked for")

func (b *boundedBuffer) Write(p []byte) (int, error) {
	if int64(b.Len()+len(p)) > b.max {
		return 0, fmt.Errorf("%w (over %d bytes)", errOverBound, b.max)
	}
	return b.Buffer.Write(p)
}

// maxListing bounds a directory listing the agent sends: ReadDir holds it
// in memory.
const maxListing = 256 << 20

// WriteFile implements [FileServer] through the agent: r streams to the
// file, whatever its size, with nothing spooled on the host.
func (s *sandbox) WriteFile(ctx context.Context, p string, r io.Reader, size int64, perm fs.FileMode) error {
	if size >= 0 {
		// One byte past size is enough for the agent to refuse a content
		// that holds more; an endless r is never read to its end.
		r = io.LimitReader(r, size+1)
	}
	in := &errReader{r: r}
	err := s.fileOp(ctx, "write file", p, in, nil, "write", p, strconv.FormatInt(size, 10), strconv.FormatInt(tarMode(perm), 8))
	if in.Err() != nil {
		return fmt.Errorf("vm: write file %s: reading the content: %w", p, in.Err())
	}
	return err
}

// ReadFile implements [FileServer] through the agent.
func (s *sandbox) ReadFile(ctx context.Context, p string, maxBytes int64) ([]byte, error) {
	b := &boundedBuffer{max: maxBytes}
	err := s.fileOp(ctx, "read file", p, nil, b, "read", p, strconv.FormatInt(maxBytes, 10))
	if errors.Is(err, errOverBound) {
		return nil, fmt.Errorf("%w: %w", ErrPodman, err)
	}
	if err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// ReadDir implements [FileServer] through the agent: only the listing
// travels, not the tree.
func (s *sandbox) ReadDir(ctx context.Context, dir string) ([]FileInfo, error) {
	b := &boundedBuffer{max: maxListing}
	err := s.fileOp(ctx, "read dir", dir, nil, b, "list", dir)
	if errors.Is(err, errOverBound) {
		return nil, fmt.Errorf("%w: %w", ErrPodman, err)
	}
	if err != nil {
		return nil, err
	}
	list, err := fsop.DecodeList(b)
	if err != nil {
		return nil, fmt.Errorf("%w: read dir %s: %w", ErrPodman, dir, err)
	}
	out := make([]FileInfo, len(list))
	for i, e := range list {
		out[i] = FileInfo{Name: e.Name, Size: e.Size, Mode: e.Mode, ModTime: e.ModTime, Link: e.Link}
	}
	return out, nil
}

// copyInAgent is CopyIn through the agent.
func (s *sandbox) copyInAgent(ctx context.Context, dir string, r io.Reader) error {
	return s.tarIn(ctx, dir, targuard.New(r, ""))
}

// copyInChecked implements checkedCopier: CopyIn of an archive checked
// already, through the agent without the guard's second pass, else
// CopyIn.
func (s *sandbox) copyInChecked(ctx context.Context, dir string, r io.Reader) error {
	p, st, err := s.checkedPath("copy into", dir)
	if err != nil || st.agent == nil {
		return s.CopyIn(ctx, dir, r)
	}
	return s.tarIn(ctx, p, r)
}

// tarIn extracts the archive r in dir through the agent.
func (s *sandbox) tarIn(ctx context.Context, dir string, r io.Reader) error {
	in := &errReader{r: r}
	err := s.fileOp(ctx, "copy into", dir, in, nil, "tar-in", dir)
	if in.Err() != nil {
		return fmt.Errorf("vm: copy into %s: %w", dir, in.Err())
	}
	return err
}
