package vm

import (
	"cmp"
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
	host   string   // the service podman talks to: --url, or CONTAINER_HOST as podman sees it
}

var _ driver = cliDriver{}

// cliError wraps a failed podman invocation as a [*CLIError], with the
// sentinel its stderr means.
func cliError(op, what string, res *exec.Result) error {
	return classify("podman "+op, what, res.Stderr, &CLIError{Op: op, ExitCode: res.ExitCode, Stderr: res.Stderr})
}

// invoke runs podman with the global flags and c.Args through the
// executor. Podman that cannot be started is [ErrUnavailable].
func (d cliDriver) invoke(ctx context.Context, c exec.Command) (*exec.Result, error) {
	c.Name = d.podman
	c.Args = append(slices.Clip(d.global), c.Args...)
	res, err := d.x.Run(ctx, c)
	if res == nil && (errors.Is(err, exec.ErrNotFound) || errors.Is(err, exec.ErrPermission)) {
		// %v: the sandbox's exec.ErrNotFound must not match.
		return nil, fmt.Errorf("%w: %w: %v", ErrUnavailable, errNotReached, err)
	}
	return res, err
}

// run is invoke for a command whose output only matters as an error,
// and maps a non-zero exit of podman to cliError. A Result with TimedOut
// comes back with the executor's error.
func (d cliDriver) run(ctx context.Context, op, what string, c exec.Command) (*exec.Result, error) {
	c.MaxOutputBytes = cmp.Or(c.MaxOutputBytes, errCapture)
	res, err := d.invoke(ctx, c)
	switch {
	case errors.Is(err, errNotReached):
		return nil, err
	case err != nil:
		return res, wrap(nil, "podman "+op, what, err)
	case res.ExitCode != 0:
		return res, cliError(op, what, res)
	}
	return res, nil
}

func (d cliDriver) image(ctx context.Context, ref string) (string, error) {
	res, err := d.run(ctx, "image inspect", ref, exec.Command{Args: []string{"image", "inspect", "--format", "{{.Architecture}}", ref}})
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(res.Stdout), nil
}

func (d cliDriver) fetch(ctx context.Context, cfg Config) error {
	op, what, args := "pull", cfg.Image, []string{"pull", "-q", cfg.Image}
	if cfg.ImageArchive != "" {
		if _, err := os.Stat(cfg.ImageArchive); err != nil {
			return fmt.Errorf("%w: image archive: %v", ErrInvalidConfig, err)
		}
		op, what, args = "load", cfg.ImageArchive, []string{"load", "-q", "-i", cfg.ImageArchive}
	}
	_, err := d.run(ctx, op, what, exec.Command{Args: args})
	return err
}

func (d cliDriver) local() (bool, string) {
	return isLocal(d.host), d.podman + " " + d.host
}

func (d cliDriver) create(ctx context.Context, cfg Config, labels map[string]string, agent *agentMount) (string, error) {
	res, err := d.run(ctx, "run", cfg.Image, exec.Command{Args: runArgs(cfg, labels, agent)})
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(res.Stdout)
	if _, err := hex.DecodeString(id); err != nil || len(id) != 64 {
		return "", fmt.Errorf("%w: podman run printed %q, not a container ID", ErrPodman, res.Stdout)
	}
	return id, nil
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
	a = append(a, "--pull", string(PullNever)) // the sandbox's ensureImage made it present
	a = appendFlag(a, "--name", c.Name)
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
	a = appendFlag(appendFlag(a, "--workdir", c.Workdir), "--user", c.User)
	for _, e := range c.Env {
		a = append(a, "--env", e)
	}
	if agent != nil {
		return append(a, "--entrypoint", `["`+agentPath+`"]`, c.Image)
	}
	init, _ := json.Marshal(initEntrypoint)
	return append(a, "--init", "--entrypoint", string(init), c.Image)
}

// exec runs p with `podman exec`, its stdio streamed through the
// executor. podman's exit status is returned as it is: the sandbox tells
// the command's from podman's own failures by content.
func (d cliDriver) exec(ctx context.Context, id string, p process) (int, bool, error) {
	res, err := d.invoke(ctx, exec.Command{
		Args:           execArgs(id, p),
		Stdin:          p.Stdin,
		Stdout:         p.Stdout,
		Stderr:         p.Stderr,
		MaxOutputBytes: 1, // the sandbox captures through the writers
	})
	switch {
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
	a = appendFlag(appendFlag(a, "--workdir", p.Workdir), "--user", p.User)
	return append(append(a, id), p.Argv...)
}

// appendFlag appends flag and v to a unless v is empty.
func appendFlag(a []string, flag, v string) []string {
	if v == "" {
		return a
	}
	return append(a, flag, v)
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
	var found []container
	if err := json.Unmarshal([]byte(res.Stdout), &found); err != nil {
		return nil, fmt.Errorf("%w: podman ps: %v", ErrPodman, err)
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
