package libpod

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// ExecConfig is the body of POST /containers/{id}/exec (Docker's
// ExecOptions, the fields podvm uses).
type ExecConfig struct {
	Cmd          []string `json:"Cmd"`
	Env          []string `json:"Env,omitempty"`
	WorkingDir   string   `json:"WorkingDir,omitempty"`
	User         string   `json:"User,omitempty"`
	AttachStdin  bool     `json:"AttachStdin"`
	AttachStdout bool     `json:"AttachStdout"`
	AttachStderr bool     `json:"AttachStderr"`
}

// ExecCreate creates an exec session in container id and returns its ID.
// Nothing runs until [Client.ExecStart].
func (c *Client) ExecCreate(ctx context.Context, id string, cfg ExecConfig) (string, error) {
	var out struct{ ID string }
	err := c.postJSON(ctx, "exec create", "/containers/%s/exec", id, cfg, &out)
	return out.ID, err
}

// ExecState is what an exec session's inspect says of its process.
type ExecState struct {
	// Running is true from the start of the process until its exit has
	// been recorded.
	Running bool `json:"Running"`
	// ExitCode is the process's exit status, once Running is false.
	ExitCode int `json:"ExitCode"`
	// Pid is the process's PID on the host while it runs.
	Pid int `json:"Pid"`
}

// ExecInspect returns the state of exec session id.
func (c *Client) ExecInspect(ctx context.Context, id string) (ExecState, error) {
	var st ExecState
	err := c.getJSON(ctx, "exec inspect", "/exec/%s/json", id, &st)
	return st, err
}

// ExecRemove removes exec session id; with force it kills the session's
// process first. Only services for which [Client.CanRemoveExec] is true
// have the endpoint; older ones answer 404.
func (c *Client) ExecRemove(ctx context.Context, id string, force bool) error {
	body, _ := json.Marshal(struct {
		Force bool `json:"Force"`
	}{force})
	return c.call(ctx, request{op: "exec remove", method: http.MethodPost, path: "/exec/%s/remove", args: []string{id},
		body: bytes.NewReader(body), header: jsonHeader()})
}

// ExecStream is the connection of a started exec session: reading it
// yields the multiplexed output (see [Demux]), writing it feeds the
// process's stdin. It is a connection of its own, never shared.
type ExecStream struct {
	conn net.Conn
	r    *bufio.Reader // what the response parser read ahead, then conn
	once sync.Once
}

// Read reads the multiplexed output.
func (s *ExecStream) Read(p []byte) (int, error) { return s.r.Read(p) }

// Write writes to the process's stdin.
func (s *ExecStream) Write(p []byte) (int, error) { return s.conn.Write(p) }

// CloseWrite half-closes the connection: the process reads the end of its
// stdin while its output still arrives. When the connection cannot be
// half-closed (an ssh channel that lacks it), it returns an error and
// stdin stays open until Close.
func (s *ExecStream) CloseWrite() error {
	if cw, ok := s.conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return fmt.Errorf("libpod: exec stream: %T cannot be half-closed", s.conn)
}

// Close closes the connection; a Read in progress returns. It is safe to
// call more than once and concurrently with Read.
func (s *ExecStream) Close() error {
	var err error
	s.once.Do(func() { err = s.conn.Close() })
	return err
}

// ExecStart starts exec session id attached, on a connection dialed for
// it alone (Connection.GetDialer): the bindings' own ExecStartAndAttach
// swaps the shared client's transport, which races when execs run
// concurrently. ctx bounds the dial and the handshake only; the stream
// lives until Close. A service that refuses to start the session (an
// unknown user, a stopped container) answers an [*Error].
func (c *Client) ExecStart(ctx context.Context, id string) (*ExecStream, error) {
	return c.upgrade(ctx, "exec start", "/exec/"+url.PathEscape(id)+"/start", []byte(`{"Detach":false,"Tty":false}`))
}

