package vm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/deadline"
)

// labelToken names one CLIVM's container before its ID is known, so that
// a failed or cancelled Create, or a Remove after it, finds what podman
// made without touching a container of the same Name that is not ours.
const labelToken = "io.podvm.token"

// initEntrypoint makes PID 1 Podman's init (catatonit, with --init) in
// pause mode: it keeps the sandbox alive and reaps orphans, and needs
// nothing from the image, not even /bin/sh.
const initEntrypoint = `["/run/podman-init","-P"]`

const (
	// errCapture caps what is captured of podman's output when only its
	// errors matter (cp, rm, the kill command).
	errCapture = 64 << 10
	// cleanupTimeout bounds the removal after a failed Create.
	cleanupTimeout = 30 * time.Second
)

// CLIVM is a [VM] that drives the podman command through an
// [exec.Executor]: Create is `podman run -d`, Run is `podman exec`, the
// copies are `podman cp` and Remove is `podman rm -f -t 0`. Create one
// with [NewCLIVM]; it is safe for concurrent use.
//
// Prefer the local podman. Through a remote connection ([WithURL], or
// CONTAINER_HOST in the executor's environment) podman-remote itself now
// and then loses the output of a short exec, under load, and reports its
// exit status alone (containers/podman#25855); for a service, use [APIVM].
type CLIVM struct {
	cfg    Config // with defaults
	x      exec.Executor
	podman string   // the binary
	global []string // global flags before the subcommand
	token  string   // value of labelToken on our container

	st state
	mu sync.Mutex // serializes Create and Remove; guards the fields below
	// created: Create was called; gone: Remove removed what it made.
	created, gone bool
}

var _ VM = (*CLIVM)(nil)

// NewCLIVM returns a VM for cfg, not yet created, whose podman commands
// run through x (nil means [exec.NewCommandExecutor]()). It calls no
// podman: it fails with an error matching [ErrInvalidConfig] when cfg is
// invalid or, when the Podman host is this machine (no URL, or a unix://
// one), when a mount source does not exist. Of the options it uses
// [WithPodman] (the binary) and [WithURL] (podman's --url).
func NewCLIVM(cfg Config, x exec.Executor, opts ...Option) (*CLIVM, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if x == nil {
		x = exec.NewCommandExecutor()
	}
	o := newOptions(opts)
	v := &CLIVM{cfg: cfg.withDefaults(), x: x, podman: o.podman, token: randomHex()}
	if o.url != "" {
		v.global = []string{"--url", o.url}
	}
	switch {
	case v.podman == "" || strings.IndexByte(v.podman, 0) >= 0:
		return nil, fmt.Errorf("%w: podman path %q", ErrInvalidConfig, v.podman)
	case len(v.global) == 2 && (v.global[1] == "" || strings.HasPrefix(v.global[1], "-")):
		return nil, fmt.Errorf("%w: podman URL %q", ErrInvalidConfig, v.global[1])
	}
	if v.hostIsLocal() {
		if err := cfg.checkMountSources(); err != nil {
			return nil, err
		}
	}
	return v, nil
}

// hostIsLocal reports whether podman runs its containers on this machine.
func (v *CLIVM) hostIsLocal() bool {
	uri := os.Getenv("CONTAINER_HOST")
	if len(v.global) == 2 {
		uri = v.global[1]
	}
	return uri == "" || strings.HasPrefix(uri, "unix://")
}

func randomHex() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ID returns the container's ID once Create succeeded, "" before.
func (v *CLIVM) ID() string { return v.st.ID() }

