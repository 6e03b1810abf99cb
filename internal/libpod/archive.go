package libpod

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
)

// PathStat is what the service says of a path in a container.
type PathStat struct {
	Name       string `json:"name"`
	Size       int64  `json:"size"`
	Mode       uint32 `json:"mode"` // Go's fs.FileMode bits
	IsDir      bool   `json:"isDir"`
	LinkTarget string `json:"linkTarget"`
}

// ArchiveStat stats path in container id (HEAD .../archive). Podman
// reads path as a glob pattern (see internal/podman's paths.go). The
// answer to HEAD has no body: a missing path and a missing container are
// both a 404 with no message.
func (c *Client) ArchiveStat(ctx context.Context, id, path string) (PathStat, error) {
	const op = "archive stat"
	var st PathStat
	resp, err := c.do(ctx, request{op: op, method: http.MethodHead, path: "/containers/%s/archive", args: []string{id},
		query: url.Values{"path": {path}}})
	if err != nil {
		return st, err
	}
	resp.Body.Close()
	// Podman encodes it with the URL alphabet (pkg/copy.EncodeFileInfo),
	// Docker with the standard one: they differ when the JSON holds a
	// byte that encodes to '+' or '/' in one and '-' or '_' in the other.
	header := resp.Header.Get("X-Docker-Container-Path-Stat")
	raw, err := base64.URLEncoding.DecodeString(header)
	if err != nil {
		raw, err = base64.StdEncoding.DecodeString(header)
	}
	if err == nil {
		err = json.Unmarshal(raw, &st)
	}
	if err != nil {
		return st, &Error{Op: op, Status: resp.StatusCode, Message: "unexpected path stat header: " + err.Error()}
	}
	return st, nil
}

// ArchivePut extracts the tar stream r into directory path of container
// id, streaming it: r is read as the request is sent. Podman takes path
// as it is, and creates it when it is missing.
func (c *Client) ArchivePut(ctx context.Context, id, path string, r io.Reader) error {
	return c.call(ctx, request{op: "archive put", method: http.MethodPut, path: "/containers/%s/archive", args: []string{id},
		// Like podman cp: a directory is never replaced by a file.
		query: url.Values{"path": {path}, "noOverwriteDirNonDir": {"true"}}, body: r, header: http.Header{"Content-Type": {"application/x-tar"}}})
}

// ArchiveGet returns path of container id as a tar stream, entries named
// relative to path's parent; Podman reads path as a glob pattern, read as it arrives. The caller closes it; a
// connection dropped mid-stream fails a Read with an [*Error].
func (c *Client) ArchiveGet(ctx context.Context, id, path string) (io.ReadCloser, error) {
	const op = "archive get"
	resp, err := c.do(ctx, request{op: op, method: http.MethodGet, path: "/containers/%s/archive", args: []string{id},
		query: url.Values{"path": {path}}})
	if err != nil {
		return nil, err
	}
	return &streamBody{op: op, rc: resp.Body}, nil
}

// streamBody turns a response body's read errors into [*Error]s.
type streamBody struct {
	op string
	rc io.ReadCloser
}

func (b *streamBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err != nil && err != io.EOF {
		err = &Error{Op: b.op, Err: err}
	}
	return n, err
}

func (b *streamBody) Close() error { return b.rc.Close() }
