package vm_test

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net/url"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/podmantest"
	"github.com/podvm/podvm/vm"
)

// sshAPIEnv, set to an ssh:// URL, makes the test binary [sshAPIConnect]
// instead of testing: the bindings' ssh client reads the HOME the process
// had when it first asked, so each HOME the API is tried with needs a
// process of its own.
const sshAPIEnv = "PODVM_TEST_SSH_API_URL"

// sshAPIConnect makes an APIVM on uri with NewAPIVM, then with New, and
// prints one line for each: "ok", or "unavailable=BOOL ERROR". Its exit
// status is 0 when it could tell.
func sshAPIConnect(uri string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := vm.Config{Image: cmp.Or(os.Getenv("PODVM_TEST_IMAGE"), "localhost/podvm-test:latest")}
	report := func(op string, v vm.VM, err error) {
		if err != nil {
			fmt.Printf("%s: unavailable=%t %v\n", op, errors.Is(err, vm.ErrUnavailable), err)
			return
		}
		fmt.Printf("%s: ok\n", op)
		_ = v.Remove(ctx)
	}
	v, err := vm.NewAPIVM(ctx, uri, cfg)
	report("NewAPIVM", v, err)
	nv, err := vm.New(ctx, cfg, vm.WithURL(uri), vm.WithBackend(vm.BackendAPI))
	report("New", nv, err)
	return 0
}

// TestSSHHostKey: over ssh://, both backends refuse a host that is not
// in known_hosts, or whose key does not match it, with an error saying
// so, before Podman's ssh client (which would add an unknown host to
// known_hosts) ever runs; and they connect to the host known_hosts knows.
func TestSSHHostKey(t *testing.T) {
	uri := podmantest.NeedSSH(t)
	u, err := url.Parse(uri)
	require.NoError(t, err)
	host := knownhosts.Normalize(u.Host)
	known, err := os.ReadFile(filepath.Join(os.Getenv("HOME"), ".ssh", "known_hosts"))
	require.NoError(t, err, "PODVM_SSH_URL's host must be in $HOME/.ssh/known_hosts")
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	require.NoError(t, err)
	other, err := ssh.NewSignerFromKey(priv)
	require.NoError(t, err)
	podmanBin := cmp.Or(os.Getenv("PODVM_PODMAN"), "podman")
	image := os.Getenv("PODVM_TEST_IMAGE")

	for _, c := range []struct {
		name  string
		known []byte // nil: no known_hosts file
		err   string // "": connects
	}{
		{"no known_hosts", nil, "podvm does not trust a host on first use"},
		{"empty known_hosts", []byte{}, "podvm does not trust a host on first use"},
		{"another key", []byte(knownhosts.Line([]string{host}, other.PublicKey()) + "\n"), "does not match"},
		{"known", known, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			home := t.TempDir()
			t.Setenv("HOME", home) // podman, which CLIVM runs, reads it
			file := filepath.Join(home, ".ssh", "known_hosts")
			if c.known != nil {
				require.NoError(t, os.MkdirAll(filepath.Dir(file), 0o700))
				require.NoError(t, os.WriteFile(file, c.known, 0o600))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cfg := vm.Config{Image: cmp.Or(image, "localhost/podvm-test:latest")}
			if c.err == "" && image == "" {
				t.Skip("connecting needs the test image: set PODVM_TEST_IMAGE")
			}

			// The API, in a process whose HOME is home from the start.
			cmd := osexec.CommandContext(ctx, os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), "HOME="+home, sshAPIEnv+"="+uri)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			for _, op := range []string{"NewAPIVM", "New"} {
				line := regexp.MustCompile(`(?m)^` + op + `: (.*)$`).FindSubmatch(out)
				require.NotNil(t, line, "no line for %s in:\n%s", op, out)
				got := string(line[1])
				if c.err == "" {
					assert.Equal(t, "ok", got, op)
				} else {
					assert.True(t, strings.HasPrefix(got, "unavailable=true "), "%s: does not match ErrUnavailable: %s", op, got)
					assert.Contains(t, got, c.err, op)
				}
			}

			// The CLI: podman runs with this process's HOME.
			cli, err := vm.NewCLIVM(cfg, nil, vm.WithURL(uri), vm.WithPodman(podmanBin))
			require.NoError(t, err)
			err = cli.Create(ctx)
			if c.err == "" {
				require.NoError(t, err)
				res, err := cli.Run(ctx, exec.Command{Name: "echo", Args: []string{"over ssh"}})
				require.NoError(t, err)
				assert.Equal(t, "over ssh\n", res.Stdout)
			} else {
				assert.ErrorIs(t, err, vm.ErrUnavailable, "CLIVM.Create")
				assert.ErrorContains(t, err, c.err, "CLIVM.Create")
			}
			assert.NoError(t, cli.Remove(ctx))

			after, err := os.ReadFile(file)
			if c.known == nil {
				assert.True(t, errors.Is(err, os.ErrNotExist), "known_hosts appeared: %v: %q", err, after)
			} else {
				require.NoError(t, err)
				assert.Equal(t, string(c.known), string(after), "known_hosts changed")
			}
		})
	}
}