// Create runs the sandbox with one `podman run -d`, every field of the
// Config mapped to its flag; PID 1 is Podman's init in pause mode, so any
// image works, with or without a shell. It fails with [ErrAlreadyCreated]
// when called twice and [ErrRemoved] after Remove. When podman fails, or
// ctx ends midway, it removes whatever podman made (found by a label of
// its own, never by Name) before it returns. Podman's failures match
// [ErrImageNotFound], [ErrNameInUse], [ErrUnavailable] or [ErrPodman].
func (v *CLIVM) Create(ctx context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case v.st.isRemoved():
		return ErrRemoved
	case v.created:
		return ErrAlreadyCreated
	}
	v.created = true
	if v.cfg.ImageArchive != "" {
		if err := v.loadArchive(ctx); err != nil {
			v.gone = true // nothing was made
			return err
		}
	}
	res, err := v.run(ctx, exec.Command{Args: v.runArgs(), MaxOutputBytes: errCapture})
	switch {
	case err != nil:
		err = fmt.Errorf("vm: create from %s: %w", v.cfg.Image, err)
	case res.ExitCode != 0:
		err = cliError("run", v.cfg.Image, res)
	case !isContainerID(strings.TrimSpace(res.Stdout)):
		err = fmt.Errorf("%w: podman run printed %q, not a container ID", ErrPodman, res.Stdout)
	default:
		v.st.setID(strings.TrimSpace(res.Stdout))
		return nil
	}
	if errors.Is(err, ErrUnavailable) {
		v.gone = true // podman never reached the service: nothing was made
		return err
	}
	// With a context of its own: ctx may be what ended the create.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	if rmErr := v.removeMade(cctx); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("vm: removing what the failed create made: %w", rmErr))
	}
	return err
}

// loadArchive loads the config's image archive when the image is not
// present, or always under PullAlways.
func (v *CLIVM) loadArchive(ctx context.Context) error {
	if v.cfg.Pull != PullAlways {
		res, err := v.run(ctx, exec.Command{Args: []string{"image", "exists", v.cfg.Image}, MaxOutputBytes: errCapture})
		switch {
		case err != nil:
			return fmt.Errorf("vm: image exists %s: %w", v.cfg.Image, err)
		case res.ExitCode == 0:
			return nil
		case res.ExitCode != 1:
			return cliError("image exists", v.cfg.Image, res)
		}
	}
	if _, err := os.Stat(v.cfg.ImageArchive); err != nil {
		return fmt.Errorf("%w: image archive: %v", ErrInvalidConfig, err)
	}
	res, err := v.run(ctx, exec.Command{Args: []string{"load", "-q", "-i", v.cfg.ImageArchive}, MaxOutputBytes: errCapture})
	switch {
	case err != nil:
		return fmt.Errorf("vm: load %s: %w", v.cfg.ImageArchive, err)
	case res.ExitCode != 0:
		return cliError("load", v.cfg.ImageArchive, res)
	}
	return nil
}

