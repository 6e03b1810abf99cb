package sshhost_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podvm/podvm/internal/sshhost"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

// server is an ssh server on 127.0.0.1 that shows hostKeys and accepts
// no one. It stops with the test.
func server(t *testing.T, hostKeys ...ssh.Signer) (port int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(ssh.ConnMetadata, ssh.PublicKey) (*ssh.Permissions, error) {
		return nil, errors.New("no one gets in")
	}}
	for _, k := range hostKeys {
		cfg.AddHostKey(k)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if sc, _, _, err := ssh.NewServerConn(c, cfg); err == nil {
					sc.Close()
				}
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

func ed25519Key(t *testing.T) ssh.Signer {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ecdsaKey(t *testing.T) ssh.Signer {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ssh.NewSignerFromKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// home makes a HOME whose known_hosts holds lines, or that has no
// known_hosts when lines is nil, and returns the file's path.
func home(t *testing.T, lines []string) string {
	t.Helper()
	dir := t.TempDir()
	t.Setenv("HOME", dir)
	file := filepath.Join(dir, ".ssh", "known_hosts")
	if lines == nil {
		return file
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

func TestCheck(t *testing.T) {
	ed, ec, other := ed25519Key(t), ecdsaKey(t), ed25519Key(t)
	port := server(t, ed, ec) // offers ecdsa first to a client that knows nothing
	hostport := "[127.0.0.1]:" + strconv.Itoa(port)
	line := func(host string, k ssh.Signer) string { return knownhosts.Line([]string{host}, k.PublicKey()) }
	uri := "ssh://root@127.0.0.1:" + strconv.Itoa(port) + "/run/podman/podman.sock"

	cases := []struct {
		name  string
		lines []string // nil: no known_hosts file
		err   error    // nil: verified
		want  []string // in the error's text
	}{
		{name: "known", lines: []string{line(hostport, ec)}},
		{name: "known, hashed", lines: []string{line(knownhosts.HashHostname(hostport), ec)}},
		{name: "known by another key type than the server's first", lines: []string{line(hostport, ed)}},
		{name: "known by both key types", lines: []string{line(hostport, ec), line(hostport, ed)}},
		{name: "known among other hosts", lines: []string{line("example.com", other), line(hostport, ec)}},
		{
			name: "unknown", lines: []string{line("example.com", ed)}, err: sshhost.ErrUnknownHost,
			want: []string{"not in", "does not trust a host on first use", ssh.FingerprintSHA256(ec.PublicKey()), "ssh-keyscan -p " + strconv.Itoa(port) + " 127.0.0.1 >> "},
		},
		{
			name: "known on port 22 only", lines: []string{line("127.0.0.1", ed)}, err: sshhost.ErrUnknownHost,
			want: []string{hostport, "does not trust"},
		},
		{
			name: "no known_hosts file", err: sshhost.ErrUnknownHost,
			want: []string{"(no such file)", "does not trust", "ssh-keyscan -p"},
		},
		{
			name: "changed", lines: []string{line(hostport, other)}, err: sshhost.ErrChangedHost,
			want: []string{"does not match", "connection refused", ssh.FingerprintSHA256(other.PublicKey()), ssh.FingerprintSHA256(ed.PublicKey())},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			file := home(t, c.lines)
			before, _ := os.ReadFile(file)
			err := sshhost.Check(context.Background(), uri)
			if c.err == nil {
				if err != nil {
					t.Fatalf("Check: %v, want nil", err)
				}
			} else {
				if !errors.Is(err, c.err) {
					t.Fatalf("Check: %v, want %v", err, c.err)
				}
				for _, w := range c.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("the error does not say %q: %v", w, err)
					}
				}
			}
			after, rerr := os.ReadFile(file)
			switch {
			case c.lines == nil && !errors.Is(rerr, os.ErrNotExist):
				t.Errorf("Check made %s: %v", file, rerr)
			case string(after) != string(before):
				t.Errorf("Check changed known_hosts:\n%s\nto:\n%s", before, after)
			}
		})
	}
}

func TestCheckRevoked(t *testing.T) {
	k := ed25519Key(t)
	port := strconv.Itoa(server(t, k))
	home(t, []string{"@revoked " + knownhosts.Line([]string{"[127.0.0.1]:" + port}, k.PublicKey())})
	err := sshhost.Check(context.Background(), "ssh://root@127.0.0.1:"+port+"/x.sock")
	if !errors.Is(err, sshhost.ErrChangedHost) || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("Check: %v, want ErrChangedHost saying revoked", err)
	}
}

func TestCheckNotSSH(t *testing.T) {
	for _, uri := range []string{"unix:///run/podman/podman.sock", "tcp://127.0.0.1:1", ""} {
		if err := sshhost.Check(context.Background(), uri); err != nil {
			t.Errorf("Check(%q): %v, want nil", uri, err)
		}
	}
}

func TestCheckNoAnswer(t *testing.T) {
	home(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	err = sshhost.Check(context.Background(), "ssh://root@"+addr+"/x.sock")
	if !errors.Is(err, sshhost.ErrNoCheck) {
		t.Fatalf("Check: %v, want ErrNoCheck", err)
	}
}

// A check that ctx's deadline cuts short says so, whichever of the
// connection's deadline and ctx's timer comes first.
func TestCheckDeadline(t *testing.T) {
	home(t, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accepts, never speaks
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err := sshhost.Check(ctx, "ssh://root@"+ln.Addr().String()+"/x.sock")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, sshhost.ErrNoCheck) {
			t.Fatalf("Check: %v, want ErrNoCheck and context.DeadlineExceeded", err)
		}
	}
}
