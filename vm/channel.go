package vm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/podvm/podvm/internal/agent"
)

// This file is the agent's channel where the sandbox runs on the
// caller's machine: a unix socket that this process listens on, in a
// directory of the caller's made for this sandbox alone and bind-mounted
// read-only at agent.ChannelDir, which the agent connects to as it
// starts. Runs and file calls then travel between two processes of this
// machine, not through conmon and the Podman service: faster, and a
// restart of the service does not end the sandbox. The sandbox can make
// nothing in the directory. Where no directory of the caller's can reach
// the sandbox (a remote service, a service in a mount namespace of its
// own), the container's stdio, attached through Podman, is the channel
// (agent.go).

// channelBase is the directory of the caller's channel directories:
// $XDG_RUNTIME_DIR/podvm, else podvm-UID in the system's temporary
// directory. It must be the caller's own directory, reachable by nobody
// else (mode 0700): the sandboxes' sockets are in it.
func channelBase() (string, error) {
	base := filepath.Join(os.TempDir(), "podvm-"+strconv.Itoa(os.Getuid()))
	if rt := os.Getenv("XDG_RUNTIME_DIR"); rt != "" {
		base = filepath.Join(rt, "podvm")
	}
	if err := os.Mkdir(base, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	fi, err := os.Lstat(base)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o700 || !ownedByCaller(fi) {
		return "", fmt.Errorf("vm: %s is not a directory of the caller's with mode 0700", base)
	}
	return base, nil
}

// newChannelDir makes the channel directory of one sandbox, named after
// the calling process (for [Reap]). The sandbox's user, whatever uid it
// maps to, may reach the socket in it (mode 0711, the socket 0666); its
// parent keeps everyone else out.
func newChannelDir() (string, error) {
	base, err := channelBase()
	if err != nil {
		return "", err
	}
	dir, err := os.MkdirTemp(base, strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		return "", err
	}
	// The socket's path must fit in sun_path (108 bytes).
	if sock := channelSocket(dir); len(sock) >= 100 {
		os.Remove(dir)
		return "", fmt.Errorf("vm: socket path %s is too long", sock)
	}
	if err := os.Chmod(dir, 0o711); err != nil {
		os.Remove(dir)
		return "", err
	}
	return dir, nil
}

// channelSocket is the host's path of the agent's socket in dir.
func channelSocket(dir string) string {
	return filepath.Join(dir, filepath.Base(agent.Socket))
}

// connectAgent listens on the socket of the channel directory dir,
// starts created container id, whose agent connects to it, and takes
// that one connection: the agent, PID 1, makes it before anything else
// runs in the sandbox. The socket is then removed: nothing else can
// connect.
func (s *sandbox) connectAgent(ctx context.Context, id, dir string) (*agent.Client, error) {
	sock := channelSocket(dir)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("vm: the agent's socket: %w", err)
	}
	defer l.Close() // and removed
	if err := os.Chmod(sock, 0o666); err != nil {
		return nil, fmt.Errorf("vm: the agent's socket: %w", err)
	}
	if _, err := finishDespiteCancel(ctx, "starting the container", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, s.d.Start(ctx, id)
	}); err != nil {
		return nil, err
	}
	_ = l.SetDeadline(time.Now().Add(agentHello))
	stop := context.AfterFunc(ctx, func() { _ = l.SetDeadline(time.Now()) })
	defer stop()
	conn, err := l.AcceptUnix()
	switch {
	case ctx.Err() != nil:
		return nil, fmt.Errorf("vm: connecting to the agent: %w", ctx.Err())
	case err != nil:
		return nil, fmt.Errorf("%w: the sandbox's agent did not connect to %s within %v: %w", ErrPodman, sock, agentHello, err)
	}
	return s.handshake(ctx, conn)
}

// reapChannelDirs removes the channel directories of processes that no
// longer exist, and returns how many it removed.
func reapChannelDirs() int {
	base, err := channelBase()
	if err != nil {
		return 0
	}
	list, _ := os.ReadDir(base)
	n := 0
	for _, e := range list {
		owner, _, _ := strings.Cut(e.Name(), "-")
		pid, err := strconv.Atoi(owner)
		if err == nil && pid > 0 && pid != os.Getpid() && !processAlive(pid) && os.RemoveAll(filepath.Join(base, e.Name())) == nil {
			n++
		}
	}
	return n
}