func isContainerID(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// runArgs is the argv of `podman run` for the config.
func (v *CLIVM) runArgs() []string {
	c := v.cfg
	pull := c.Pull
	if c.ImageArchive != "" {
		pull = PullNever // Create loaded the archive; no registry
	}
	a := []string{"run", "-d", "--pull", string(pull)}
	if c.Name != "" {
		a = append(a, "--name", c.Name)
	}
	labels := c.labels()
	labels[labelToken] = v.token
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
	return append(a, "--init", "--entrypoint", initEntrypoint, c.Image)
}

// Run runs cmd with `podman exec`, keeping the [VM.Run] contract. The
// executor captures podman's output, so Command's Stdout, Stderr,
// MaxOutputBytes, Timeout and Stdin behave as they do on the host. A
// non-zero exit is data, 126 and 127 included; podman's own failures
// return a nil Result and an error matching [exec.ErrNotFound],
// [exec.ErrPermission] or [exec.ErrDirNotFound] (the command could not
// start), or [ErrNoSuchContainer], [ErrContainerNotRunning],
// [ErrUnavailable], [ErrPodman]. Their text may have reached a live
// Stderr writer. When the timeout or ctx stops the run, a second exec
// kills, inside the sandbox, every process the command started, and Run
// returns the partial Result with TimedOut set and an error matching
// [context.DeadlineExceeded] or [context.Canceled].
func (v *CLIVM) Run(ctx context.Context, cmd exec.Command) (*exec.Result, error) {
	res, err := v.runCmd(ctx, cmd)
	return v.st.ended(cmd.Name, res, err)
}

// runCmd is Run but for a Remove during the run.
func (v *CLIVM) runCmd(ctx context.Context, cmd exec.Command) (*exec.Result, error) {
	if err := cmd.Validate(); err != nil {
		return nil, err
	}
	id, err := v.st.container()
	if err != nil {
		return nil, err
	}
	spec := newExecSpec(v.cfg, cmd)
	res, err := v.run(ctx, exec.Command{
		Args:           v.execArgs(id, spec, cmd.Stdin != nil),
		Stdin:          cmd.Stdin,
		Stdout:         cmd.Stdout,
		Stderr:         cmd.Stderr,
		Timeout:        cmd.Timeout,
		MaxOutputBytes: cmd.MaxOutputBytes,
	})
	switch {
	case res == nil:
		return nil, fmt.Errorf("vm: %s: %w", cmd.Name, err)
	case res.TimedOut:
		return res, v.stopped(ctx, id, spec, cmd)
	case err != nil: // Stdin or a live writer failed
		return res, fmt.Errorf("vm: %s: %w", cmd.Name, err)
	case res.ExitCode != 0 && execFailed(res):
		return nil, cliError("exec", cmd.Name, res)
	}
	return res, nil
}

// stopped kills what a stopped run left in the sandbox and returns the
// error stating why the run stopped.
func (v *CLIVM) stopped(ctx context.Context, id string, spec execSpec, cmd exec.Command) error {
	// The run was stopped: by ctx if it has ended, else by the timeout.
	done, cancel := context.WithCancel(ctx)
	cancel()
	err := deadline.Err("vm", ctx, done, cmd.Name, cmd.Timeout)

	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
	defer cancel()
	kill := v.execArgs(id, spec.killSpec(), false)
	kerr := retryKill(kctx, func(ctx context.Context) error {
		res, err := v.run(ctx, exec.Command{Args: kill, MaxOutputBytes: errCapture})
		if err == nil && res.ExitCode != 0 {
			err = cliError("exec", "kill", res)
		}
		return err
	})
	if kerr != nil {
		return errors.Join(err, fmt.Errorf("vm: %s: killing its processes in the sandbox: %w", cmd.Name, kerr))
	}
	return err
}

// execArgs is the argv of `podman exec` for spec.
func (v *CLIVM) execArgs(id string, spec execSpec, stdin bool) []string {
	a := []string{"exec"}
	if stdin {
		a = append(a, "-i")
	}
	for _, e := range spec.Env {
		a = append(a, "--env", e)
	}
	if spec.Workdir != "" {
		a = append(a, "--workdir", spec.Workdir)
	}
	if spec.User != "" {
		a = append(a, "--user", spec.User)
	}
	return append(append(a, id), spec.Argv...)
}

// CopyIn extracts the tar stream r into directory dir of the sandbox with
// `podman cp - CONTAINER:dir`, streaming r through the archive guard: an
// entry that would land outside dir fails the copy with an error matching
// [ErrUnsafeArchive] (entries before it may have been extracted).
func (v *CLIVM) CopyIn(ctx context.Context, dir string, r io.Reader) error {
	if err := checkPath("copy into", dir); err != nil {
		return err
	}
	id, err := v.st.container()
	if err != nil {
		return err
	}
	in := &errReader{r: guardTar(r)}
	res, err := v.run(ctx, exec.Command{Args: []string{"cp", "-", id + ":" + dir}, Stdin: in, MaxOutputBytes: errCapture})
	switch {
	case in.Err() != nil:
		return fmt.Errorf("vm: copy into %s: %w", dir, in.Err())
	case err != nil:
		return fmt.Errorf("vm: copy into %s: %w", dir, err)
	case res.ExitCode != 0:
		return cliError("cp", dir, res)
	}
	return nil
}

// CopyOut writes path of the sandbox to w as a tar stream, with `podman
// cp CONTAINER:path -` streamed through the archive guard; the archive is
// never held in memory. An entry of the sandbox's archive that would land
// outside its root fails the copy with an error matching
// [ErrUnsafeArchive]. When CopyOut fails, w may have received part of a
// stream.
func (v *CLIVM) CopyOut(ctx context.Context, path string, w io.Writer) error {
	if err := checkPath("copy out", path); err != nil {
		return err
	}
	id, err := v.st.container()
	if err != nil {
		return err
	}
	pr, pw := io.Pipe()
	copied := make(chan error, 1)
	go func() {
		_, err := io.Copy(w, guardTar(pr))
		if err == nil {
			_, err = io.Copy(io.Discard, pr) // the padding after the trailer
		}
		pr.CloseWithError(err) // podman's further output is dropped
		copied <- err
	}()
	res, err := v.run(ctx, exec.Command{Args: []string{"cp", id + ":" + path, "-"}, Stdout: pw, MaxOutputBytes: errCapture})
	pw.Close()
	copyErr := <-copied
	switch {
	case err != nil && (res == nil || res.TimedOut):
		return fmt.Errorf("vm: copy out %s: %w", path, err)
	case res.ExitCode != 0:
		return cliError("cp", path, res)
	case copyErr != nil:
		return fmt.Errorf("vm: copy out %s: %w", path, copyErr)
	}
	return nil
}

func checkPath(op, p string) error {
	if !path.IsAbs(p) || strings.IndexByte(p, 0) >= 0 {
		return fmt.Errorf("vm: %s %q: want an absolute path in the sandbox", op, p)
	}
	return nil
}

// errReader keeps the first error of r other than io.EOF. Its Err may be
// called while another goroutine reads.
type errReader struct {
	r   io.Reader
	mu  sync.Mutex
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.mu.Lock()
		if e.err == nil {
			e.err = err
		}
		e.mu.Unlock()
	}
	return n, err
}

