// Package sshhost checks the host key of an ssh:// Podman service
// against the user's known_hosts before anything connects to it.
//
// Podman's ssh client (go.podman.io/common/pkg/ssh, used by the bindings
// and by `podman --url ssh://...`) refuses a host whose key changed, but
// trusts a host it has never seen: it appends the key it was offered to
// $HOME/.ssh/known_hosts and goes on. podvm does not trust on first use,
// so it calls [Check] first: a key exchange with the host that ends as
// soon as the host's key is verified, with no authentication. It never
// writes known_hosts.
package sshhost

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"time"

	"github.com/kevinburke/ssh_config"
	"github.com/skeema/knownhosts"
	"golang.org/x/crypto/ssh"
	xknownhosts "golang.org/x/crypto/ssh/knownhosts"
)

// The errors [Check] returns match one of these, with errors.Is.
var (
	// ErrUnknownHost: the host is not in known_hosts (or there is no
	// known_hosts file).
	ErrUnknownHost = errors.New("ssh host key is not in known_hosts")
	// ErrChangedHost: known_hosts holds other keys for the host than the
	// one it offered, or has revoked that key.
	ErrChangedHost = errors.New("ssh host key does not match known_hosts")
	// ErrNoCheck: the host key could not be checked: no answer, no key
	// exchange, a known_hosts that cannot be read, a malformed URI.
	ErrNoCheck = errors.New("ssh host key could not be checked")
)

// DefaultTimeout bounds a [Check] whose context has no deadline.
const DefaultTimeout = 30 * time.Second

// errVerified ends the key exchange once the host key is verified.
var errVerified = errors.New("host key verified")

// Check is [CheckFile] with $HOME/.ssh/known_hosts (from the password
// database when HOME is unset): the file a podman command run with this
// process's environment reads.
func Check(ctx context.Context, uri string) error { return CheckFile(ctx, uri, "") }

