package vm

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/podvm/podvm/exec"
)

// cliDriver reaches Podman by running the podman command through an
// [exec.Executor].
type cliDriver struct {
	x      exec.Executor
	podman string   // the binary
	global []string // global flags before the subcommand
}

var _ driver = cliDriver{}

// initEntrypoint makes PID 1 Podman's init (catatonit, with --init) in
// pause mode: it keeps the sandbox alive and reaps orphans, and needs
// nothing from the image, not even /bin/sh.
const initEntrypoint = `["/run/podman-init","-P"]`

// cliError maps a failed podman invocation to an error wrapping the vm
// sentinel its stderr means ([ErrPodman] when none fits) and a
// [*CLIError] carrying it. what names the object of the call; it may be
// empty.
func cliError(op, what string, res *exec.Result) error {
	return classify("podman "+op, what, res.Stderr, &CLIError{Op: op, ExitCode: res.ExitCode, Stderr: res.Stderr})
}

// run runs podman with the global flags and c.Args through the executor,
// and maps a non-zero exit of podman to cliError. When podman cannot be
// started, the error matches [ErrUnavailable]; a Result with TimedOut
// comes back with the executor's error.
func (d cliDriver) run(ctx context.Context, op, what string, c exec.Command) (*exec.Result, error) {
	c.Name = d.podman
	c.Args = append(slices.Clip(d.global), c.Args...)
	if c.MaxOutputBytes == 0 {
		c.MaxOutputBytes = errCapture
	}
	res, err := d.x.Run(ctx, c)
	switch {
	case res == nil && (errors.Is(err, exec.ErrNotFound) || errors.Is(err, exec.ErrPermission)):
		// %v: the sandbox's exec.ErrNotFound must not match.
		return nil, fmt.Errorf("%w: %w: %v", ErrUnavailable, errNotReached, err)
	case err != nil:
		return res, wrap(nil, "podman "+op, what, err)
	case res.ExitCode != 0:
		return res, cliError(op, what, res)
	}
	return res, nil
}

func (d cliDriver) ensureImage(ctx context.Context, cfg Config) (image, error) {
	inspect := exec.Command{Args: []string{"image", "inspect", "--format", "{{.Architecture}}", cfg.Image}}
	read := func(res *exec.Result) image { return image{Arch: strings.TrimSpace(res.Stdout)} }
	if cfg.Pull != PullAlways {
		res, err := d.run(ctx, "image inspect", cfg.Image, inspect)
		switch {
		case err == nil:
			return read(res), nil
		case !errors.Is(err, ErrImageNotFound):
			return image{}, err
		case cfg.Pull == PullNever && cfg.ImageArchive == "":
			return image{}, fmt.Errorf("%w: %s is not present and the pull policy is %q", ErrImageNotFound, cfg.Image, PullNever)
		}
	}
	var err error
	if cfg.ImageArchive != "" {
		if _, serr := os.Stat(cfg.ImageArchive); serr != nil {
			return image{}, fmt.Errorf("%w: image archive: %v", ErrInvalidConfig, serr)
		}
		_, err = d.run(ctx, "load", cfg.ImageArchive, exec.Command{Args: []string{"load", "-q", "-i", cfg.ImageArchive}})
	} else {
		_, err = d.run(ctx, "pull", cfg.Image, exec.Command{Args: []string{"pull", "-q", cfg.Image}})
	}
	if err != nil {
		return image{}, err
	}
	res, err := d.run(ctx, "image inspect", cfg.Image, inspect)
	if err != nil {
		return image{}, err
	}
	return read(res), nil
}

func (d cliDriver) local() (bool, string) {
	host := os.Getenv("CONTAINER_HOST")
	if len(d.global) == 2 { // --url
		host = d.global[1]
	}
	return isLocal(host), d.podman + " " + strings.Join(d.global, " ") + " " + os.Getenv("CONTAINER_HOST")
}

func (d cliDriver) create(ctx context.Context, cfg Config, labels map[string]string, agent *agentMount) (string, error) {
	res, err := d.run(ctx, "run", cfg.Image, exec.Command{Args: runArgs(cfg, labels, agent)})
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(res.Stdout)
	if !isContainerID(id) {
		return "", fmt.Errorf("%w: podman run printed %q, not a container ID", ErrPodman, res.Stdout)
	}
	return id, nil
}

