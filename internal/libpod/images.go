package libpod

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
)

// ImagePull pulls image ref from its registry, even when the service has
// it. The service reports a failed pull inside its 200 answer, as a
// stream of JSON messages: an [*Error] with Status 200 carries it.
func (c *Client) ImagePull(ctx context.Context, ref string) error {
	const op = "image pull"
	q := url.Values{"reference": {ref}, "policy": {"always"}, "quiet": {"true"}}
	resp, err := c.do(ctx, request{op: op, method: http.MethodPost, path: "/images/pull", query: q})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	pulled := false
	for {
		var msg struct {
			Error string `json:"error"`
			ID    string `json:"id"`
		}
		switch err := dec.Decode(&msg); {
		case err == io.EOF && pulled:
			return nil
		case err == io.EOF:
			return &Error{Op: op, Err: io.ErrUnexpectedEOF}
		case err != nil:
			var syntax *json.SyntaxError
			if errors.As(err, &syntax) {
				return &Error{Op: op, Status: resp.StatusCode, Message: "unexpected answer: " + err.Error()}
			}
			return &Error{Op: op, Err: err}
		case msg.Error != "":
			return &Error{Op: op, Status: resp.StatusCode, Message: msg.Error}
		case msg.ID != "":
			pulled = true
		}
	}
}

// ImageLoad loads the images of an image archive (docker-archive or
// oci-archive, as `podman save` writes them), streamed from r, and
// returns their names.
func (c *Client) ImageLoad(ctx context.Context, r io.Reader) ([]string, error) {
	const op = "image load"
	resp, err := c.do(ctx, request{op: op, method: http.MethodPost, path: "/images/load", body: r,
		header: http.Header{"Content-Type": {"application/x-tar"}}})
	if err != nil {
		return nil, err
	}
	var out struct{ Names []string }
	err = decode(op, resp, &out)
	return out.Names, err
}

// ImageInfo is what podvm reads of an image's inspect.
type ImageInfo struct {
	Architecture string // a GOARCH
}

// ImageInspect returns what the service knows of image ref.
func (c *Client) ImageInspect(ctx context.Context, ref string) (ImageInfo, error) {
	var out ImageInfo
	err := c.getJSON(ctx, "image inspect", "/images/%s/json", ref, &out)
	return out, err
}
