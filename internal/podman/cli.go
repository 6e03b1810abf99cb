package podman

import (
	"archive/tar"
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/sshhost"
)

// CLI is the [driver.Driver] that reaches Podman by running the podman command
// through an [exec.Executor].
type CLI struct {
	x      exec.Executor
	podman string   // the binary
	global []string // global flags before the subcommand
	host   string   // the service podman talks to: --url, or CONTAINER_HOST as podman sees it
	// hostKey checks an ssh:// host's key before podman first reaches
	// it, once for the driver and all its copies; nil for other hosts.
	hostKey *hostKeyCheck
}

// hostKeyCheck runs [sshhost.Check] on a service until it passes once.
// podman's ssh client would add a host missing from known_hosts to it
// and go on; podvm refuses such a host, and a changed one, before podman
// runs.
type hostKeyCheck struct {
	uri string
	mu  sync.Mutex
	ok  bool
}

// check returns nil once the host's key has been verified; a failed
// check is tried again at the next call. Callers wait for a check under
// way.
func (h *hostKeyCheck) check(ctx context.Context) error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ok {
		return nil
	}
	if err := sshhost.Check(ctx, h.uri); err != nil {
		return err
	}
	h.ok = true
	return nil
}

var _ driver.Driver = CLI{}

// NewCLI returns the driver that runs podman, the binary bin, through x
// (nil means [NewExecutor]()), with --url url when url is set.
// containerHost is CONTAINER_HOST as podman will see it: with no url,
// the service podman talks to, for [CLI.Local]. A bin or url that cannot
// be passed to podman is [driver.ErrInvalidConfig].
func NewCLI(x exec.Executor, bin, url, containerHost string) (CLI, error) {
	switch {
	case bin == "" || strings.IndexByte(bin, 0) >= 0:
		return CLI{}, fmt.Errorf("%w: podman path %q", driver.ErrInvalidConfig, bin)
	case strings.HasPrefix(url, "-"):
		return CLI{}, fmt.Errorf("%w: podman URL %q", driver.ErrInvalidConfig, url)
	}
	if x == nil {
		x = NewExecutor()
	}
	d := CLI{x: x, podman: bin, host: cmp.Or(url, containerHost)}
	if url != "" {
		d.global = []string{"--url", url}
	}
	if strings.HasPrefix(strings.ToLower(d.host), "ssh://") {
		d.hostKey = &hostKeyCheck{uri: d.host}
	}
	return d, nil
}

// NewExecutor is the executor podman runs through by default. Podman is not
// the untrusted command: it starts conmon, which must outlive it, so a
// run is contained by its process group alone (conmon leaves it), never
// killed as a cgroup or a subreaper's tree.
func NewExecutor(opts ...exec.Option) exec.Executor {
	return exec.NewCommandExecutor(append(opts, exec.WithContainment(exec.ContainProcessGroup))...)
}

// cliError wraps a failed podman invocation as a [*CLIError], with the
// sentinel its stderr means.
func cliError(op, what string, res *exec.Result) error {
	return classify("podman "+op, what, res.Stderr, &CLIError{Op: op, ExitCode: res.ExitCode, Stderr: res.Stderr})
}

// invoke runs podman with the global flags and c.Args through the
// executor. Podman that cannot be started, or an ssh:// host whose key
// is unknown or changed, is [driver.ErrUnavailable] and [driver.ErrNotReached]; a ctx
// that ended the host key's check, [driver.ErrNotReached] and ctx's error.
func (d CLI) invoke(ctx context.Context, c exec.Command) (*exec.Result, error) {
	if err := d.hostKey.check(ctx); err != nil {
		if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) { // ctx ended the check, not the host
			return nil, fmt.Errorf("vm: podman: %w: %s: %w", driver.ErrNotReached, d.host, err)
		}
		return nil, fmt.Errorf("%w: %w: podman's service %s: %w", driver.ErrUnavailable, driver.ErrNotReached, d.host, err)
	}
	c.Name = d.podman
	c.Args = append(slices.Clip(d.global), c.Args...)
	res, err := d.x.Run(ctx, c)
	if res == nil && (errors.Is(err, exec.ErrNotFound) || errors.Is(err, exec.ErrPermission)) {
		// %v: the sandbox's exec.ErrNotFound must not match.
		return nil, fmt.Errorf("%w: %w: %v", driver.ErrUnavailable, driver.ErrNotReached, err)
	}
	return res, err
}

