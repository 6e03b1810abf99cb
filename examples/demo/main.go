// Command demo shows what podvm is for. Through each of podvm's two
// backends it creates a sandbox with no network, compiles a small Go
// program in it with the host's Go toolchain, runs it, lets a runaway
// command hit its timeout and output cap, checks that nothing of the
// runaway survived, shows that the sandbox cannot reach a port the host
// has open, and serves a page from a web server in the sandbox (which
// has no network) to the host, through podvm's agent. It prints the
// results side by side. Then it prepares a
// sandbox for a second seed once (its module fetched, its packages
// compiled, in the sandbox's own filesystem), snapshots it, and compiles
// and runs the seed in three fresh sandboxes started from the snapshot,
// with nothing left to fetch or compile. Then, where the service can
// checkpoint a running sandbox (vm.CheckpointSupport; it says why not
// where it cannot, and goes on), it forks a warm process: a process that
// warmed up is checkpointed and restored into three fresh sandboxes,
// each copy answering from the warm state with the original's memory. It
// removes everything (also on Ctrl-C), and exits 1 when something did
// not behave as promised, so it doubles as a smoke test.
//
// `make demo` starts Podman and warms the demo's Go build cache first. By
// hand, from the repository's root:
//
//	eval "$(scripts/podman-up.sh)"
//	go run ./examples/demo -warm   # once per Go version: fill the build cache
//	go run ./examples/demo
//
// The fork part alone, against another service (say the Podman 5.4 one
// of `make podman5`, whose CRIU can checkpoint):
//
//	go run ./examples/demo -forks -url unix://$PWD/.podvm/podman5/podman.sock
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, w io.Writer) error {
	flags := flag.NewFlagSet("demo", flag.ContinueOnError)
	var (
		warmOnly = flags.Bool("warm", false, "only fill the build cache (a first sandbox build of the seed), then exit")
		forkOnly = flags.Bool("forks", false, "only fork a warm process: checkpoint it and restore it into fresh sandboxes, where the service can")
		seed     = flags.String("seed", "testdata/seeds/hello", "the Go program to compile")
		cache    = flags.String("cache", ".podvm/demo-gocache", "the demo's own Go build cache (never your ~/.cache/go-build)")
		image    = flags.String("image", envOr("PODVM_TEST_IMAGE", "localhost/podvm-test:latest"), "the sandbox image")
		url      = flags.String("url", os.Getenv("CONTAINER_HOST"), "the Podman service; empty: let vm.New find one")
	)
	if err := flags.Parse(args); err != nil {
		return err
	}
	d, err := newDemo(ctx, *image, *url, *seed, *cache)
	if err != nil {
		return err
	}
	if *warmOnly {
		return d.warm(ctx, w)
	}
	if *forkOnly {
		return d.showForks(ctx, w)
	}
	return d.show(ctx, w)
}

// newDemo asks the host's go command where its toolchain is, through
// podvm's host executor: the same exec.Command a sandbox runs.
func newDemo(ctx context.Context, image, url, seed, cache string) (*demo, error) {
	res, err := exec.NewCommandExecutor().Run(ctx, exec.Command{
		Name:    "go",
		Args:    []string{"env", "GOROOT", "GOVERSION"},
		Timeout: 10 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("go env: %w", err)
	}
	lines := strings.Fields(res.Stdout)
	if res.ExitCode != 0 || len(lines) != 2 {
		return nil, fmt.Errorf("go env: exit %d: %s", res.ExitCode, res.StderrTail(5))
	}
	d := &demo{image: image, url: url, goroot: lines[0], goversion: lines[1]}
	if d.toolchain, err = toolchainMounts(d.goroot); err != nil {
		return nil, err
	}
	if d.seed, err = filepath.Abs(seed); err != nil {
		return nil, err
	}
	// Beside the seed: testdata/seeds/greet and testdata/goproxy.
	d.greet = filepath.Join(filepath.Dir(d.seed), "greet")
	d.proxy = filepath.Join(filepath.Dir(filepath.Dir(d.seed)), "goproxy")
	if d.cache, err = filepath.Abs(cache); err != nil {
		return nil, err
	}
	return d, os.MkdirAll(d.cache, 0o755)
}

// show runs the script on both backends and prints them side by side.
func (d *demo) show(ctx context.Context, w io.Writer) error {
	start := time.Now()
	l, err := listen()
	if err != nil {
		return err
	}
	defer l.Close()
	d.listener = l

	fmt.Fprintf(w, "podvm demo: a Go program compiled and run in a sandbox, through both backends\n\n")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "  service\t%s\n", or(d.url, "(found by vm.New)"))
	fmt.Fprintf(tw, "  image\t%s, no network, read-only root, 1 GiB\n", d.image)
	fmt.Fprintf(tw, "  go\t%s in %s\n", d.goversion, d.goroot)
	label := "mounts"
	for _, m := range d.config().Mounts {
		target, mode := m.Target, "read-write"
		if target == m.Source {
			target = "the same path"
		}
		if m.ReadOnly {
			mode = "read-only"
		}
		fmt.Fprintf(tw, "  %s\t%s -> %s, %s\n", label, rel(m.Source), target, mode)
		label = ""
	}
	fmt.Fprintf(tw, "  listener\t%s, open on the host\n\n", l.Addr())
	tw.Flush()

	backends := []vm.Backend{vm.BackendAPI, vm.BackendCLI}
	var results [][]outcome
	for _, b := range backends {
		out, err := d.script(ctx, b)
		if ctx.Err() != nil {
			return errors.New("interrupted; its sandboxes were removed")
		}
		if err != nil {
			return fmt.Errorf("%s backend: %w", b, err)
		}
		results = append(results, out)
	}

	tw = tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	fmt.Fprintf(tw, "\t%s\t\t%s\n", backends[0], backends[1])
	totals := make([]time.Duration, len(backends))
	var failures []string
	for i, s := range d.steps() {
		fmt.Fprint(tw, s.name)
		for j, out := range results {
			o := out[i]
			text := o.text
			if o.err != nil {
				text = "FAILED"
				failures = append(failures, fmt.Sprintf("%s %s: %v", backends[j], s.name, o.err))
			}
			totals[j] += o.took
			fmt.Fprintf(tw, "\t%s\t%6.2fs", text, o.took.Seconds())
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprint(tw, "total")
	for _, t := range totals {
		fmt.Fprintf(tw, "\t\t%6.2fs", t.Seconds())
	}
	fmt.Fprintln(tw)
	tw.Flush()

	failures = append(failures, d.snapshots(ctx, w)...)
	failures = append(failures, d.forks(ctx, w)...)
	if ctx.Err() != nil {
		return errors.New("interrupted; its sandboxes were removed")
	}
	if len(failures) > 0 {
		fmt.Fprintf(w, "\n%s\n", strings.Join(failures, "\n"))
		return errors.New("some promises were broken")
	}
	fmt.Fprintf(w, "\nevery step behaved as promised; nothing is left behind (%.1fs)\n", time.Since(start).Seconds())
	return nil
}

func envOr(key, def string) string { return or(os.Getenv(key), def) }

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// rel shortens path to one relative to the working directory when it is
// inside it.
func rel(path string) string {
	wd, _ := os.Getwd()
	if r, err := filepath.Rel(wd, path); err == nil && !strings.HasPrefix(r, "..") {
		return r
	}
	return path
}
