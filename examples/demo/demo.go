package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// Where the seed and the build cache appear in the sandbox. The toolchain
// keeps its host path (see toolchainMounts).
const (
	srcDir   = "/src"
	cacheDir = "/cache"
	binary   = "/tmp/seed" // the compiled seed, on the sandbox's tmpfs
)

// Limits of the commands the demo runs.
const (
	buildTimeout   = 5 * time.Minute  // enough for a cold cache
	warmTimeout    = 10 * time.Minute // the first build, on a slow machine
	runTimeout     = 10 * time.Second
	runawayTimeout = 2 * time.Second
	runawayCap     = 4 << 10 // bytes of the runaway's output kept, per stream
)

// demo is what every sandbox of the demo shares.
type demo struct {
	image     string     // the sandbox image
	url       string     // the Podman service; "" lets vm.New find one
	goroot    string     // the host's Go toolchain
	goversion string     // its version, e.g. go1.25.1
	toolchain []vm.Mount // goroot and what its links lead to, read-only
	seed      string     // the Go program, mounted at srcDir
	cache     string     // the demo's own build cache, mounted at cacheDir
	greet     string     // the seed built from a snapshot, beside seed (snapshot.go)
	proxy     string     // a Go module proxy in files, serving what greet needs
	listener  *listener  // a port open on the host that sandboxes must not reach
}

// config describes the sandbox. Network is left empty: no network,
// loopback only, is the default.
func (d *demo) config() vm.Config {
	return vm.Config{
		Image: d.image,
		Pull:  vm.PullNever, // a local image: fail fast if it is missing
		Mounts: append([]vm.Mount{
			{Source: d.seed, Target: srcDir, ReadOnly: true},
			// Read-write: what runs in the sandbox can write to this cache,
			// so it is the demo's own, never the user's ~/.cache/go-build.
			{Source: d.cache, Target: cacheDir},
		}, d.toolchain...),
		Workdir:        srcDir,
		ReadOnlyRootfs: true, // writable: /tmp, and the cache
		Memory:         1 << 30,
		// Every command sees these, and nothing of the host's environment.
		Env: []string{
			"HOME=/tmp",
			"GOCACHE=" + cacheDir,
			"CGO_ENABLED=0",           // no C compiler in the sandbox
			"GOTOOLCHAIN=local",       // never download another toolchain
			"GOPROXY=off",             // nor modules
			"GOFLAGS=-buildvcs=false", // the seed is not a git checkout
		},
	}
}

// toolchainMounts mounts the Go toolchain read-only at its host path, and
// with it what its links lead to outside it: Debian's golang packages link
// GOROOT/src to /usr/share/go-1.xx/src, for one. At the same paths every
// link resolves in the sandbox as on the host, and the linker, whose cache
// keys include GOROOT, sees the same GOROOT on every run.
func toolchainMounts(goroot string) ([]vm.Mount, error) {
	mounts := []vm.Mount{{Source: goroot, Target: goroot, ReadOnly: true}}
	err := filepath.WalkDir(goroot, func(p string, e fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case e.IsDir() && strings.Count(p[len(goroot):], "/") >= 2:
			return filepath.SkipDir // links two levels deep at most, e.g. pkg/include
		case e.Type()&fs.ModeSymlink == 0:
			return nil
		}
		to, err := os.Readlink(p)
		if err != nil {
			return err
		}
		if !filepath.IsAbs(to) {
			to = filepath.Join(filepath.Dir(p), to)
		}
		if r, err := filepath.Rel(goroot, to); err == nil && !strings.HasPrefix(r, "..") {
			return nil // inside GOROOT: mounted already
		}
		mounts = append(mounts, vm.Mount{Source: to, Target: to, ReadOnly: true})
		return nil
	})
	return mounts, err
}

// A step is one thing the demo shows, in a sandbox. It returns what
// happened in a few words, or the promise that was broken.
type step struct {
	name string
	do   func(ctx context.Context, v vm.VM) (string, error)
}

func (d *demo) steps() []step {
	return []step{
		{"create", d.create},
		{"go build", d.build},
		{"run", d.run},
		{"runaway", d.runaway},
		{"ps", d.ps},
		{"network", d.network},
		{"service", d.service},
		{"remove", d.remove},
	}
}

// outcome is how one step went on one backend.
type outcome struct {
	text string
	took time.Duration
	err  error // the broken promise; nil when the step behaved
}

