package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// The snapshot comparison, per backend (through the agent): the time to
// a first result in a fresh sandbox started from a snapshot of a
// prepared one, against one that does the preparation itself, and
// against a fresh sandbox of the bare image that needs none (the cost of
// the sandbox alone); then the snapshot itself (vm.TakeSnapshot) against
// `podman commit --pause=false` of the same container.

// The preparation: files written into the sandbox's own filesystem, a
// module cache's worth of them, and the first result, which needs them.
const (
	prepFiles, prepFileBytes = 400, 64 << 10 // 25 MiB
	prepDir                  = "/var/prep"
)

var (
	prepareArgv = []string{"sh", "-c", fmt.Sprintf(`mkdir -p %[1]s && i=0 && while [ $i -lt %[2]d ]; do head -c %[3]d /dev/urandom > %[1]s/f$i; i=$((i+1)); done`,
		prepDir, prepFiles, prepFileBytes)}
	firstResultArgv = []string{"sh", "-c", fmt.Sprintf(`ls %s | wc -l`, prepDir)}
	// The bare image's first result: the same command, on nothing.
	bareResultArgv = []string{"sh", "-c", `ls / | wc -l`}
)

// snapshotResult is one backend's snapshot measurements.
type snapshotResult struct {
	name                 string
	skip                 string
	fromSnap, prep, bare *series // fresh sandbox to a first result
	take, commit         *series // the snapshot; `podman commit` of the same container
}

// Names of the rows.
const (
	nameFromSnap = "from the snapshot"
	namePrepared = "from the bare image, preparing"
	nameBare     = "from the bare image, nothing to prepare"
	nameTake     = "vm.TakeSnapshot"
	nameCommit   = "`podman commit --pause=false` (a process)"
)

func (b *bench) snapshots(ctx context.Context) error {
	for _, be := range backends[:2] { // through the agent
		if why, bad := b.vmErr[be.name]; bad {
			b.snaps = append(b.snaps, snapshotResult{name: be.name, skip: why})
			continue
		}
		progress("snapshot: %s: preparing", be.name)
		r, err := b.snapshotBackend(ctx, be)
		if err != nil {
			return err
		}
		b.snaps = append(b.snaps, r)
	}
	progress("")
	return nil
}

