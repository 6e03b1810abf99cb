package libpod

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"

	"github.com/podvm/podvm/internal/driver"
)

// Commit makes an image of container's filesystem (its writable layer on
// top of its image), named repo:tag, with the Dockerfile instructions
// changes applied to its config ("LABEL key=value"), without pausing the
// container, and returns the image's ID. The service splits each change
// at commas (Podman 4 and 5): a change must hold none.
func (c *Client) Commit(ctx context.Context, container, repo, tag string, changes []string) (string, error) {
	const op = "commit"
	q := url.Values{"container": {container}, "repo": {repo}, "pause": {"false"}, "format": {"oci"}}
	if tag != "" {
		q.Set("tag", tag)
	}
	for _, ch := range changes {
		q.Add("changes", ch)
	}
	resp, err := c.do(ctx, request{op: op, method: http.MethodPost, path: "/commit", query: q})
	if err != nil {
		return "", err
	}
	var out struct {
		ID string `json:"Id"`
	}
	if err := decode(op, resp, &out); err != nil {
		return "", err
	}
	return out.ID, nil
}

// ImageList returns the images that carry all the labels ("key=value").
func (c *Client) ImageList(ctx context.Context, labels ...string) ([]driver.Image, error) {
	const op = "image list"
	filters, _ := json.Marshal(map[string][]string{"label": labels})
	resp, err := c.do(ctx, request{op: op, method: http.MethodGet, path: "/images/json", query: url.Values{"filters": {string(filters)}}})
	if err != nil {
		return nil, err
	}
	var list []ListedImage
	if err := decode(op, resp, &list); err != nil {
		return nil, err
	}
	return Images(list), nil
}

// ListedImage is an image as the service's list and `podman images
// --format json` spell it.
type ListedImage struct {
	ID      string            `json:"Id"`
	Names   []string          `json:"Names"`
	Labels  map[string]string `json:"Labels"`
	Created int64             `json:"Created"` // Unix seconds
	History []string          `json:"History"` // its NamesHistory
}

// Images converts listed images.
func Images(list []ListedImage) []driver.Image {
	out := make([]driver.Image, 0, len(list))
	for _, l := range list {
		out = append(out, driver.Image{ID: l.ID, Names: l.Names, History: l.History, Labels: l.Labels, Created: time.Unix(l.Created, 0)})
	}
	return out
}

// InspectedImage is an image as the service's inspect and `podman image
// inspect` spell it.
type InspectedImage struct {
	ID           string            `json:"Id"`
	RepoTags     []string          `json:"RepoTags"`
	NamesHistory []string          `json:"NamesHistory"`
	Labels       map[string]string `json:"Labels"`
	Created      time.Time         `json:"Created"`
}

// Image converts an inspected image.
func (i InspectedImage) Image() driver.Image {
	return driver.Image{ID: i.ID, Names: i.RepoTags, History: i.NamesHistory, Labels: i.Labels, Created: i.Created}
}

// ImageDetails returns the ID, names, labels and creation time of image
// ref.
func (c *Client) ImageDetails(ctx context.Context, ref string) (driver.Image, error) {
	var out InspectedImage
	if err := c.getJSON(ctx, "image inspect", "/images/%s/json", ref, &out); err != nil {
		return driver.Image{}, err
	}
	return out.Image(), nil
}

// ImageRemove removes image ref without force: a name of an image that
// has others is untagged, and an image that a container uses is
// refused (409, "image is in use by a container").
func (c *Client) ImageRemove(ctx context.Context, ref string) error {
	return c.call(ctx, request{op: "image remove", method: http.MethodDelete, path: "/images/%s", args: []string{ref}})
}
