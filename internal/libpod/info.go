package libpod

import (
	"context"
	"net/http"
)

// Info is what podvm reads of GET /info: what the service can enforce
// for its containers.
type Info struct {
	Host struct {
		// CgroupVersion is "v1" or "v2".
		CgroupVersion string `json:"cgroupVersion"`
		// CgroupControllers are the controllers the service's
		// containers can use: for rootless Podman, those delegated to
		// the user (none on cgroup v1).
		CgroupControllers []string `json:"cgroupControllers"`
		Security          struct {
			Rootless bool `json:"rootless"`
		} `json:"security"`
	} `json:"host"`
}

// Info returns what the service reports of its host.
func (c *Client) Info(ctx context.Context) (Info, error) {
	const op = "info"
	var out Info
	resp, err := c.do(ctx, request{op: op, method: http.MethodGet, path: "/info"})
	if err != nil {
		return out, err
	}
	err = decode(op, resp, &out)
	return out, err
}