// snapshotBackend prepares a sandbox of be, snapshots it, and measures.
// Every image it makes is removed before it returns.
func (b *bench) snapshotBackend(ctx context.Context, be backend) (snapshotResult, error) {
	r := snapshotResult{name: be.name}
	src, err := be.new(ctx, b.p.url, b.cfg)
	if err != nil {
		return r, err
	}
	defer func() {
		rctx, cancel := removeContext(ctx)
		defer cancel()
		_ = src.Remove(rctx)
	}()
	if err := src.Create(ctx); err != nil {
		return r, err
	}
	if err := vmRunOK(ctx, src, prepareArgv, ""); err != nil {
		return r, fmt.Errorf("preparing: %w", err)
	}
	// Every image this comparison makes, removed at the end.
	var mu sync.Mutex
	var made []string
	keep := func(ref string) {
		mu.Lock()
		made = append(made, ref)
		mu.Unlock()
	}
	defer func() {
		rctx, cancel := removeContext(ctx)
		defer cancel()
		for _, ref := range made {
			if err := vm.RemoveSnapshot(rctx, src, ref); err != nil && !errors.Is(err, vm.ErrImageNotFound) {
				_, err = b.p.output(rctx, "rmi", ref) // a `podman commit`'s
				if err != nil {
					fmt.Fprintln(os.Stderr, "bench: removing", ref, err)
				}
			}
		}
	}()
	snap, err := vm.TakeSnapshot(ctx, src, vm.SnapshotOptions{Labels: map[string]string{labelRun: b.p.labels[labelRun]}})
	if err != nil {
		return r, fmt.Errorf("snapshot: %w", err)
	}
	keep(snap.Image)

	want := fmt.Sprintf("%d\n", prepFiles)
	fromSnap := b.cfg
	fromSnap.Image = snap.Image
	alts := []alt{
		{name: nameFromSnap, op: firstResult(be, b.p.url, fromSnap, nil, want)},
		{name: namePrepared, op: firstResult(be, b.p.url, b.cfg, prepareArgv, want)},
		{name: nameBare, op: firstResult(be, b.p.url, b.cfg, nil, "")},
	}
	res, err := measure(ctx, "snapshot: "+be.name+": first result", alts, 1, b.sz.lifecycle, b.sz.budget)
	if err != nil {
		return r, err
	}
	r.fromSnap, r.prep, r.bare = res[0], res[1], res[2]

	take := alt{name: nameTake, op: func(ctx context.Context) error {
		s, err := vm.TakeSnapshot(ctx, src, vm.SnapshotOptions{Labels: map[string]string{labelRun: b.p.labels[labelRun]}})
		if err == nil {
			keep(s.Image)
		}
		return err
	}}
	n := 0
	commit := alt{name: nameCommit, op: func(ctx context.Context) error {
		n++
		ref := fmt.Sprintf("localhost/podvm-bench-commit:%s-%d", b.p.labels[labelRun], n)
		_, err := b.p.output(ctx, "commit", "--pause=false", "-q", "--change", "LABEL "+labelRun+"="+b.p.labels[labelRun], src.ID(), ref)
		if err == nil {
			keep(ref)
		}
		return err
	}}
	res, err = measure(ctx, "snapshot: "+be.name+": commit", []alt{take, commit}, 1, b.sz.lifecycle, b.sz.budget)
	if err != nil {
		return r, err
	}
	r.take, r.commit = res[0], res[1]
	return r, nil
}

// firstResult creates a sandbox of cfg on be, runs prepare (when set)
// and the first result, checks it (when want is set) and removes the
// sandbox.
func firstResult(be backend, host string, cfg vm.Config, prepare []string, want string) op {
	return func(ctx context.Context) error {
		v, err := be.new(ctx, host, cfg)
		if err != nil {
			return err
		}
		err = v.Create(ctx)
		if err == nil && prepare != nil {
			err = vmRunOK(ctx, v, prepare, "")
		}
		if err == nil {
			argv := firstResultArgv
			if want == "" {
				argv = bareResultArgv
			}
			err = vmRunOK(ctx, v, argv, want)
		}
		rctx, cancel := removeContext(ctx)
		defer cancel()
		return errors.Join(err, v.Remove(rctx))
	}
}

// vmRunOK runs argv in v and fails unless it exits 0 and, when want is
// set, prints want.
func vmRunOK(ctx context.Context, v vm.VM, argv []string, want string) error {
	res, err := v.Run(ctx, exec.Command{Name: argv[0], Args: argv[1:]})
	switch {
	case err != nil:
		return err
	case res.ExitCode != 0:
		return fmt.Errorf("%s exited %d: %s", argv[0], res.ExitCode, res.StderrTail(5))
	case want != "" && strings.TrimSpace(res.Stdout) != strings.TrimSpace(want):
		return fmt.Errorf("%s printed %q, want %q", argv[0], res.Stdout, want)
	}
	return nil
}

// The targets: from a snapshot no slower than from the bare image, and
// the snapshot no slower than `podman commit`.
const (
	fromSnapTarget = 1.1
	takeTarget     = 1.0
)