// script runs every step in one sandbox on backend b. After a failed step
// the others are skipped, but the sandbox is always removed.
func (d *demo) script(ctx context.Context, b vm.Backend) ([]outcome, error) {
	v, err := vm.New(ctx, d.config(), vm.WithBackend(b), vm.WithURL(d.url))
	if err != nil {
		return nil, err
	}
	defer cleanup(ctx, v)
	var out []outcome
	failed := false
	for _, s := range d.steps() {
		if failed && s.name != "remove" {
			out = append(out, outcome{text: "skipped"})
			continue
		}
		start := time.Now()
		text, err := s.do(ctx, v)
		out = append(out, outcome{text, time.Since(start), err})
		failed = failed || err != nil
	}
	return out, nil
}

// cleanup removes v with a context of its own: ctx may be what ended the
// demo (Ctrl-C). Remove is idempotent, so this is safe after the remove
// step too.
func cleanup(ctx context.Context, v vm.VM) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := v.Remove(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "demo: removing the sandbox:", err)
	}
}

func (d *demo) create(ctx context.Context, v vm.VM) (string, error) {
	if err := v.Create(ctx); err != nil {
		return "", err
	}
	return "container " + v.ID()[:12], nil
}

func (d *demo) build(ctx context.Context, v vm.VM) (string, error) {
	n, err := d.compile(ctx, v, buildTimeout)
	if err != nil {
		return "", err
	}
	switch n {
	case 0:
		return "ok, everything from the cache", nil
	case 1:
		return "ok, 1 package compiled", nil
	}
	return fmt.Sprintf("ok, %d packages compiled", n), nil
}

// compile builds the seed to binary and returns how many packages the go
// command compiled (-v lists them; none when the cache is warm).
func (d *demo) compile(ctx context.Context, v vm.VM, timeout time.Duration) (int, error) {
	res, err := v.Run(ctx, exec.Command{
		Name:           filepath.Join(d.goroot, "bin", "go"),
		Args:           []string{"build", "-v", "-o", binary, "."},
		Timeout:        timeout,
		MaxOutputBytes: 64 << 10,
	})
	if err != nil {
		return 0, err
	}
	if res.ExitCode != 0 {
		return 0, fmt.Errorf("go build: exit %d:\n%s", res.ExitCode, res.StderrTail(20))
	}
	return len(strings.Fields(res.Stderr)), nil
}