// run is invoke for a command whose output only matters as an error,
// and maps a non-zero exit of podman to cliError. A Result with TimedOut
// comes back with the executor's error.
func (d CLI) run(ctx context.Context, op, what string, c exec.Command) (*exec.Result, error) {
	c.MaxOutputBytes = cmp.Or(c.MaxOutputBytes, MessageBytes)
	res, err := d.invoke(ctx, c)
	switch {
	case errors.Is(err, driver.ErrNotReached):
		return nil, err
	case err != nil:
		return res, wrap(nil, "podman "+op, what, err)
	case res.ExitCode != 0:
		return res, cliError(op, what, res)
	}
	return res, nil
}

// Image implements [driver.Driver.Image] with `podman image inspect`.
func (d CLI) Image(ctx context.Context, ref string) (string, error) {
	res, err := again(ctx, imageVanished, func() (*exec.Result, error) {
		return d.run(ctx, "image inspect", ref, exec.Command{Args: []string{"image", "inspect", "--format", "{{.Architecture}}", ref}})
	})
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(res.Stdout), nil
}

// Fetch implements [driver.Driver.Fetch] with `podman pull` or `podman load`.
func (d CLI) Fetch(ctx context.Context, image, archive string) error {
	op, what, args := "pull", image, []string{"pull", "-q", image}
	if archive != "" {
		if _, err := os.Stat(archive); err != nil {
			return fmt.Errorf("%w: image archive: %v", driver.ErrInvalidConfig, err)
		}
		op, what, args = "load", archive, []string{"load", "-q", "-i", archive}
	}
	_, err := d.run(ctx, op, what, exec.Command{Args: args})
	return err
}

// Local implements [driver.Driver.Local]: podman with no service, or a unix://
// one, is local.
func (d CLI) Local() (bool, string) {
	return IsLocal(d.host), d.podman + " " + d.host
}

// Create implements [driver.Driver.Create] with `podman run -d`, or `podman
// create` for an agent.
func (d CLI) Create(ctx context.Context, spec driver.Spec) (string, error) {
	_, service := d.Local()
	id, err := d.create(ctx, asked(service, spec))
	return id, forget(service, err) // asked again what it enforces, once back
}

// create is Create but for what the service is known to enforce, of a
// spec as [asked] returns it.
func (d CLI) create(ctx context.Context, spec driver.Spec) (string, error) {
	res, err := d.run(ctx, "run", spec.Image, exec.Command{Args: CreateArgs(spec)})
	if err != nil {
		return "", err
	}
	id := strings.TrimSpace(res.Stdout)
	if _, err := hex.DecodeString(id); err != nil || len(id) != 64 {
		return "", fmt.Errorf("%w: podman run printed %q, not a container ID", driver.ErrEngine, res.Stdout)
	}
	return id, nil
}

// Exec runs p with `podman exec`, its stdio streamed through the
// executor. podman's own failure to start the command is an error, the
// session not started; the command's exit status is returned as it is
// ([StartFailure] tells which by content).
//
// When podman's stream to the service broke (podman-remote, when the
// command exits before reading all of its stdin), podman exits 125 with
// its own lines last on stderr, in place of the command's status: that
// is an error matching [driver.ErrEngine] ([LostStream]), never an exit status.
// The local podman loses output there without a word (conmon resets the
// attach socket holding unread stdin; podman's reader stops at the reset,
// libpod/oci_conmon_attach_common.go, redirectResponseToOutputStreams):
// so a Stdin that podman was still sending when it exited (neither at
// its end nor waited for) is an error matching [driver.ErrEngine] too.
//
// A remote client that loses the beginning of an exec's output (podman-remote
// before 5.7: see climarks.go) runs the command under package marks'
// script instead, in the image's /bin/sh: nothing is lost, and a session
// cut short is an error matching [driver.ErrEngine]. There an environment
// variable whose name sh cannot set is [driver.ErrNotSupported]. An image
// without /bin/sh runs its commands as podman would, with the loss.
func (d CLI) Exec(ctx context.Context, id string, p driver.Process) (int, bool, error) {
	return execWatched(p, func(p driver.Process) (int, bool, error) {
		key := d.shellKey(id)
		if _, no := noShell.Load(key); !no && d.needsMarks(ctx) {
			code, started, no, err := d.execMarked(ctx, id, p)
			if !no {
				return code, started, err
			}
			noShell.Store(key, true)
		}
		return d.exec(ctx, id, p)
	})
}