func (b *bench) reportSnapshots(w io.Writer) {
	if len(b.snaps) == 0 {
		return
	}
	var all []*series
	for _, r := range b.snaps {
		if r.skip == "" {
			all = append(all, r.fromSnap, r.prep, r.bare, r.take, r.commit)
		}
	}
	fmt.Fprintf(w, "\n**Snapshots, first result**: a fresh sandbox (create, start, the first command, remove) from a snapshot of a sandbox prepared with %d files of %s written into its own filesystem (%s), against one that does the preparation itself, and against the bare image with nothing to prepare; %s\n\n",
		prepFiles, fmt.Sprintf("%d KiB", prepFileBytes>>10), mib(prepFiles*prepFileBytes), runs(all))
	fmt.Fprintln(w, "| how | from the snapshot p50 | preparing p50 | bare image p50 | snapshot vs preparing | snapshot vs bare image | failures |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|---|")
	for _, r := range b.snaps {
		if r.skip != "" {
			fmt.Fprintf(w, "| %s | %s | | | | | |\n", r.name, r.skip)
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", r.name, ms(r.fromSnap.p50()), ms(r.prep.p50()), ms(r.bare.p50()),
			ratio(float64(r.fromSnap.p50()), float64(r.prep.p50())), ratio(float64(r.fromSnap.p50()), float64(r.bare.p50())),
			snapFailures(r.fromSnap, r.prep, r.bare))
	}
	fmt.Fprintf(w, "\n**Snapshots, taking one** of the prepared sandbox while it runs: `vm.TakeSnapshot` against `podman commit --pause=false` of the same container (each commit leaves an image, removed at the end)\n\n")
	fmt.Fprintln(w, "| how | vm.TakeSnapshot p50 | p90 | `podman commit` p50 | p90 | vs `podman commit` | failures |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|---|")
	for _, r := range b.snaps {
		if r.skip != "" {
			continue
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s |\n", r.name, ms(r.take.p50()), ms(r.take.p90()), ms(r.commit.p50()), ms(r.commit.p90()),
			ratio(float64(r.take.p50()), float64(r.commit.p50())), snapFailures(r.take, r.commit))
	}
	fmt.Fprintln(w, "\n**Snapshot targets**\n\n| target | measured | result |\n|---|---|---|")
	for _, r := range b.snaps {
		short := strings.TrimPrefix(r.name, "podvm ")
		for _, t := range []struct {
			what  string
			x, y  *series
			limit float64
			bound string
		}{
			{fmt.Sprintf("%s: first result from a snapshot p50 ≤ %.1f× from the bare image's", short, fromSnapTarget), r.fromSnap, r.bare, fromSnapTarget,
				"the snapshot's layer is one more for the service to mount at create"},
			{fmt.Sprintf("%s: vm.TakeSnapshot p50 ≤ %.1f× `podman commit`'s", short, takeTarget), r.take, r.commit, takeTarget,
				"bounded by the service's commit: both send it the same request (APIVM itself, `podman --url` for the CLI), which copies the container's layer; podvm adds no call to a snapshot it names"},
		} {
			switch {
			case r.skip != "" || !t.x.ok() || !t.y.ok():
				fmt.Fprintf(w, "| %s | not measured | – |\n", t.what)
				continue
			}
			q := float64(t.x.p50()) / float64(t.y.p50())
			res := "pass"
			if q > t.limit {
				res = "**miss**, " + t.bound
			}
			fmt.Fprintf(w, "| %s | %.2f× (%s vs %s) | %s |\n", t.what, q, ms(t.x.p50()), ms(t.y.p50()), res)
		}
	}
}

func snapFailures(ss ...*series) string {
	var fails []string
	for _, s := range ss {
		if s.fails > 0 {
			fails = append(fails, s.name+": "+failures(s))
		}
	}
	return orNone(strings.Join(fails, "; "))
}

// removeImages removes the images of this run that are left (a run
// stopped midway): snapshots and commits carry the run's label.
func (b *bench) removeImages(ctx context.Context) error {
	ids, err := b.p.output(ctx, "images", "-q", "--no-trunc", "--filter", "label="+labelRun+"="+b.p.labels[labelRun])
	if err != nil || strings.TrimSpace(ids) == "" {
		return err
	}
	_, err = b.p.output(ctx, append([]string{"rmi", "-f"}, strings.Fields(ids)...)...)
	return err
}
