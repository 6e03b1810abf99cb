// Package libpod is podvm's client of the Podman REST API (the libpod
// endpoints), and the only podvm package that imports Podman's modules.
//
// It takes from github.com/containers/podman/v5/pkg/bindings the
// connection alone (bindings.NewConnection for unix://, tcp:// and ssh://
// URIs and its version check, Connection.DoRequest, Connection.GetDialer)
// and sends small typed requests of its own: importing the bindings'
// containers or specgen packages would drag ~760 packages and cgo
// (gpgme, btrfs) into every program that imports podvm. Moving to a newer
// Podman module changes this package only.
//
// Every failed request returns an [*Error]: the service's status and
// message, or, with Status 0, the transport error of a service that could
// not be reached or dropped the connection.
package libpod

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"time"

	"github.com/containers/podman/v5/pkg/bindings"
	"github.com/containers/podman/v5/version"
	"go.podman.io/storage/pkg/unshare"

	"github.com/podvm/podvm/internal/sshhost"
)

// Client talks to one Podman service. It is safe for concurrent use:
// requests share the connection's transport, and each exec stream dials a
// connection of its own.
type Client struct {
	conn    *bindings.Connection
	uri     string
	version Version
	// apiPath is the versioned prefix of every endpoint, as DoRequest
	// builds it: "/v5.8.3/libpod".
	apiPath string
}

// Version is a Podman service's version, read from the Libpod-API-Version
// header of its /_ping answer.
type Version struct{ Major, Minor, Patch int }

