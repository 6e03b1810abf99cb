package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// The snapshot part of the demo: the greet seed's sandbox is prepared
// once (its module fetched, its packages compiled, into the sandbox's own
// caches, in its own filesystem), snapshotted, and fresh sandboxes
// started from the snapshot compile and run the seed with nothing to
// fetch or compile: no network, GOPROXY=off, no cache mounted from the
// host.
const (
	freshOnes = 3 // sandboxes started from the snapshot
	// The caches, in the sandbox's own filesystem: what the snapshot holds.
	sandboxCache    = "/var/cache/go-build"
	sandboxModCache = "/var/cache/gomod"
)

// snapshotConfig is a sandbox for the greet seed whose caches are in its
// own filesystem (the root is writable). The sandbox that prepares them
// also mounts the host's warm build cache and the file proxy, read-only.
func (d *demo) snapshotConfig(image string, prepare bool) vm.Config {
	c := vm.Config{
		Image:   image,
		Pull:    vm.PullNever,
		Mounts:  append([]vm.Mount{{Source: d.greet, Target: srcDir, ReadOnly: true}}, d.toolchain...),
		Workdir: srcDir,
		Memory:  1 << 30,
		Env: []string{
			"HOME=/tmp",
			"GOCACHE=" + sandboxCache,
			"GOMODCACHE=" + sandboxModCache,
			"CGO_ENABLED=0",
			"GOTOOLCHAIN=local",
			"GOPROXY=off",
			"GOFLAGS=-buildvcs=false",
		},
	}
	if prepare {
		c.Mounts = append(c.Mounts,
			vm.Mount{Source: d.cache, Target: cacheDir, ReadOnly: true},
			vm.Mount{Source: d.proxy, Target: "/goproxy", ReadOnly: true})
	}
	return c
}

// snapshots prepares the greet seed's sandbox, snapshots it and starts
// fresh sandboxes from the snapshot, printing a line a step. It removes
// everything it made, and returns the promises that were broken.
func (d *demo) snapshots(ctx context.Context, w io.Writer) (failures []string) {
	fmt.Fprintf(w, "\nsnapshots: the greet seed's sandbox prepared once, %d fresh sandboxes started from its snapshot\n\n", freshOnes)
	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	defer tw.Flush()
	line := func(name string, start time.Time, text string, err error) bool {
		if err != nil {
			text = "FAILED"
			failures = append(failures, fmt.Sprintf("snapshot %s: %v", name, err))
		}
		fmt.Fprintf(tw, "  %s\t%s\t%6.2fs\n", name, text, time.Since(start).Seconds())
		return err == nil
	}

	start := time.Now()
	src, err := vm.New(ctx, d.snapshotConfig(d.image, true), vm.WithURL(d.url))
	if err == nil {
		defer cleanup(ctx, src)
		err = src.Create(ctx)
	}
	var text string
	if err == nil {
		text, err = d.prepare(ctx, src)
	}
	prepared := time.Since(start)
	if !line("prepare", start, text, err) {
		return failures
	}

	start = time.Now()
	snap, err := vm.TakeSnapshot(ctx, src, vm.SnapshotOptions{})
	if err == nil {
		defer removeSnapshot(ctx, src, snap)
		text = fmt.Sprintf("%s, taken from the running sandbox", snap.Image)
		// It ran on while the snapshot was taken, and still does.
		var res *exec.Result
		if res, err = src.Run(ctx, exec.Command{Name: "true"}); err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("the source sandbox after the snapshot: exit %d", res.ExitCode)
		}
	}
	if !line("snapshot", start, text, err) {
		return failures
	}

	var slowest time.Duration
	for i := 1; i <= freshOnes; i++ {
		start = time.Now()
		text, err := d.fresh(ctx, snap, i)
		slowest = max(slowest, time.Since(start))
		if !line(fmt.Sprintf("fresh %d", i), start, text, err) {
			return failures
		}
	}
	fmt.Fprintf(tw, "  \teach fresh sandbox: created, built, run and removed in at most %.2fs; preparing one took %.2fs\n", slowest.Seconds(), prepared.Seconds())
	return failures
}

// prepare warms the caches in the sandbox's own filesystem: the host's
// warm build cache copied in (Go's standard library, compiled once by
// `demo -warm`), the seed's module fetched from the file proxy, and the
// seed built.
func (d *demo) prepare(ctx context.Context, v vm.VM) (string, error) {
	for _, c := range []exec.Command{
		{Name: "mkdir", Args: []string{"-p", sandboxCache}},
		{Name: "cp", Args: []string{"-a", cacheDir + "/.", sandboxCache}},
		{Name: filepath.Join(d.goroot, "bin", "go"), Args: []string{"mod", "download"}, Env: []string{"GOPROXY=file:///goproxy"}},
	} {
		c.Timeout, c.MaxOutputBytes = buildTimeout, 64<<10
		res, err := v.Run(ctx, c)
		if err != nil {
			return "", err
		}
		if res.ExitCode != 0 {
			return "", fmt.Errorf("%s: exit %d:\n%s", c.Name, res.ExitCode, res.StderrTail(20))
		}
	}
	n, err := d.compile(ctx, v, buildTimeout)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("in the sandbox's own caches: std copied in, example.com/greeting fetched, %d packages compiled", n), nil
}

// fresh starts the i-th sandbox from snap, with no proxy and no cache
// from the host, builds the seed and runs it.
func (d *demo) fresh(ctx context.Context, snap *vm.Snapshot, i int) (string, error) {
	v, err := vm.New(ctx, d.snapshotConfig(snap.Image, false), vm.WithURL(d.url))
	if err != nil {
		return "", err
	}
	defer cleanup(ctx, v)
	if err := v.Create(ctx); err != nil {
		return "", err
	}
	n, err := d.compile(ctx, v, buildTimeout)
	if err != nil {
		return "", err
	}
	if n != 0 {
		return "", fmt.Errorf("go build compiled %d packages; the snapshot's cache should have held them all", n)
	}
	name := fmt.Sprintf("sandbox %d", i)
	res, err := v.Run(ctx, exec.Command{Name: binary, Args: []string{name}, Timeout: runTimeout})
	switch {
	case err != nil:
		return "", err
	case res.ExitCode != 0 || strings.TrimSpace(res.Stdout) != "hello, "+name:
		return "", fmt.Errorf("the seed: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
	}
	if err := v.Remove(ctx); err != nil {
		return "", err
	}
	return "go build: everything from the snapshot; run: " + strings.TrimSpace(res.Stdout), nil
}

// removeSnapshot removes snap with a context of its own, once the
// sandboxes made from it are gone.
func removeSnapshot(ctx context.Context, v vm.VM, snap *vm.Snapshot) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := vm.RemoveSnapshot(ctx, v, snap.Image); err != nil {
		fmt.Fprintln(os.Stderr, "demo: removing the snapshot:", err)
	}
}