// ContainerAttach attaches to the stdin, stdout and stderr of container
// id, on a connection dialed for it alone, as [Client.ExecStart] does:
// reading the stream yields the multiplexed output, writing it feeds the
// container's stdin. Attached before the container starts, it loses
// nothing the container writes. Detach keys are off: every byte passes.
func (c *Client) ContainerAttach(ctx context.Context, id string) (*ExecStream, error) {
	q := url.Values{"stdin": {"true"}, "stdout": {"true"}, "stderr": {"true"}, "stream": {"true"}, "detachKeys": {""}}
	return c.upgrade(ctx, "container attach", "/containers/"+url.PathEscape(id)+"/attach?"+q.Encode(), nil)
}

// upgrade POSTs body to path (with its query) on a connection of its own
// and returns the raw stream that follows the service's upgrade. ctx
// bounds the dial and the handshake only; the stream lives until Close.
func (c *Client) upgrade(ctx context.Context, op, path string, body []byte) (*ExecStream, error) {
	conn, err := c.conn.GetDialer(ctx)
	if err != nil {
		return nil, &Error{Op: op, Err: err}
	}
	// The handshake ends early when ctx does.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	s, err := c.handshake(ctx, conn, op, path, body)
	if stop() && err == nil {
		return s, nil
	}
	conn.Close()
	if ctx.Err() != nil {
		err = &Error{Op: op, Err: ctx.Err()}
	}
	return nil, err
}

func (c *Client) handshake(ctx context.Context, conn net.Conn, op, path string, body []byte) (*ExecStream, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpointURL(path), bytes.NewReader(body))
	if err != nil {
		return nil, &Error{Op: op, Err: err}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "tcp")
	if err := req.Write(conn); err != nil {
		return nil, &Error{Op: op, Err: err}
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, &Error{Op: op, Err: err}
	}
	switch resp.StatusCode {
	case http.StatusSwitchingProtocols, http.StatusOK:
		// 101 after an upgrade; 200 from a service that hijacks without
		// one. Either way the raw stream follows the headers.
		return &ExecStream{conn: conn, r: br}, nil
	}
	defer resp.Body.Close()
	return nil, responseError(op, resp)
}

// getJSON GETs an endpoint and decodes its JSON answer into out.
//
// A GET answered with a panic the service recovered (500 "runtime
// error: ..." from Go) is asked again, twice at most: Podman 4.3's image
// inspect dereferences nil now and then while images change beside it,
// and the next ask answers. Only reads are asked again.
func (c *Client) getJSON(ctx context.Context, op, path, arg string, out any) error {
	for attempt := 1; ; attempt++ {
		resp, err := c.do(ctx, request{op: op, method: http.MethodGet, path: path, args: []string{arg}})
		if err == nil {
			err = decode(op, resp, out)
		}
		if attempt == 3 || !panicked(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// panicked reports an answer of the service's handler that panicked.
func panicked(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusInternalServerError && strings.Contains(e.Message, "runtime error: ")
}

// postJSON POSTs in as JSON and decodes the JSON answer into out.
func (c *Client) postJSON(ctx context.Context, op, path, arg string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return &Error{Op: op, Err: err}
	}
	r := request{op: op, method: http.MethodPost, path: path, body: bytes.NewReader(body), header: jsonHeader()}
	if arg != "" {
		r.args = []string{arg}
	}
	resp, err := c.do(ctx, r)
	if err != nil {
		return err
	}
	return decode(op, resp, out)
}

// decode decodes a JSON answer into out and closes it. An answer cut
// short is a dropped connection (Status 0); one that is not the JSON
// expected keeps its status.
func decode(op string, resp *http.Response, out any) error {
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return &Error{Op: op, Err: err}
	}
	if err := json.Unmarshal(data, out); err != nil {
		return &Error{Op: op, Status: resp.StatusCode, Message: fmt.Sprintf("unexpected answer %.200q: %v", data, err)}
	}
	return nil
}

func jsonHeader() http.Header { return http.Header{"Content-Type": {"application/json"}} }