// exec is Exec but for telling Podman's failure to start the command.
func (d CLI) exec(ctx context.Context, id string, p driver.Process) (int, bool, error) {
	tail := &tailWriter{max: 4 << 10}
	stderr := io.Writer(tail)
	if p.Stderr != nil {
		stderr = io.MultiWriter(p.Stderr, tail)
	}
	var stdin *endReader
	if p.Stdin != nil {
		stdin = &endReader{r: p.Stdin}
	}
	res, err := d.invoke(ctx, exec.Command{
		Args:           execArgs(id, p),
		Stdin:          stdin.reader(),
		Stdout:         p.Stdout,
		Stderr:         stderr,
		MaxOutputBytes: 1, // the caller captures through the writers
	})
	switch {
	case res == nil:
		return -1, false, err
	case res.TimedOut:
		return -1, true, err
	}
	if err := LostStream(p.Argv[0], res.ExitCode, string(tail.b)); err != nil {
		return -1, true, err
	}
	if stdin.pending() {
		return -1, true, fmt.Errorf("%w: %s: the command exited before reading all of its stdin, and podman may have lost its output with it: "+
			"the end of the stream is reset, and what was still in it is dropped without a word", driver.ErrEngine, p.Argv[0])
	}
	// Another error is Stdin's or a writer's, which the caller reports.
	return res.ExitCode, true, nil
}

// CopyIn implements [driver.Driver.CopyIn] with `podman cp - CTR:DIR`.
//
// podman cp first stats DIR, reading it as a pattern, then extracts into
// the path the stat named, as it is (see paths.go): no one string serves
// both when DIR holds a glob character, and podman-remote sends that path
// back through JSON, which breaks bytes that are not UTF-8. So for such a
// DIR, its deepest ancestor that podman reads as itself is the
// destination and the rest of DIR goes in front of every entry's name,
// once [CLI.isDir] has found DIR a directory.
//
// podman cp spools the archive it reads from stdin into a temporary file
// before it extracts it, and leaves that file behind
// (cmd/podman/containers/cp.go, copyToContainer: os.CreateTemp, never
// removed). Each call gives podman a TMPDIR of its own, mode 0700, and
// removes it when the call returns, whatever happened.
func (d CLI) CopyIn(ctx context.Context, id, dir string, r io.Reader) error {
	base, rest := literalParent(dir)
	if rest != "" {
		if err := d.isDir(ctx, id, dir); err != nil {
			return err
		}
		pr, pw := io.Pipe()
		go func(src io.Reader) { pw.CloseWithError(prefixTar(pw, src, rest)) }(r)
		defer pr.Close()
		r = pr
	}
	tmp, err := os.MkdirTemp("", "podvm-cp-")
	if err != nil {
		return fmt.Errorf("%w: copy into %s: a private TMPDIR for podman: %v", driver.ErrEngine, dir, err)
	}
	defer os.RemoveAll(tmp)
	_, err = d.run(ctx, "cp", dir, exec.Command{Args: []string{"cp", "-", id + ":" + base}, Stdin: r, Env: []string{"TMPDIR=" + tmp}})
	return err
}