func (d *demo) run(ctx context.Context, v vm.VM) (string, error) {
	res, err := v.Run(ctx, exec.Command{Name: binary, Timeout: runTimeout})
	switch {
	case err != nil:
		return "", err
	case res.ExitCode != 0 || !strings.HasPrefix(res.Stdout, "hello from "):
		return "", fmt.Errorf("the seed: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	return strings.TrimSpace(res.Stdout), nil
}

// runaway runs a command that would print forever, with a child that
// would sleep forever: the timeout must stop both, keeping the start and
// the end of the output.
func (d *demo) runaway(ctx context.Context, v vm.VM) (string, error) {
	res, err := v.Run(ctx, exec.Command{
		Name:           "sh",
		Args:           []string{"-c", "sleep 600 & yes runaway"},
		Timeout:        runawayTimeout,
		MaxOutputBytes: runawayCap,
	})
	switch {
	case !errors.Is(err, context.DeadlineExceeded) || res == nil || !res.TimedOut:
		return "", fmt.Errorf("want a timeout after %v, got result %+v, error %v", runawayTimeout, res, err)
	case !res.Truncated || !strings.HasPrefix(res.Stdout, "runaway\n") || res.StdoutBytes <= runawayCap:
		return "", fmt.Errorf("want the first and last part of a truncated output, got %d of %d bytes: %.40q", len(res.Stdout), res.StdoutBytes, res.Stdout)
	}
	return fmt.Sprintf("timed out, kept %s of %s", size(len(res.Stdout)), size(int(res.StdoutBytes))), nil
}

// ps lists what runs in the sandbox: nothing of the runaway may be left.
func (d *demo) ps(ctx context.Context, v vm.VM) (string, error) {
	res, err := v.Run(ctx, exec.Command{Name: "ps", Timeout: runTimeout})
	if err != nil {
		return "", err
	}
	var left []string
	for _, line := range strings.Split(res.Stdout, "\n") {
		if strings.Contains(line, "yes runaway") || strings.Contains(line, "sleep 600") {
			left = append(left, strings.TrimSpace(line))
		}
	}
	if res.ExitCode != 0 || len(left) > 0 {
		return "", fmt.Errorf("processes left after the timeout (ps exit %d): %q", res.ExitCode, left)
	}
	return "nothing left of it", nil
}

// network has the seed dial the host's listener; a sandbox without a
// network must fail to connect.
func (d *demo) network(ctx context.Context, v vm.VM) (string, error) {
	before := d.listener.accepted.Load()
	res, err := v.Run(ctx, exec.Command{Name: binary, Args: []string{d.listener.Addr().String()}, Timeout: runTimeout})
	if err != nil {
		return "", err
	}
	msg := strings.TrimSpace(res.Stdout) // "dial tcp 192.0.2.2:41234: connect: network is unreachable"
	switch {
	case strings.HasPrefix(msg, "connected") || d.listener.accepted.Load() != before:
		return "", fmt.Errorf("the sandbox reached the host's listener: %s", msg)
	case res.ExitCode != 0 || !strings.HasPrefix(msg, "dial tcp"):
		return "", fmt.Errorf("the seed: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	return "blocked:" + msg[strings.LastIndex(msg, ":")+1:], nil
}

// service starts a web server in the sandbox, which has no network, and
// fetches a page from it on the host, through a forward on the host's
// loopback whose connections podvm's agent makes inside the sandbox.
func (d *demo) service(ctx context.Context, v vm.VM) (string, error) {
	const addr = "127.0.0.1:8080"
	page, err := v.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", "mkdir -p /tmp/www && echo served from the sandbox >/tmp/www/index.html"}, Timeout: runTimeout})
	if err != nil || page.ExitCode != 0 {
		return "", fmt.Errorf("writing the page: %v %s", err, page.StderrTail(3))
	}
	srv, err := vm.Start(ctx, v, exec.Command{Name: "httpd", Args: []string{"-f", "-p", addr, "-h", "/tmp/www"}})
	if err != nil {
		return "", err
	}
	defer srv.Kill()
	wctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	if err := vm.WaitListening(wctx, v, "tcp", addr); err != nil {
		return "", err
	}
	fwd, err := vm.Forward(ctx, v, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer fwd.Close()
	req, err := http.NewRequestWithContext(wctx, http.MethodGet, "http://"+fwd.Addr().String()+"/", nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || strings.TrimSpace(string(body)) != "served from the sandbox" {
		return "", fmt.Errorf("the page through the forward: %q, %v", body, err)
	}
	return "httpd reached via " + fwd.Addr().String(), nil
}

func (d *demo) remove(ctx context.Context, v vm.VM) (string, error) {
	if err := v.Remove(ctx); err != nil {
		return "", err
	}
	return "ok", nil
}

// warm fills the demo's build cache with a first build of the seed in a
// sandbox, unless a stamp in the cache says it is warm for this toolchain.
func (d *demo) warm(ctx context.Context, w io.Writer) error {
	stamp := filepath.Join(d.cache, "podvm-demo-warm")
	key := d.goroot + " " + d.goversion + "\n"
	if b, err := os.ReadFile(stamp); err == nil && string(b) == key {
		fmt.Fprintf(w, "demo: the build cache %s is warm\n", rel(d.cache))
		return nil
	}
	fmt.Fprintf(w, "demo: warming the build cache %s: a first build of the seed in a sandbox\n"+
		"      compiles Go's standard library (up to a minute or two; once per Go version)\n", rel(d.cache))
	start := time.Now()
	v, err := vm.New(ctx, d.config(), vm.WithURL(d.url))
	if err != nil {
		return err
	}
	defer cleanup(ctx, v)
	if err := v.Create(ctx); err != nil {
		return err
	}
	n, err := d.compile(ctx, v, warmTimeout)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "demo: compiled %d packages in %.0fs\n", n, time.Since(start).Seconds())
	return os.WriteFile(stamp, []byte(key), 0o644)
}

// listener is a TCP port open on the host, on its first non-loopback
// address (in a sandbox, 127.0.0.1 is the sandbox's own loopback). It
// counts the connections it accepts.
type listener struct {
	net.Listener
	accepted atomic.Int64
}

// listen opens the listener and checks that the host itself can connect,
// so that a sandbox failing to is the sandbox's doing.
func listen() (*listener, error) {
	nl, err := net.Listen("tcp", net.JoinHostPort(hostIP(), "0"))
	if err != nil {
		return nil, err
	}
	l := &listener{Listener: nl}
	go l.serve()
	c, err := net.DialTimeout("tcp", l.Addr().String(), 2*time.Second)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("the host cannot reach its own listener: %w", err)
	}
	defer c.Close()
	_, err = io.ReadAll(c) // until serve closes it, having counted it
	return l, err
}

// serve counts and closes each connection, until the listener is closed.
func (l *listener) serve() {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		l.accepted.Add(1)
		c.Close()
	}
}

// hostIP returns the host's first non-loopback IPv4 address, else 127.0.0.1.
func hostIP() string {
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil {
			return n.IP.String()
		}
	}
	return "127.0.0.1"
}

// size formats n bytes for people.
func size(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
