package libpod

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
)

// Spec is the body of POST /containers/create: the fields of Podman's
// SpecGenerator that podvm sets, under their JSON names, which Podman 4
// and 5 share.
type Spec struct {
	Name       string            `json:"name,omitempty"`
	Image      string            `json:"image"`
	Labels     map[string]string `json:"labels,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Command    []string          `json:"command,omitempty"`
	// Init runs Podman's init (catatonit, at /run/podman-init) as PID 1.
	Init    bool              `json:"init,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	WorkDir string            `json:"work_dir,omitempty"`
	User    string            `json:"user,omitempty"`
	// HTTPProxy false keeps the service's proxy variables out.
	HTTPProxy *bool     `json:"httpproxy,omitempty"`
	NetNS     Namespace `json:"netns"`
	// Networks are the named networks joined in bridge mode.
	Networks        map[string]struct{} `json:"Networks,omitempty"`
	NoNewPrivileges bool                `json:"no_new_privileges,omitempty"`
	CapDrop         []string            `json:"cap_drop,omitempty"`
	CapAdd          []string            `json:"cap_add,omitempty"`
	// ReadOnlyFilesystem mounts the image read-only. Podman 4.3 ignores
	// the spec's read_write_tmpfs: writable directories are Mounts.
	ReadOnlyFilesystem bool       `json:"read_only_filesystem,omitempty"`
	Mounts             []Mount    `json:"mounts,omitempty"`
	ResourceLimits     *Resources `json:"resource_limits,omitempty"`
	// Stdin keeps the container's stdin open, for an attached client.
	Stdin bool `json:"stdin,omitempty"`
	// LogConfiguration chooses the log driver ("none": stdio is not
	// logged).
	LogConfiguration *LogConfig `json:"log_configuration,omitempty"`
}

// LogConfig is a container's logging.
type LogConfig struct {
	Driver string `json:"driver,omitempty"`
}

// Namespace is a namespace mode ("none", "bridge", "host", "container")
// with its value (the container, for "container").
type Namespace struct {
	Mode  string `json:"nsmode,omitempty"`
	Value string `json:"value,omitempty"`
}

// Mount is an OCI mount: a bind mount has Type "bind" and Options such as
// "ro" or "rw".
type Mount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type,omitempty"`
	Source      string   `json:"source,omitempty"`
	Options     []string `json:"options,omitempty"`
}

// Resources are the OCI resource limits podvm sets; nil means no limit.
type Resources struct {
	Memory *MemoryLimits `json:"memory,omitempty"`
	CPU    *CPULimits    `json:"cpu,omitempty"`
	Pids   *PidsLimits   `json:"pids,omitempty"`
}

// MemoryLimits are in bytes; Swap is memory plus swap.
type MemoryLimits struct {
	Limit int64 `json:"limit,omitempty"`
	Swap  int64 `json:"swap,omitempty"`
}

// CPULimits allow Quota microseconds of CPU time per Period.
type CPULimits struct {
	Quota  int64  `json:"quota,omitempty"`
	Period uint64 `json:"period,omitempty"`
}

// PidsLimits bound the number of processes; -1: no limit.
type PidsLimits struct {
	Limit int64 `json:"limit"`
}

// ContainerCreate creates a container and returns its ID.
func (c *Client) ContainerCreate(ctx context.Context, spec *Spec) (string, error) {
	var out struct {
		ID string `json:"Id"`
	}
	err := c.postJSON(ctx, "container create", "/containers/create", "", spec, &out)
	return out.ID, err
}

// ContainerStart starts container id; starting a running one succeeds.
func (c *Client) ContainerStart(ctx context.Context, id string) error {
	return c.call(ctx, request{op: "container start", method: http.MethodPost, path: "/containers/%s/start", args: []string{id}})
}

// ContainerCheckpoint checkpoints running container id in place with
// CRIU, its established TCP connections and file locks with it, and
// stops it: a suspension that ContainerRestore ends.
func (c *Client) ContainerCheckpoint(ctx context.Context, id string) error {
	q := url.Values{"tcpEstablished": {"true"}, "fileLocks": {"true"}}
	return c.call(ctx, request{op: "container checkpoint", method: http.MethodPost, path: "/containers/%s/checkpoint", args: []string{id}, query: q})
}

// ContainerRestore restores container id, checkpointed in place by
// ContainerCheckpoint, and starts it.
func (c *Client) ContainerRestore(ctx context.Context, id string) error {
	q := url.Values{"tcpEstablished": {"true"}, "fileLocks": {"true"}}
	return c.call(ctx, request{op: "container restore", method: http.MethodPost, path: "/containers/%s/restore", args: []string{id}, query: q})
}