// isDir checks that dir, a path podman cannot name as itself for a
// copy in, is a directory: it reads the first entry of `podman cp
// CTR:PATTERN -` and stops podman there. A missing dir matches
// [fs.ErrNotExist], a file [driver.ErrEngine], as for the API.
func (d CLI) isDir(ctx context.Context, id, dir string) error {
	if err := d.nameable(dir); err != nil {
		return err
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	first := &firstHeader{stop: cancel}
	_, err := d.run(pctx, "cp", dir, exec.Command{Args: []string{"cp", id + ":" + globLiteral(dir, d.host != ""), "-"}, Stdout: first})
	h := first.header()
	switch {
	case h == nil && ctx.Err() != nil:
		return wrap(nil, "podman cp", dir, ctx.Err())
	case h == nil && err != nil:
		return err
	case h == nil:
		return fmt.Errorf("%w: copy into %s: podman cp gave no archive", driver.ErrEngine, dir)
	case strings.TrimSuffix(h.Name, "/") != path.Base(dir):
		return fmt.Errorf("%w: copy into %s: podman cannot tell this path from %q (bytes that are not UTF-8)", driver.ErrNotSupported, dir, h.Name)
	case h.Typeflag != tar.TypeDir:
		return fmt.Errorf("%w: copy into %s: not a directory in the sandbox", driver.ErrEngine, dir)
	}
	return nil
}

// nameable refuses a path that podman-remote cannot be made to name
// alone: bytes that are not UTF-8 in a directory above its last element.
// Their pattern ([badByteClass]) may match another directory, whose
// entries would carry the same names as the wanted ones.
func (d CLI) nameable(p string) error {
	if dir := path.Dir(p); d.host != "" && !utf8.ValidString(dir) {
		return fmt.Errorf("%w: %q: podman-remote cannot name a directory with bytes that are not UTF-8 (%q) exactly; use the API or the local podman", driver.ErrNotSupported, p, dir)
	}
	return nil
}

// CopyOut implements [driver.Driver.CopyOut] with `podman cp CTR:PATH -`, PATH
// a pattern that matches path alone ([globLiteral]). For podman-remote,
// a byte that is not UTF-8 has to be a class that matches any such byte
// (see globLiteral): then only the entries named after path's own base
// name are kept, and none is [fs.ErrNotExist].
func (d CLI) CopyOut(ctx context.Context, id, p string, w io.Writer) error {
	ambiguous := d.host != "" && !utf8.ValidString(p)
	if err := d.nameable(p); err != nil {
		return err
	}
	if !ambiguous {
		_, err := d.run(ctx, "cp", p, exec.Command{Args: []string{"cp", id + ":" + globLiteral(p, false), "-"}, Stdout: w})
		return err
	}
	pr, pw := io.Pipe()
	kept := make(chan keptResult, 1)
	go func() {
		n, err := keepTree(w, pr, path.Base(p))
		pr.CloseWithError(err)
		kept <- keptResult{n, err}
	}()
	_, err := d.run(ctx, "cp", p, exec.Command{Args: []string{"cp", id + ":" + globLiteral(p, true), "-"}, Stdout: pw})
	pw.Close()
	k := <-kept
	switch {
	case k.err != nil:
		return errors.Join(fmt.Errorf("vm: copy out %s: %w", p, k.err), err)
	case err != nil:
		return err
	case k.n == 0:
		return fmt.Errorf("vm: copy out %s: %w in the sandbox (podman-remote matched another name)", p, fs.ErrNotExist)
	}
	return nil
}

// Remove implements [driver.Driver.Remove] with `podman rm -f -t 0`.
func (d CLI) Remove(ctx context.Context, id string) error {
	noShell.Delete(d.shellKey(id))
	return removeAgain(ctx, func() error {
		_, err := d.run(ctx, "rm", id, exec.Command{Args: []string{"rm", "-f", "-t", "0", "--ignore", id}})
		if errors.Is(err, driver.ErrNoSuchContainer) {
			return nil
		}
		return err
	})
}

// List implements [driver.Driver.List] with `podman ps`.
func (d CLI) List(ctx context.Context, label string) ([]driver.Container, error) {
	res, err := d.run(ctx, "ps", "", exec.Command{Args: []string{"ps", "-a", "--filter", "label=" + label, "--format", "json"}, MaxOutputBytes: 64 << 20})
	if err != nil {
		return nil, err
	}
	var found []driver.Container
	if err := json.Unmarshal([]byte(res.Stdout), &found); err != nil {
		return nil, fmt.Errorf("%w: podman ps: %v", driver.ErrEngine, err)
	}
	return found, nil
}

// Close does nothing: podman keeps nothing open between calls.
func (CLI) Close() {}

// Start implements [driver.Driver.Start] with `podman start`.
func (d CLI) Start(ctx context.Context, id string) error {
	_, err := d.run(ctx, "start", id, exec.Command{Args: []string{"start", id}})
	return err
}

// Attach runs `podman start -a -i`, which attaches before it starts: the
// stream is its stdin and stdout, for as long as it runs. Closing the
// stream ends its stdin and stops it.
func (d CLI) Attach(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	return d.attach(ctx, "start", id, "start", "-a", "-i", id)
}

// attach runs podman with args, whose stdin and stdout are container
// id's: the stream, for as long as it runs.
func (d CLI) attach(ctx context.Context, op, id string, args ...string) (io.ReadWriteCloser, error) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		_, err := d.run(actx, op, id, exec.Command{Args: args, Stdin: inR, Stdout: outW})
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