func isContainerID(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// runArgs is the argv of `podman run -d` for cfg or, with the agent as
// PID 1, of `podman create`.
func runArgs(c Config, labels map[string]string, agent *agentMount) []string {
	a := []string{"run", "-d"}
	if agent != nil {
		a = []string{"create", "-i", "--log-driver", "none"}
		if agent.hostDir != "" {
			a = append(a, "-v", agent.hostDir+":"+agentDir+":ro")
		}
	}
	a = append(a, "--pull", string(PullNever)) // ensureImage made it present
	if c.Name != "" {
		a = append(a, "--name", c.Name)
	}
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		a = append(a, "--label", k+"="+labels[k])
	}
	a = append(a,
		"--network", c.Network,
		"--security-opt", "no-new-privileges",
		"--cap-drop", "all",
		"--cap-add", strings.Join(DefaultCapabilities, ","),
		"--pids-limit", strconv.FormatInt(c.Pids, 10),
		// Podman passes the host's proxy variables by default.
		"--http-proxy=false",
	)
	if c.Memory > 0 {
		m := strconv.FormatInt(c.Memory, 10)
		a = append(a, "--memory", m, "--memory-swap", m) // swap included
	}
	if c.CPUs > 0 {
		a = append(a, "--cpus", strconv.FormatFloat(c.CPUs, 'f', -1, 64))
	}
	if c.ReadOnlyRootfs {
		a = append(a, "--read-only", "--read-only-tmpfs")
	}
	for _, m := range c.Mounts {
		spec := m.Source + ":" + m.Target
		if m.ReadOnly {
			spec += ":ro"
		}
		a = append(a, "-v", spec)
	}
	if c.Workdir != "" {
		a = append(a, "--workdir", c.Workdir)
	}
	if c.User != "" {
		a = append(a, "--user", c.User)
	}
	for _, e := range c.Env {
		a = append(a, "--env", e)
	}
	if agent != nil {
		return append(a, "--entrypoint", `["`+agentPath+`"]`, c.Image)
	}
	return append(a, "--init", "--entrypoint", initEntrypoint, c.Image)
}

// exec runs p with `podman exec`, its stdio streamed through the
// executor. podman's exit status is returned as it is: the sandbox tells
// the command's from podman's own failures by content.
func (d cliDriver) exec(ctx context.Context, id string, p process) (int, bool, error) {
	c := exec.Command{
		Name:           d.podman,
		Args:           append(slices.Clip(d.global), execArgs(id, p)...),
		Stdin:          p.Stdin,
		Stdout:         p.Stdout,
		Stderr:         p.Stderr,
		MaxOutputBytes: 1, // the sandbox captures through the writers
	}
	res, err := d.x.Run(ctx, c)
	switch {
	case res == nil && (errors.Is(err, exec.ErrNotFound) || errors.Is(err, exec.ErrPermission)):
		return -1, false, fmt.Errorf("%w: %v", ErrUnavailable, err)
	case res == nil:
		return -1, false, err
	case res.TimedOut:
		return -1, true, err
	}
	// Another error is Stdin's or a writer's, which the sandbox reports.
	return res.ExitCode, true, nil
}

// execArgs is the argv of `podman exec` for p in container id.
func execArgs(id string, p process) []string {
	a := []string{"exec"}
	if p.Stdin != nil {
		a = append(a, "-i")
	}
	for _, e := range p.Env {
		a = append(a, "--env", e)
	}
	if p.Workdir != "" {
		a = append(a, "--workdir", p.Workdir)
	}
	if p.User != "" {
		a = append(a, "--user", p.User)
	}
	return append(append(a, id), p.Argv...)
}

func (d cliDriver) copyIn(ctx context.Context, id, dir string, r io.Reader) error {
	_, err := d.run(ctx, "cp", dir, exec.Command{Args: []string{"cp", "-", id + ":" + dir}, Stdin: r})
	return err
}

func (d cliDriver) copyOut(ctx context.Context, id, path string, w io.Writer) error {
	_, err := d.run(ctx, "cp", path, exec.Command{Args: []string{"cp", id + ":" + path, "-"}, Stdout: w})
	return err
}

func (d cliDriver) remove(ctx context.Context, id string) error {
	_, err := d.run(ctx, "rm", id, exec.Command{Args: []string{"rm", "-f", "-t", "0", "--ignore", id}})
	if errors.Is(err, ErrNoSuchContainer) {
		return nil
	}
	return err
}

func (d cliDriver) list(ctx context.Context, label string) ([]container, error) {
	res, err := d.run(ctx, "ps", "", exec.Command{Args: []string{"ps", "-a", "--filter", "label=" + label, "--format", "json"}, MaxOutputBytes: 64 << 20})
	if err != nil {
		return nil, err
	}
	var list []struct {
		ID     string            `json:"Id"`
		Labels map[string]string `json:"Labels"`
	}
	if err := json.Unmarshal([]byte(res.Stdout), &list); err != nil {
		return nil, fmt.Errorf("%w: podman ps: %v", ErrPodman, err)
	}
	found := make([]container, len(list))
	for i, c := range list {
		found[i] = container{ID: c.ID, Labels: c.Labels}
	}
	return found, nil
}

func (cliDriver) close() {}

// attach runs `podman start -a -i`, which attaches before it starts: the
// stream is its stdin and stdout, for as long as it runs. Closing the
// stream ends its stdin and stops it.
func (d cliDriver) attach(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		_, err := d.run(actx, "start", id, exec.Command{Args: []string{"start", "-a", "-i", id}, Stdin: inR, Stdout: outW})
		if err == nil {
			err = io.EOF
		}
		outW.CloseWithError(err)
		inR.Close()
	}()
	return &attached{Reader: outR, Writer: inW, close: func() error {
		inW.Close()
		outR.Close()
		cancel()
		return nil
	}}, nil
}