// Err is the first error other than io.EOF that a Read has returned.
func (e *errReader) Err() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

// Remove deletes the sandbox with `podman rm -f -t 0`, killing whatever
// runs in it. It is idempotent and safe before Create, after a failed or
// cancelled Create, and concurrently with itself; it waits for a Create
// in progress. A container already gone counts as removed. After Remove,
// Run and the copies fail with [ErrRemoved], even when Remove itself
// failed (a later Remove tries again).
func (v *CLIVM) Remove(ctx context.Context) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.st.markRemoved()
	if !v.created || v.gone {
		return nil
	}
	if err := v.removeMade(ctx); err != nil {
		return err
	}
	v.gone = true
	return nil
}

// removeMade removes our container: by ID once known, else by our label,
// which also finds one that a cancelled Create left behind.
func (v *CLIVM) removeMade(ctx context.Context) error {
	a := []string{"rm", "-f", "-t", "0", "--ignore"}
	if id := v.st.ID(); id != "" {
		a = append(a, id)
	} else {
		a = append(a, "--filter", "label="+labelToken+"="+v.token)
	}
	res, err := v.run(ctx, exec.Command{Args: a, MaxOutputBytes: errCapture})
	switch {
	case err != nil:
		return fmt.Errorf("vm: remove: %w", err)
	case res.ExitCode != 0:
		if err := cliError("rm", v.st.ID(), res); !errors.Is(err, ErrNoSuchContainer) {
			return err
		}
	}
	return nil
}

// run runs podman with the global flags and c.Args through the executor.
// When podman cannot be started, the error matches [ErrUnavailable];
// otherwise the executor's Result and error are returned as they are.
func (v *CLIVM) run(ctx context.Context, c exec.Command) (*exec.Result, error) {
	c.Name = v.podman
	c.Args = append(slices.Clip(v.global), c.Args...)
	res, err := v.x.Run(ctx, c)
	if res == nil && err != nil && (errors.Is(err, exec.ErrNotFound) || errors.Is(err, exec.ErrPermission)) {
		// %v: the sandbox's exec.ErrNotFound must not match.
		return nil, fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return res, err
}