// String returns "major.minor.patch".
func (v Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// AtLeast reports whether v is major.minor or later.
func (v Version) AtLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

// Connect connects to the service at uri (unix:///path, tcp://host:port,
// ssh://user@host[:port]/path), pings it and reads its version. An
// unreachable service, or one too old for the bindings (before 4.0), is
// an [*Error] with Status 0 and Op "connect".
//
// An ssh:// service's host key is checked first ([sshhost.CheckFile],
// on the known_hosts the bindings read: under the HOME this process had
// when Podman's code first asked, go.podman.io/storage/pkg/unshare.HomeDir,
// which keeps it): the bindings would add a host missing from known_hosts
// to it and go on, so an unknown or changed key is refused here, an
// [*Error] whose Err matches [sshhost.ErrUnknownHost] or
// [sshhost.ErrChangedHost], before any connection is made.
func Connect(ctx context.Context, uri string) (*Client, error) {
	if uri == "" {
		// bindings would fall back to CONTAINER_HOST: podvm never guesses.
		return nil, &Error{Op: "connect", Err: fmt.Errorf("empty service URI")}
	}
	if err := sshhost.CheckFile(ctx, uri, knownHosts()); err != nil {
		return nil, &Error{Op: "connect " + uri, Err: err}
	}
	bctx, err := newConnection(ctx, uri)
	if err != nil {
		return nil, &Error{Op: "connect " + uri, Err: err}
	}
	conn, err := bindings.GetClient(bctx)
	if err != nil {
		return nil, &Error{Op: "connect " + uri, Err: err}
	}
	if t, ok := conn.Client.Transport.(*http.Transport); ok {
		// The bindings' transport keeps idle connections, and two
		// goroutines for each, forever; ours lets them go when unused.
		// The Client is not shared yet, so swapping it is safe.
		idle := t.Clone()
		idle.IdleConnTimeout = idleTimeout
		t.CloseIdleConnections()
		conn.Client.Transport = idle
	}
	sv := bindings.ServiceVersion(bctx)
	return newClient(conn, uri, Version{int(sv.Major), int(sv.Minor), int(sv.Patch)}), nil
}

// sshConnect serializes the bindings' ssh:// connections: each writes
// ssh_config.DefaultUserSettings.IgnoreErrors and reads that global
// (pkg/bindings/connection.go, sshClient), a data race when two connect
// at once.
var sshConnect sync.Mutex

// newConnection is bindings.NewConnection, one ssh:// connection at a
// time.
func newConnection(ctx context.Context, uri string) (context.Context, error) {
	if u, err := url.Parse(uri); err == nil && u.Scheme == "ssh" {
		sshConnect.Lock()
		defer sshConnect.Unlock()
	}
	return bindings.NewConnection(ctx, uri)
}

// knownHosts is the known_hosts file the bindings' ssh client reads
// (go.podman.io/common/pkg/ssh, ValidateAndConfigure), or "" when it has
// no home directory.
func knownHosts() string {
	home, err := unshare.HomeDir()
	if err != nil || home == "" {
		return ""
	}
	return filepath.Join(home, ".ssh", "known_hosts")
}

// idleTimeout is how long an unused connection to the service is kept.
const idleTimeout = 30 * time.Second

// CloseIdleConnections closes the connections to the service that no
// request is using, and their goroutines end. The Client stays usable: a
// later request dials again. Call it when done with the Client. Over
// ssh:// the SSH connection the bindings dialed stays open: they offer no
// way to close it.
func (c *Client) CloseIdleConnections() { c.conn.Client.CloseIdleConnections() }

func newClient(conn *bindings.Connection, uri string, v Version) *Client {
	// The same API version DoRequest puts in its paths.
	cur := version.APIVersion[version.Libpod][version.CurrentAPI]
	return &Client{
		conn:    conn,
		uri:     uri,
		version: v,
		apiPath: fmt.Sprintf("/v%d.%d.%d/libpod", cur.Major, cur.Minor, cur.Patch),
	}
}

// URI is the service's URI as given to [Connect].
func (c *Client) URI() string { return c.uri }

// Version is the service's version, read when it connected.
func (c *Client) Version() Version { return c.version }

// CanRemoveExec reports whether the service has the exec remove endpoint
// (POST /exec/{id}/remove, Podman 4.8 and later), which kills a running
// exec session when forced. This is the one place where podvm's behaviour
// depends on the service's version.
func (c *Client) CanRemoveExec() bool { return c.version.AtLeast(4, 8) }

// request is one call to the service.
type request struct {
	op     string // names the call in errors: "container create"
	method string
	path   string // endpoint with %s verbs for args, after the API prefix
	args   []string
	query  url.Values
	body   io.Reader
	header http.Header
}

// do sends r with Connection.DoRequest. A status of 300 or more is decoded
// into an [*Error] by [responseError]; the caller closes the body of a
// successful response.
func (c *Client) do(ctx context.Context, r request) (*http.Response, error) {
	body := r.body
	if _, small := body.(*bytes.Reader); body != nil && !small {
		// DoRequest retries a failed Do with the same request: a stream
		// already partly sent must fail the retry, not send its rest.
		body = &onceBody{r: body}
	}
	resp, err := c.conn.DoRequest(ctx, body, r.method, r.path, r.query, r.header, r.args...)
	if err != nil {
		if resp != nil && resp.Response != nil {
			resp.Body.Close()
		}
		return nil, &Error{Op: r.op, Err: err}
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, responseError(r.op, resp.Response)
	}
	return resp.Response, nil
}

// call sends r and discards the body of the answer.
func (c *Client) call(ctx context.Context, r request) error {
	resp, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	return drain(r.op, resp)
}

// drain reads and closes a response body; an error reading it is a
// connection dropped mid-answer.
func drain(op string, resp *http.Response) error {
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return &Error{Op: op, Err: err}
	}
	return nil
}

// endpointURL is the absolute URL of an endpoint, built as DoRequest
// builds it, for the requests that bypass it (the hijacked exec start).
func (c *Client) endpointURL(path string) string {
	base := "http://d"
	if c.conn.URI.Scheme == "tcp" {
		base = "http://" + c.conn.URI.Host + c.conn.URI.Path
	}
	return base + c.apiPath + path
}

// onceBody is a request body that can be sent once: after the transport
// closed it, reading fails, so a retried request fails instead of sending
// what is left of the stream.
type onceBody struct {
	mu     sync.Mutex
	r      io.Reader
	closed bool
}

func (b *onceBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return 0, fmt.Errorf("libpod: request body already sent once; not retried")
	}
	return b.r.Read(p)
}

func (b *onceBody) Close() error {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	return nil
}