// CheckFile verifies the host key of the service at uri against the
// known_hosts file knownHosts ("": as [Check]) when uri is an ssh://
// URI, and returns nil at once for any other. It resolves the host and
// port as Podman does (the URI, then ~/.ssh/config's Hostname and Port
// for the URI's host, then port 22) and offers the host only the key
// types knownHosts holds for it, as Podman does, so that a host known by
// one key type is not taken for changed when it would rather show
// another.
//
// A host not in knownHosts (or with no such file) is [ErrUnknownHost],
// with the fingerprint it showed and how to add it once checked; a host
// whose key does not match is [ErrChangedHost]. Both are refusals:
// nothing must connect then. Anything else that keeps the key from being
// checked is [ErrNoCheck], wrapping ctx's error when ctx ended first
// (not when [DefaultTimeout] did).
// Without a deadline on ctx, [DefaultTimeout] applies. The errors name the host, not the URI: the caller does.
func CheckFile(ctx context.Context, uri, knownHosts string) error {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "ssh" {
		return nil // not ssh://: nothing to check (the caller reports a bad URI)
	}
	addr, err := address(u)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNoCheck, err)
	}
	file := knownHosts
	if file == "" {
		if file, err = knownHostsFile(); err != nil {
			return fmt.Errorf("%w: %v", ErrNoCheck, err)
		}
	}
	var db *knownhosts.HostKeyDB
	switch _, err := os.Stat(file); {
	case errors.Is(err, os.ErrNotExist):
		// Every host is unknown: the exchange still runs, for the
		// fingerprint the error shows.
	case err != nil:
		return fmt.Errorf("%w: %v", ErrNoCheck, err)
	default:
		if db, err = knownhosts.NewDB(file); err != nil {
			return fmt.Errorf("%w: %v", ErrNoCheck, err)
		}
	}

	parent := ctx
	// ended is parent's error once it has ended, or at its deadline (a
	// read cut by the connection's deadline may come before ctx's timer).
	ended := func() error {
		if err := parent.Err(); err != nil {
			return err
		}
		if dl, ok := parent.Deadline(); ok && !time.Now().Before(dl) {
			return context.DeadlineExceeded
		}
		return nil
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if cerr := ended(); cerr != nil {
			return fmt.Errorf("%w: no answer from %s: %w", ErrNoCheck, addr, cerr)
		}
		return fmt.Errorf("%w: %v", ErrNoCheck, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()

	var verdict error // set by the callback: nil only when verified
	var seen ssh.PublicKey
	cfg := &ssh.ClientConfig{
		User: cmp.Or(u.User.Username(), "podvm"),
		HostKeyCallback: func(host string, remote net.Addr, key ssh.PublicKey) error {
			seen = key
			if db == nil {
				verdict = &xknownhosts.KeyError{}
			} else {
				verdict = db.HostKeyCallback()(host, remote, key)
			}
			if verdict == nil {
				return errVerified
			}
			return verdict
		},
	}
	if db != nil {
		cfg.HostKeyAlgorithms = db.HostKeyAlgorithms(addr)
	}
	c, _, _, err := ssh.NewClientConn(conn, addr, cfg)
	if err == nil { // cannot happen: the callback never lets it through
		c.Close()
		return nil
	}
	switch {
	case seen == nil:
		if cerr := ended(); cerr != nil {
			return fmt.Errorf("%w: no key exchange with %s: %w", ErrNoCheck, addr, cerr)
		}
		return fmt.Errorf("%w: no key exchange with %s: %v", ErrNoCheck, addr, err)
	case verdict == nil:
		return nil
	}
	host := knownhosts.Normalize(addr)
	fp := ssh.FingerprintSHA256(seen)
	var ke *xknownhosts.KeyError
	var re *xknownhosts.RevokedError
	switch {
	case errors.As(verdict, &ke) && len(ke.Want) == 0:
		where := file
		if db == nil {
			where += " (no such file)"
		}
		return fmt.Errorf("%w: host %s is not in %s, and podvm does not trust a host on first use; "+
			"it offered the %s key %s: once you have checked that this is the host's key, add it with: %s >> %s",
			ErrUnknownHost, host, where, seen.Type(), fp, keyscan(addr), file)
	case errors.As(verdict, &ke):
		w := ke.Want[0]
		return fmt.Errorf("%w: host %s offered the %s key %s, which does not match %s:%d (%s %s): connection refused; "+
			"if the host's key was changed on purpose, remove the old entry (ssh-keygen -R '%s') and add the new one once checked (%s >> %s)",
			ErrChangedHost, host, seen.Type(), fp, w.Filename, w.Line, w.Key.Type(), ssh.FingerprintSHA256(w.Key),
			host, keyscan(addr), file)
	case errors.As(verdict, &re):
		return fmt.Errorf("%w: host %s offered the %s key %s, revoked at %s:%d: connection refused",
			ErrChangedHost, host, seen.Type(), fp, re.Revoked.Filename, re.Revoked.Line)
	}
	return fmt.Errorf("%w: %v", ErrNoCheck, verdict)
}

// address is the host:port Podman dials for u: the URI's host, unless
// ~/.ssh/config names another Hostname for it, and the URI's port, else
// ~/.ssh/config's, else 22 (podman/pkg/bindings/connection.go, sshClient).
func address(u *url.URL) (string, error) {
	alias := u.Hostname()
	if alias == "" {
		return "", errors.New("no host in the URI")
	}
	// Settings of our own: the bindings write IgnoreErrors into
	// ssh_config.DefaultUserSettings, so reading it would race with them.
	cfg := &ssh_config.UserSettings{IgnoreErrors: true}
	host := alias
	if h := cfg.Get(alias, "Hostname"); h != "" {
		host = h
	}
	port := u.Port()
	if p := cfg.Get(alias, "Port"); port == "" && p != "" && p != ssh_config.Default("Port") {
		port = p
	}
	if port == "" {
		port = "22"
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return "", fmt.Errorf("port %q", port)
	}
	return net.JoinHostPort(host, port), nil
}

// knownHostsFile is the file Podman reads: $HOME/.ssh/known_hosts, or
// under the user's home directory from the password database when HOME
// is unset (go.podman.io/storage/pkg/unshare.HomeDir).
func knownHostsFile() (string, error) {
	home, err := os.UserHomeDir()
	if err != nil {
		u, uerr := user.Current()
		if uerr != nil || u.HomeDir == "" {
			return "", fmt.Errorf("no home directory for known_hosts: %v", err)
		}
		home = u.HomeDir
	}
	return filepath.Join(home, ".ssh", "known_hosts"), nil
}

// keyscan is the command that prints addr's keys in known_hosts form.
func keyscan(addr string) string {
	host, port, _ := net.SplitHostPort(addr)
	if port == "22" {
		return "ssh-keyscan " + host
	}
	return "ssh-keyscan -p " + port + " " + host
}