// ContainerExport checkpoints running container id with CRIU, its
// established TCP connections and file locks with it, and copies the
// archive the service exports to w; the container is left running when
// leaveRunning, else stopped by the dump. The archive is an
// uncompressed tar (Podman's API does not compress it), sent as
// "application/octet" once the whole dump is done. A failed dump is the
// usual error answer, nothing written to w. An answer cut short (its
// chunked body ends before its last chunk) is an [*Error] with Status 0;
// an error writing to w is returned as it is.
func (c *Client) ContainerExport(ctx context.Context, id string, leaveRunning bool, w io.Writer) error {
	const op = "container export"
	q := url.Values{"export": {"true"}, "leaveRunning": {strconv.FormatBool(leaveRunning)}, "tcpEstablished": {"true"}, "fileLocks": {"true"}}
	resp, err := c.do(ctx, request{op: op, method: http.MethodPost, path: "/containers/%s/checkpoint", args: []string{id}, query: q})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	// streamBody makes a read error an *Error; w's own errors stay as
	// they are.
	_, err = io.Copy(w, &streamBody{op: op, rc: resp.Body})
	return err
}

// ContainerImport makes a container from a checkpoint archive that
// ContainerExport wrote, streamed from r (it is sent once, never again on
// a retry), and restores it with its established TCP connections and
// file locks, without the static IP and MAC address of the container
// checkpointed: its ID, name and labels are those of the archive's
// config.dump. It returns the new container's ID, read from the
// service's report ({"Id": ...}).
func (c *Client) ContainerImport(ctx context.Context, r io.Reader) (string, error) {
	const op = "container import"
	if r == nil {
		r = http.NoBody
	}
	q := url.Values{"import": {"true"}, "tcpEstablished": {"true"}, "fileLocks": {"true"},
		"ignoreStaticIP": {"true"}, "ignoreStaticMAC": {"true"}}
	// The name in the path is ignored with import=true: the bindings
	// send "import" too. The body is hidden behind an interface of its
	// own so that do sends it once even when it is a *bytes.Reader: a
	// retry after a restore whose answer was lost would restore it again.
	resp, err := c.do(ctx, request{op: op, method: http.MethodPost, path: "/containers/%s/restore", args: []string{"import"}, query: q,
		body: struct{ io.Reader }{r}, header: http.Header{"Content-Type": {"application/x-tar"}}})
	if err != nil {
		return "", err
	}
	var out struct {
		ID string `json:"Id"`
	}
	if err := decode(op, resp, &out); err != nil {
		return "", err
	}
	if out.ID == "" {
		return "", &Error{Op: op, Status: resp.StatusCode, Message: "the restore report names no container"}
	}
	return out.ID, nil
}

// ContainerRemove removes container id with force and no stop timeout:
// whatever runs in it is killed at once.
func (c *Client) ContainerRemove(ctx context.Context, id string) error {
	q := url.Values{"force": {"true"}, "timeout": {"0"}}
	return c.call(ctx, request{op: "container remove", method: http.MethodDelete, path: "/containers/%s", args: []string{id}, query: q})
}

// Listed is a container as ContainerList finds it.
type Listed struct {
	ID     string            `json:"Id"`
	Labels map[string]string `json:"Labels"`
	State  string            `json:"State"` // "running", "exited", ...
}

// ContainerList returns every container, running or not, that carries
// all the labels ("key=value").
func (c *Client) ContainerList(ctx context.Context, labels ...string) ([]Listed, error) {
	filters, _ := json.Marshal(map[string][]string{"label": labels})
	q := url.Values{"all": {"true"}, "filters": {string(filters)}}
	resp, err := c.do(ctx, request{op: "container list", method: http.MethodGet, path: "/containers/json", query: q})
	if err != nil {
		return nil, err
	}
	var list []Listed
	if err := decode("container list", resp, &list); err != nil {
		return nil, err
	}
	return list, nil
}

// ContainerInfo is what podvm reads of a container's inspect.
type ContainerInfo struct {
	ID   string `json:"Id"`
	Name string `json:"Name"`
	// EffectiveCaps are the capabilities of the container's processes.
	EffectiveCaps []string `json:"EffectiveCaps"`
	State         struct {
		Status  string `json:"Status"`
		Running bool   `json:"Running"`
	} `json:"State"`
	Config struct {
		Labels     map[string]string `json:"Labels"`
		Env        []string          `json:"Env"`
		User       string            `json:"User"`
		WorkingDir string            `json:"WorkingDir"`
	} `json:"Config"`
	HostConfig struct {
		NetworkMode    string   `json:"NetworkMode"`
		CapAdd         []string `json:"CapAdd"`
		CapDrop        []string `json:"CapDrop"`
		SecurityOpt    []string `json:"SecurityOpt"`
		ReadonlyRootfs bool     `json:"ReadonlyRootfs"`
		Memory         int64    `json:"Memory"`
		MemorySwap     int64    `json:"MemorySwap"`
		CPUQuota       int64    `json:"CpuQuota"`
		CPUPeriod      uint64   `json:"CpuPeriod"`
		PidsLimit      int64    `json:"PidsLimit"`
	} `json:"HostConfig"`
	Mounts []struct {
		Source      string `json:"Source"`
		Destination string `json:"Destination"`
		RW          bool   `json:"RW"`
	} `json:"Mounts"`
}

// ContainerInspect returns what podvm reads of container id.
func (c *Client) ContainerInspect(ctx context.Context, id string) (*ContainerInfo, error) {
	var info ContainerInfo
	if err := c.getJSON(ctx, "container inspect", "/containers/%s/json", id, &info); err != nil {
		return nil, err
	}
	return &info, nil
}
