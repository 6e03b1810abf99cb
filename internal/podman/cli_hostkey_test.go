package podman

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/mock/gomock"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/exec/execmock"
	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/sshhost"
)

// The CLI driver checks an ssh:// host's key before podman first runs:
// an unknown host never reaches podman (whose ssh client would add it to
// known_hosts), and once the key is verified the driver and its copies
// do not check again.
func TestCLIHostKey(t *testing.T) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	key, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(ssh.ConnMetadata, ssh.PublicKey) (*ssh.Permissions, error) {
		return nil, errors.New("no one gets in")
	}}
	cfg.AddHostKey(key)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _, _, _ = ssh.NewServerConn(c, cfg) }()
		}
	}()

	home := t.TempDir()
	t.Setenv("HOME", home)
	uri := "ssh://root@" + ln.Addr().String() + "/run/podman/podman.sock"
	x := execmock.NewMockExecutor(gomock.NewController(t))
	d, err := NewCLI(x, "podman", uri, "")
	require.NoError(t, err)

	// No known_hosts: podman is never run, and no file appears.
	for range 2 {
		_, err = d.Image(context.Background(), "img")
		assert.ErrorIs(t, err, driver.ErrUnavailable)
		assert.ErrorIs(t, err, driver.ErrNotReached)
		assert.ErrorIs(t, err, sshhost.ErrUnknownHost)
	}
	_, err = os.Stat(filepath.Join(home, ".ssh", "known_hosts"))
	assert.True(t, errors.Is(err, os.ErrNotExist), "known_hosts made: %v", err)

	// Known: podman runs; a copy of the driver checks no more, even with
	// the host gone.
	require.NoError(t, os.MkdirAll(filepath.Join(home, ".ssh"), 0o700))
	line := knownhosts.Line([]string{knownhosts.Normalize(ln.Addr().String())}, key.PublicKey())
	require.NoError(t, os.WriteFile(filepath.Join(home, ".ssh", "known_hosts"), []byte(line+"\n"), 0o600))
	x.EXPECT().Run(gomock.Any(), gomock.Any()).Return(&exec.Result{Stdout: "amd64\n"}, nil).Times(2)
	arch, err := d.Image(context.Background(), "img")
	require.NoError(t, err)
	assert.Equal(t, "amd64", arch)
	ln.Close()
	c := d
	_, err = c.Image(context.Background(), "img")
	assert.NoError(t, err)
}
