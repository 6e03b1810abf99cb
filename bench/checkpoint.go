package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containers/podman/v5/pkg/bindings/containers"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/ckpt"
	"github.com/podvm/podvm/vm"
)

// The checkpoint comparison, on APIVM through the agent (the backend a
// checkpoint is for; CLIVM's checkpoint is the same service call made
// by a podman process), where the service can checkpoint at all (CRIU
// that works: the Podman 5.4 rig of scripts/podman5-up.sh; skipped,
// saying why, where vm.CheckpointSupport refuses):
//
//  1. a warm process: a sandbox whose process takes about 2 s to load a
//     table of about 200 MiB (see warmCommand), cold (create, vm.Start,
//     the warm-up, its first answer) against vm.Restore of a checkpoint
//     of the warm sandbox and the first answer of the process the copy
//     adopted, and then, alone, a Get from a filled vm.NewRestorePool of
//     the same checkpoint to the same answer (the restores done ahead);
//  2. a small sandbox (the agent alone): vm.Restore to the first Run of
//     `true`, against a cold Create to the same;
//
//     with, in both, the bindings' containers.Restore of the same
//     archive (the service's import alone, which every copy waits for)
//     and the archive rewrite vm.Restore adds, timed alone;
//  3. taking a checkpoint of the small and of the warm sandbox:
//     vm.TakeCheckpoint against `podman container checkpoint --export`
//     and against the bindings' containers.Checkpoint of the same
//     container, with the archive check TakeCheckpoint adds timed alone;
//  4. forking the small sandbox: 8 copies at once from one checkpoint,
//     with 8 concurrent vm.Restore calls, against 8 concurrent `podman
//     container restore --import --name` and bindings' Restore calls of
//     the same archive. (Not the warm one: 8 copies of 200 MiB take 15
//     to 20 s a round on two cores, for every way alike.)
//
// Podman's own ways work on the podvm sandbox's container and its
// archive: a container of `podman run --init` cannot be restored by
// CRIU 4.1 (Podman's init is a bind mount it cannot remount). Podman
// refuses --name with --tcp-established, so its restores go without it
// (vm.Restore renames in the archive instead, and keeps it).
//
// The comparisons of the warm sandbox have no warm-up round: the small
// one's have warmed the same paths, and each round takes seconds.
//
// Every checkpoint and archive is written in a directory of the run's
// under vm.DefaultCheckpointDir (mode 0700; vm refuses the temporary
// directory), removed at the section's end with every container it made.

// The warm process, the issue's "about 2 s and about 200 MiB to warm
// up": busybox awk loads a table of warmEntries strings of warmPad+1..7
// bytes (about 200 MiB resident), summing a remainder for each (loading
// alone took 1.1 to 1.3 s here), says "ready", then answers each key it
// reads with the length of the table's entry: 65 for key 5, 0 were the
// table gone.
const (
	warmEntries = 1_200_000
	warmPad     = 64
	warmKey     = "5\n"
	warmAnswer  = "65"
)

var warmCommand = exec.Command{Name: "awk", Args: []string{fmt.Sprintf(
	`BEGIN { pad = sprintf("%%0%dd", 0); for (i = 0; i < %d; i++) { t[i] = i pad; w += i %% 7 } print "ready"; fflush() } { print length(t[$1 + 0]); fflush() }`,
	warmPad, warmEntries)}}

// forkCopies is how many copies a fork makes at once.
const forkCopies = 8

// The targets.
const (
	warmRestoreTarget  = 0.25                   // restore to the first answer, against cold start and warm-up
	smallRestoreTarget = 300 * time.Millisecond // restore of the agent alone to its first Run
	ckptTakeTarget     = 1.05                   // vm.TakeCheckpoint against `podman container checkpoint --export`
	e2bResume          = "E2B's resume of a paused sandbox, \"about 1 second\" (e2b.dev/docs/sandbox/persistence)"
)

// Names of the rows.
const (
	nameCkptCold       = "cold: Create, vm.Start, warm-up, first answer"
	nameCkptWarm       = "vm.Restore of the warm checkpoint, the adopted process's first answer"
	nameCkptPool       = "vm.NewRestorePool of the warm checkpoint, filled (its restores done ahead, untimed): Get, the adopted process's first answer"
	nameCkptSmallRest  = "vm.Restore, then Run `true`"
	nameCkptSmallCold  = "cold: Create, then Run `true`"
	nameCkptImport     = "bindings: containers.Restore of the same archive with ImportArchive and Name (the service's import alone, no answer)"
	nameCkptTake       = "vm.TakeCheckpoint"
	nameCkptCLI        = "`podman container checkpoint --export F --leave-running --tcp-established --file-locks --compress=none` (a process)"
	nameCkptBindings   = "bindings: containers.Checkpoint with Export, LeaveRunning, TCPEstablished, FileLocks"
	nameCkptInspect    = "the archive check alone: ckpt.Inspect reading the archive, as TakeCheckpoint does"
	nameCkptFork       = "8 concurrent vm.Restore"
	nameCkptForkCLI    = "8 concurrent `podman container restore --import F --name N` (processes)"
	nameCkptForkBind   = "bindings: 8 concurrent containers.Restore with ImportArchive and Name"
	nameCkptRewrite    = "the archive rewrite alone: ckpt.Rewrite of the archive to a spool file, as vm.Restore does for each copy on the CLI backend (the API backend streams it into the import)"
	ckptCallTimeout    = 2 * time.Minute  // one operation of the section
	ckptComparisonTime = 15 * time.Second // a comparison's budget, at most
	ckptPoolSize       = 2                // the restore pool's
)

// ckptResult is the section's measurements, or why it was skipped.
type ckptResult struct {
	skip               string
	loadStart, loadEnd string
	took               time.Duration
	warmRSS            string // the warm process's VmRSS, as its sandbox's /proc says
	smallSize, warmSz  int64  // archive sizes
	cold, warm         *series
	pooled             *series // a Get from a filled restore pool of the warm checkpoint
	warmImport         *series // the bindings' restore of the warm archive
	smallImport        *series // and of the small one
	warmRewrite        *series // podvm's rewrite of the warm archive
	smallRewrite       *series // and of the small one
	coldWarmup         *series // the warm-up alone, in the cold rows
	warmRestore        *series // vm.Restore alone, in the warm rows
	smallRestore       *series
	smallCold          *series
	take               map[string][]*series // "small", "warm": TakeCheckpoint, CLI, bindings, inspect
	fork               []*series            // vm, CLI, bindings
}

// ckptBench is what the section's operations share.
type ckptBench struct {
	b     *bench
	cfg   vm.Config       // the run's, Checkpointable: every sandbox of the section's
	bind  *podmanBindings // one connection, shared
	dir   string          // the run's checkpoint directory
	opts  []vm.Option
	token string
	n     int // a counter for names
	mu    sync.Mutex
}

func (c *ckptBench) name(what string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	return fmt.Sprintf("podvm-bench-%s-%s-%d", what, c.token, c.n)
}

func (b *bench) checkpoints(ctx context.Context) error {
	r := &ckptResult{loadStart: loadAverage(), take: map[string][]*series{}}
	b.ckpt = r
	start := time.Now()
	defer func() { r.loadEnd, r.took = loadAverage(), time.Since(start) }()
	progress("checkpoint: asking whether the service can")
	// Checkpointable: the agent on the container's stdio even where a
	// socket of this machine's would reach it, which no dump can carry.
	cfg := b.cfg
	cfg.Checkpointable = true
	probe, err := vm.NewAPIVM(ctx, b.p.url, cfg)
	if err != nil {
		return err
	}
	err = vm.CheckpointSupport(ctx, probe)
	_ = probe.Remove(ctx) // never created
	switch {
	case errors.Is(err, vm.ErrNotSupported):
		r.skip = "vm.CheckpointSupport: " + whole(err)
		fmt.Fprintln(os.Stderr, "bench: checkpoint: skipped:", r.skip)
		return nil
	case err != nil:
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.skip = "vm.CheckpointSupport failed: " + whole(err)
		fmt.Fprintln(os.Stderr, "bench: checkpoint: skipped:", r.skip)
		return nil
	}

	base, err := vm.DefaultCheckpointDir()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(base, 0o700); err != nil {
		return err
	}
	dir, err := os.MkdirTemp(base, "bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var tok [4]byte
	_, _ = rand.Read(tok[:])
	c := &ckptBench{b: b, cfg: cfg, dir: dir, token: hex.EncodeToString(tok[:]),
		opts: []vm.Option{vm.WithBackend(vm.BackendAPI), vm.WithURL(b.p.url)}}
	if c.bind, err = connectBindings(ctx, b.p.url, b.p.labels); err != nil {
		return err
	}
	defer c.bind.close()
	err = c.run(ctx, r)
	progress("")
	if err != nil && ctx.Err() == nil && r.skip == "" {
		// A failure of the section's own setup: said, and the others go on.
		r.skip = "failed: " + oneLine(err)
		fmt.Fprintln(os.Stderr, "bench: checkpoint:", err)
		return nil
	}
	return err
}

// run measures, in the order of the section's tables' needs: the small
// sandbox first (its checkpoint, its restores), then the warm one.
func (c *ckptBench) run(ctx context.Context, r *ckptResult) error {
	b := c.b
	rounds := func(full, quick int) int {
		if b.quick {
			return quick
		}
		return full
	}
	budget := min(b.sz.budget, ckptComparisonTime)

	// The small sandbox: the agent alone.
	progress("checkpoint: the small sandbox")
	small, err := c.sandbox(ctx)
	if err != nil {
		return err
	}
	defer removeVM(ctx, small)
	smallCP, err := vm.TakeCheckpoint(ctx, small, vm.CheckpointOptions{Dir: c.dir})
	if errors.Is(err, vm.ErrNotSupported) {
		r.skip = "vm.TakeCheckpoint: " + whole(err)
		fmt.Fprintln(os.Stderr, "bench: checkpoint: skipped:", r.skip)
		return nil
	}
	if err != nil {
		return err
	}
	r.smallSize = smallCP.Size
	res, err := measure(ctx, "checkpoint: small sandbox: first result", []alt{
		{name: nameCkptSmallRest, timed: c.restoreRun(smallCP)},
		{name: nameCkptSmallCold, timed: c.coldRun},
		{name: nameCkptImport, timed: c.importOne(smallCP.Path)},
		{name: nameCkptRewrite, timed: c.rewrite(smallCP.Path)},
	}, 1, rounds(8, 3), budget)
	if err != nil {
		return err
	}
	r.smallRestore, r.smallCold, r.smallImport, r.smallRewrite = res[0], res[1], res[2], res[3]
	if r.take["small"], err = c.takes(ctx, "small", small, 1, rounds(6, 3), budget); err != nil {
		return err
	}
	r.fork, err = measure(ctx, "checkpoint: forking 8", []alt{
		{name: nameCkptFork, timed: c.fork(smallCP)},
		{name: nameCkptForkCLI, timed: c.forkCLI(smallCP.Path)},
		{name: nameCkptForkBind, timed: c.forkBindings(smallCP.Path)},
	}, 0, rounds(2, 1), budget)
	if err != nil {
		return err
	}

	// The warm sandbox: its process loaded, its checkpoint taken.
	progress("checkpoint: the warm sandbox: warming up")
	warm, err := c.sandbox(ctx)
	if err != nil {
		return err
	}
	defer removeVM(ctx, warm)
	p, err := vm.Start(ctx, warm, warmCommand)
	if err != nil {
		return err
	}
	if _, err := warmUp(ctx, p); err != nil {
		return err
	}
	if res, err := warm.Run(ctx, exec.Command{Name: "sh", Args: []string{"-c", "grep VmRSS /proc/" + strconv.Itoa(p.PID()) + "/status"}}); err == nil {
		if f := strings.Fields(res.Stdout); len(f) == 3 { // VmRSS: 208216 kB
			if kb, err := strconv.ParseInt(f[1], 10, 64); err == nil {
				r.warmRSS = mib(kb << 10)
			}
		}
	}
	warmCP, err := vm.TakeCheckpoint(ctx, warm, vm.CheckpointOptions{Dir: c.dir})
	if err != nil {
		return err
	}
	r.warmSz = warmCP.Size
	cold, coldWarmup := c.cold()
	restored, warmRestore := c.restoreAsk(warmCP)
	res, err = measure(ctx, "checkpoint: warm process: first answer", []alt{
		{name: nameCkptWarm, timed: restored},
		{name: nameCkptCold, timed: cold},
		{name: nameCkptImport, timed: c.importOne(warmCP.Path)},
		{name: nameCkptRewrite, timed: c.rewrite(warmCP.Path)},
	}, 0, rounds(3, 2), budget)
	if err != nil {
		return err
	}
	r.warm, r.cold, r.warmImport, r.warmRewrite = res[0], res[1], res[2], res[3]
	r.coldWarmup, r.warmRestore = coldWarmup, warmRestore
	if r.pooled, err = c.pooled(ctx, warmCP, rounds(3, 2), budget); err != nil {
		return err
	}
	// Five rounds, not three: the service's dump of 210 MiB varies by a
	// tenth from call to call, as much as the 1.05× target allows.
	if r.take["warm"], err = c.takes(ctx, "warm", warm, 0, rounds(5, 2), min(b.sz.budget, 2*ckptComparisonTime)); err != nil {
		return err
	}
	for _, cp := range []*vm.Checkpoint{smallCP, warmCP} {
		if err := vm.RemoveCheckpoint(ctx, cp.ID, vm.WithCheckpointDir(c.dir)); err != nil {
			return err
		}
	}
	return nil
}

// sandbox makes and creates a sandbox of the run's Config on APIVM.
func (c *ckptBench) sandbox(ctx context.Context) (vm.VM, error) {
	v, err := vm.NewAPIVM(ctx, c.b.p.url, c.cfg)
	if err != nil {
		return nil, err
	}
	if err := v.Create(ctx); err != nil {
		removeVM(ctx, v)
		return nil, err
	}
	return v, nil
}

// removeVM removes v with a context of its own.
func removeVM(ctx context.Context, v vm.VM) {
	rctx, cancel := removeContext(ctx)
	defer cancel()
	if err := v.Remove(rctx); err != nil {
		fmt.Fprintln(os.Stderr, "bench: checkpoint: removing a sandbox:", err)
	}
}

// warmUp waits for p's "ready", then asks it once: the first answer.
// It returns when p said "ready".
func warmUp(ctx context.Context, p *vm.Process) (ready time.Time, err error) {
	ctx, cancel := context.WithTimeout(ctx, ckptCallTimeout)
	defer cancel()
	line, off, err := nextLine(ctx, p.Stdout(), 0)
	if err != nil || line != "ready" {
		return ready, fmt.Errorf("the warm process said %q, want ready: %v: %s", line, err, stderrOf(p))
	}
	return time.Now(), ask(ctx, p, off)
}

// ask writes the key to p and checks its answer, read from offset off
// of its stdout.
func ask(ctx context.Context, p *vm.Process, off int64) error {
	ctx, cancel := context.WithTimeout(ctx, ckptCallTimeout)
	defer cancel()
	if _, err := p.Stdin().Write([]byte(warmKey)); err != nil {
		return err
	}
	line, _, err := nextLine(ctx, p.Stdout(), off)
	if err != nil || line != warmAnswer {
		return fmt.Errorf("the warm process answered %q, want %q: %v: %s", line, warmAnswer, err, stderrOf(p))
	}
	return nil
}

func stderrOf(p *vm.Process) string {
	_, b := p.Stderr().Bytes()
	return strings.TrimSpace(string(b))
}

// nextLine reads out from offset from to the end of its next line, and
// returns the line and the offset after it.
func nextLine(ctx context.Context, out *vm.Output, from int64) (string, int64, error) {
	r := out.Reader(from)
	stop := context.AfterFunc(ctx, func() { r.Close() })
	defer stop()
	var line []byte
	buf := make([]byte, 256)
	for {
		n, err := r.Read(buf)
		line = append(line, buf[:n]...)
		if i := bytes.IndexByte(line, '\n'); i >= 0 {
			return string(line[:i]), from + int64(i) + 1, nil
		}
		if err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return string(line), from + int64(len(line)), err
		}
	}
}

// cold is the warm process from nothing: a new sandbox, vm.Start, the
// warm-up and the first answer; the sandbox's removal is not timed. The
// series it returns gets the warm-up alone of each.
func (c *ckptBench) cold() (func(context.Context) (time.Duration, error), *series) {
	warmup := &series{name: "the warm-up alone"}
	return func(ctx context.Context) (time.Duration, error) {
		t0 := time.Now()
		v, err := vm.NewAPIVM(ctx, c.b.p.url, c.cfg)
		if err != nil {
			return 0, err
		}
		defer removeVM(ctx, v)
		if err := v.Create(ctx); err != nil {
			return 0, err
		}
		p, err := vm.Start(ctx, v, warmCommand)
		if err != nil {
			return 0, err
		}
		started := time.Now()
		ready, err := warmUp(ctx, p)
		d := time.Since(t0)
		if err == nil {
			warmup.add(ready.Sub(started), nil)
		}
		return d, err
	}, warmup
}

// restoreAsk restores a copy of cp and asks the process it adopted; the
// copy's removal is not timed. The series it returns gets vm.Restore's
// time alone.
func (c *ckptBench) restoreAsk(cp *vm.Checkpoint) (func(context.Context) (time.Duration, error), *series) {
	restore := &series{name: "vm.Restore alone"}
	return func(ctx context.Context) (time.Duration, error) {
		t0 := time.Now()
		v, err := vm.Restore(ctx, cp, vm.RestoreOptions{}, c.opts...)
		if err != nil {
			return 0, err
		}
		defer removeVM(ctx, v)
		restored := time.Since(t0)
		procs := vm.Processes(v)
		if len(procs) != 1 {
			return 0, fmt.Errorf("the copy holds %d processes, want the warm one", len(procs))
		}
		err = ask(ctx, procs[0], 0)
		d := time.Since(t0)
		if err == nil {
			restore.add(restored, nil)
		}
		return d, err
	}, restore
}

// pooled measures Gets from a restore pool of cp, each once the pool is
// filled; the pool is closed, its copies removed, before it returns.
func (c *ckptBench) pooled(ctx context.Context, cp *vm.Checkpoint, n int, budget time.Duration) (*series, error) {
	progress("checkpoint: the warm sandbox: a pool of its copies")
	pool, err := vm.NewRestorePool(cp, vm.RestoreOptions{}, func(ctx context.Context, cp *vm.Checkpoint, ro vm.RestoreOptions) (vm.VM, error) {
		return vm.Restore(ctx, cp, ro, c.opts...)
	}, vm.WithPoolSize(ckptPoolSize))
	if err != nil {
		return nil, err
	}
	defer func() {
		cctx, cancel := removeContext(ctx)
		defer cancel()
		if err := pool.Close(cctx); err != nil {
			fmt.Fprintln(os.Stderr, "bench: checkpoint: closing the restore pool:", err)
		}
	}()
	res, err := measure(ctx, "checkpoint: warm process: from a pool", []alt{{name: nameCkptPool, timed: func(ctx context.Context) (time.Duration, error) {
		if err := filled(ctx, pool, ckptPoolSize); err != nil {
			return 0, err
		}
		t0 := time.Now()
		v, err := pool.Get(ctx)
		if err != nil {
			return 0, err
		}
		defer removeVM(ctx, v)
		procs := vm.Processes(v)
		if len(procs) != 1 {
			return 0, fmt.Errorf("the copy holds %d processes, want the warm one", len(procs))
		}
		err = ask(ctx, procs[0], 0)
		return time.Since(t0), err
	}}}, 0, n, budget)
	if err != nil {
		return nil, err
	}
	return res[0], nil
}

// filled waits until pool holds size ready sandboxes, failing when a
// restore of the pool's fails meanwhile.
func filled(ctx context.Context, pool *vm.Pool, size int) error {
	ctx, cancel := context.WithTimeout(ctx, ckptCallTimeout)
	defer cancel()
	failed := pool.Stats().Failed
	for {
		s := pool.Stats()
		switch {
		case s.Ready >= size:
			return nil
		case s.Failed > failed:
			return fmt.Errorf("the restore pool: %w", s.LastErr)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the restore pool did not fill: %+v: %w", s, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// restoreRun restores a copy of cp and runs `true` in it; the copy's
// removal is not timed.
func (c *ckptBench) restoreRun(cp *vm.Checkpoint) func(context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		t0 := time.Now()
		v, err := vm.Restore(ctx, cp, vm.RestoreOptions{}, c.opts...)
		if err != nil {
			return 0, err
		}
		defer removeVM(ctx, v)
		err = vmRunOK(ctx, v, []string{"true"}, "")
		return time.Since(t0), err
	}
}

// coldRun creates a sandbox and runs `true` in it; its removal is not
// timed.
func (c *ckptBench) coldRun(ctx context.Context) (time.Duration, error) {
	t0 := time.Now()
	v, err := vm.NewAPIVM(ctx, c.b.p.url, c.cfg)
	if err != nil {
		return 0, err
	}
	defer removeVM(ctx, v)
	if err := v.Create(ctx); err != nil {
		return 0, err
	}
	err = vmRunOK(ctx, v, []string{"true"}, "")
	return time.Since(t0), err
}

// takes compares the ways to take a checkpoint of v, each archive
// removed (untimed) once taken; with the check TakeCheckpoint adds, on
// the last archive a way wrote.
func (c *ckptBench) takes(ctx context.Context, what string, v vm.VM, warm, n int, budget time.Duration) ([]*series, error) {
	last := filepath.Join(c.dir, "last-"+what+".tar")
	defer os.Remove(last)
	keep := func(path string) error { return os.Rename(path, last) }
	take := func(ctx context.Context) (time.Duration, error) {
		t0 := time.Now()
		cp, err := vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{Dir: c.dir})
		d := time.Since(t0)
		if err != nil {
			return 0, err
		}
		if err := keep(cp.Path); err != nil {
			return 0, err
		}
		return d, vm.RemoveCheckpoint(ctx, cp.ID, vm.WithCheckpointDir(c.dir))
	}
	cli := func(ctx context.Context) (time.Duration, error) {
		path := filepath.Join(c.dir, c.name("export")+".tar")
		defer os.Remove(path)
		t0 := time.Now()
		_, err := c.b.p.output(ctx, "container", "checkpoint", "--export", path, "--leave-running", "--tcp-established", "--file-locks", "--compress=none", v.ID())
		d := time.Since(t0)
		if err != nil {
			return 0, err
		}
		return d, keep(path)
	}
	bindings := func(ctx context.Context) (time.Duration, error) {
		path := filepath.Join(c.dir, c.name("export")+".tar")
		defer os.Remove(path)
		t0 := time.Now()
		yes := true
		bctx, cancel := c.bind.bounded(ctx)
		defer cancel()
		_, err := containers.Checkpoint(bctx, v.ID(), &containers.CheckpointOptions{Export: &path, LeaveRunning: &yes, TCPEstablished: &yes, FileLocks: &yes})
		d := time.Since(t0)
		if err != nil {
			return 0, err
		}
		return d, keep(path)
	}
	inspect := func(context.Context) (time.Duration, error) {
		f, err := os.Open(last)
		if errors.Is(err, os.ErrNotExist) {
			return 0, errors.New("no archive yet")
		}
		if err != nil {
			return 0, err
		}
		defer f.Close()
		t0 := time.Now()
		_, err = ckpt.Inspect(f)
		return time.Since(t0), err
	}
	return measure(ctx, "checkpoint: "+what+" sandbox: taking one", []alt{
		{name: nameCkptTake, timed: take},
		{name: nameCkptCLI, timed: cli},
		{name: nameCkptBindings, timed: bindings},
		{name: nameCkptInspect, timed: inspect},
	}, warm, n, budget)
}

// forkN runs one(i) for i < forkCopies at once, and returns how long
// the last took to end; then, untimed, undo(i) at once for each that
// made something.
func forkN(ctx context.Context, one func(ctx context.Context, i int) (bool, error), undo func(i int) error) (time.Duration, error) {
	errs := make([]error, 2*forkCopies)
	made := make([]bool, forkCopies)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range forkCopies {
		wg.Go(func() { made[i], errs[i] = one(ctx, i) })
	}
	wg.Wait()
	d := time.Since(t0)
	for i := range forkCopies {
		if made[i] {
			wg.Go(func() { errs[forkCopies+i] = undo(i) })
		}
	}
	wg.Wait()
	return d, errors.Join(errs...)
}

// fork restores forkCopies copies of cp at once with vm.Restore.
func (c *ckptBench) fork(cp *vm.Checkpoint) func(context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		copies := make([]vm.VM, forkCopies)
		return forkN(ctx, func(ctx context.Context, i int) (bool, error) {
			v, err := vm.Restore(ctx, cp, vm.RestoreOptions{}, c.opts...)
			copies[i] = v
			return err == nil, err
		}, func(i int) error {
			rctx, cancel := removeContext(ctx)
			defer cancel()
			return copies[i].Remove(rctx)
		})
	}
}

// forkCLI restores forkCopies containers of the archive at once with
// `podman container restore --import`, each with a name of its own
// (which gives it an ID of its own); they carry the source's labels,
// the run's among them.
func (c *ckptBench) forkCLI(archive string) func(context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		names := make([]string, forkCopies)
		return forkN(ctx, func(ctx context.Context, i int) (bool, error) {
			names[i] = c.name("fork")
			_, err := c.b.p.output(ctx, "container", "restore", "--import", archive, "--name", names[i])
			return true, err // a failed restore may leave a created container
		}, func(i int) error {
			rctx, cancel := removeContext(ctx)
			defer cancel()
			return c.b.p.remove(rctx, names[i])
		})
	}
}

// forkBindings is forkCLI through the bindings, one connection shared.
func (c *ckptBench) forkBindings(archive string) func(context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		names := make([]string, forkCopies)
		return forkN(ctx, func(ctx context.Context, i int) (bool, error) {
			names[i] = c.name("fork")
			bctx, cancel := c.bind.bounded(ctx)
			defer cancel()
			_, err := containers.Restore(bctx, "", &containers.RestoreOptions{ImportArchive: &archive, Name: &names[i]})
			return true, err
		}, func(i int) error {
			rctx, cancel := removeContext(ctx)
			defer cancel()
			return c.b.p.remove(rctx, names[i])
		})
	}
}

// rewrite times what vm.Restore does to the archive before the
// service sees it: a copy with the new container's identity.
func (c *ckptBench) rewrite(archive string) func(context.Context) (time.Duration, error) {
	return func(context.Context) (time.Duration, error) {
		in, err := os.Open(archive)
		if err != nil {
			return 0, err
		}
		defer in.Close()
		spool := filepath.Join(c.dir, c.name("spool"))
		defer os.Remove(spool)
		out, err := os.OpenFile(spool, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return 0, err
		}
		var id [32]byte
		_, _ = rand.Read(id[:])
		t0 := time.Now()
		err = ckpt.Rewrite(out, in, ckpt.Identity{ID: hex.EncodeToString(id[:]), Name: filepath.Base(spool), Labels: map[string]string{labelRun: c.b.p.labels[labelRun]}})
		err = errors.Join(err, out.Close())
		return time.Since(t0), err
	}
}

// importOne restores one container of the archive through the
// bindings, with a name of its own; its removal is not timed.
func (c *ckptBench) importOne(archive string) func(context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		name := c.name("import")
		bctx, cancel := c.bind.bounded(ctx)
		defer cancel()
		t0 := time.Now()
		_, err := containers.Restore(bctx, "", &containers.RestoreOptions{ImportArchive: &archive, Name: &name})
		d := time.Since(t0)
		rctx, rcancel := removeContext(ctx)
		defer rcancel()
		return d, errors.Join(err, c.b.p.remove(rctx, name))
	}
}

// reportCheckpoint writes the section's tables and its targets.
func (b *bench) reportCheckpoint(w io.Writer) {
	r := b.ckpt
	if r == nil {
		return
	}
	if r.skip != "" {
		fmt.Fprintf(w, "\n**Checkpoints** (`checkpoint`): skipped: %s\n", r.skip)
		return
	}
	fmt.Fprintf(w, "\n**Checkpoints** (`checkpoint`), podvm APIVM through the agent: %s in all, load average %s at the section's start, %s at its end; archives written uncompressed in a directory under vm.DefaultCheckpointDir(), removed at the end\n",
		r.took.Round(time.Second), r.loadStart, r.loadEnd)

	if r.warm != nil {
		rss := r.warmRSS
		if rss == "" {
			rss = "its size not read"
		}
		fmt.Fprintf(w, "\n**Checkpoints, a warm process** held with vm.Start: `%s` (%s resident once loaded; archive %s), from nothing against vm.Restore of a checkpoint of the warm sandbox; each sandbox removed afterwards, untimed; %s\n\n",
			shellLine(append([]string{warmCommand.Name}, warmCommand.Args...)), rss, mib(r.warmSz), runs([]*series{r.warm, r.cold, r.warmImport, r.warmRewrite}))
		fmt.Fprintln(w, "| how | p50 | p90 | of which | vs cold | failures |")
		fmt.Fprintln(w, "|---|--:|--:|---|--:|---|")
		ckptRow(w, r.cold, r.cold, "the warm-up "+ms(r.coldWarmup.p50()))
		ckptRow(w, r.warm, r.cold, "vm.Restore "+ms(r.warmRestore.p50()))
		ckptRow(w, r.warmImport, r.cold, "")
		ckptRow(w, r.warmRewrite, r.cold, "")
		if r.pooled != nil {
			ckptRow(w, r.pooled, r.cold, fmt.Sprintf("measured after the rows above, alone; %s", runs([]*series{r.pooled})))
		}
	}
	if r.smallRestore != nil {
		fmt.Fprintf(w, "\n**Checkpoints, a small sandbox** (the agent alone, nothing held; archive %s) to its first Run of `true`; each removed afterwards, untimed; %s\n\n",
			mib(r.smallSize), runs([]*series{r.smallRestore, r.smallCold, r.smallImport, r.smallRewrite}))
		fmt.Fprintln(w, "| how | p50 | p90 | of which | vs cold | failures |")
		fmt.Fprintln(w, "|---|--:|--:|---|--:|---|")
		ckptRow(w, r.smallRestore, r.smallCold, "")
		ckptRow(w, r.smallCold, r.smallCold, "")
		ckptRow(w, r.smallImport, r.smallCold, "")
		ckptRow(w, r.smallRewrite, r.smallCold, "")
	}
	for _, what := range []string{"small", "warm"} {
		if ss := r.take[what]; len(ss) > 0 {
			size := r.smallSize
			if what == "warm" {
				size = r.warmSz
			}
			reportP50(w, fmt.Sprintf("**Checkpoints, taking one** of the %s sandbox (archive %s) while it runs, the ways alternated, each archive removed afterwards, untimed;", what, mib(size)),
				ss, nameCkptCLI, "`podman container checkpoint`")
		}
	}
	if len(r.fork) > 0 {
		fmt.Fprintf(w, "\n**Checkpoints, forking** the small sandbox: %d copies made at once from one archive (%s), the time until the last is made and running (vm.Restore's: its agent answered); the ways alternated, the copies removed afterwards, untimed; %s\n\n",
			forkCopies, mib(r.smallSize), runs(r.fork))
		cli := find(r.fork, nameCkptForkCLI)
		fmt.Fprintln(w, "| how | p50 | p90 | copies/s at p50 | vs `podman container restore` | failures |")
		fmt.Fprintln(w, "|---|--:|--:|--:|--:|---|")
		for _, s := range r.fork {
			switch {
			case !s.ok():
				fmt.Fprintf(w, "| %s | %s | | | | %s |\n", s.name, skipped(s), failures(s))
			default:
				vs := "–"
				if cli != nil {
					vs = ratio(float64(cli.p50()), float64(s.p50()))
				}
				fmt.Fprintf(w, "| %s | %s | %s | %.1f | %s | %s |\n", s.name, ms(s.p50()), ms(s.p90()), float64(forkCopies)/s.p50().Seconds(), vs, failures(s))
			}
		}
	}
	b.reportCheckpointTargets(w)
}

// ckptRow is a row of the section's first tables.
func ckptRow(w io.Writer, s, base *series, of string) {
	if !s.ok() {
		fmt.Fprintf(w, "| %s | %s | | | | %s |\n", s.name, skipped(s), failures(s))
		return
	}
	vs := "–"
	if base.ok() {
		vs = ratio(float64(s.p50()), float64(base.p50()))
	}
	fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", s.name, ms(s.p50()), ms(s.p90()), of, vs, failures(s))
}

func (b *bench) reportCheckpointTargets(w io.Writer) {
	r := b.ckpt
	var ts []target
	t := target{what: fmt.Sprintf("warm process: vm.Restore to the adopted process's first answer p50 ≤ %.2f× cold start and warm-up", warmRestoreTarget)}
	if r.warm.ok() && r.cold.ok() {
		q := float64(r.warm.p50()) / float64(r.cold.p50())
		t.have, t.pass = true, q <= warmRestoreTarget
		t.measured = fmt.Sprintf("%.2f× (%s vs %s)", q, ms(r.warm.p50()), ms(r.cold.p50()))
		t.bound = restoreBound(r.warmRestore, r.warmImport, r.warmRewrite)
	}
	ts = append(ts, t)
	t = target{what: fmt.Sprintf("warm process: a Get from a filled vm.NewRestorePool to the adopted process's first answer p50 ≤ %.2f× cold start and warm-up", warmRestoreTarget)}
	if r.pooled != nil && r.pooled.ok() && r.cold.ok() {
		q := float64(r.pooled.p50()) / float64(r.cold.p50())
		t.have, t.pass = true, q <= warmRestoreTarget
		t.measured = fmt.Sprintf("%.2f× (%s vs %s)", q, ms(r.pooled.p50()), ms(r.cold.p50()))
		t.bound = "the copy's agent and the process's answer"
	}
	ts = append(ts, t)
	t = target{what: fmt.Sprintf("small sandbox: vm.Restore to its first Run p50 ≤ %s (for reference: %s)", ms(smallRestoreTarget), e2bResume)}
	if r.smallRestore.ok() {
		t.have, t.pass = true, r.smallRestore.p50() <= smallRestoreTarget
		t.measured = ms(r.smallRestore.p50())
		t.bound = restoreBound(nil, r.smallImport, r.smallRewrite)
	}
	ts = append(ts, t)
	for _, what := range []string{"small", "warm"} {
		ss := r.take[what]
		t := target{what: fmt.Sprintf("%s sandbox: vm.TakeCheckpoint p50 ≤ %.2f× `podman container checkpoint --export`'s", what, ckptTakeTarget)}
		x, y := find(ss, nameCkptTake), find(ss, nameCkptCLI)
		if x != nil && y != nil {
			q := float64(x.p50()) / float64(y.p50())
			t.have, t.pass = true, q <= ckptTakeTarget
			t.measured = fmt.Sprintf("%.2f× (%s vs %s)", q, ms(x.p50()), ms(y.p50()))
			t.bound = "the service's dump"
			bi, in := find(ss, nameCkptBindings), find(ss, nameCkptInspect)
			switch {
			case bi == nil || in == nil:
			case x.p50() > bi.p50():
				t.bound = fmt.Sprintf("the service's dump and podvm's checks: the same call through the bindings takes %s; podvm adds %s, of which reading the archive again to check it (ckpt.Inspect) %s, the rest the agent's freeze and thaw and the metadata",
					ms(bi.p50()), ms(x.p50()-bi.p50()), ms(in.p50()))
			default:
				t.bound = fmt.Sprintf("the service's dump, which varies from call to call: the same call through the bindings took %s, more than vm.TakeCheckpoint's %s; podvm's own archive check (ckpt.Inspect) takes %s of it",
					ms(bi.p50()), ms(x.p50()), ms(in.p50()))
			}
		}
		ts = append(ts, t)
	}
	fmt.Fprintln(w, "\n**Checkpoint targets**\n\n| target | measured | result |\n|---|---|---|")
	for _, t := range ts {
		switch {
		case !t.have:
			fmt.Fprintf(w, "| %s | not measured | – |\n", t.what)
		case t.pass:
			fmt.Fprintf(w, "| %s | %s | pass |\n", t.what, t.measured)
		default:
			fmt.Fprintf(w, "| %s | %s | **miss**, bounded by %s |\n", t.what, t.measured, t.bound)
		}
	}
}

// restoreBound says where a restore's time goes: the service's import
// of the same archive, podvm's rewrite of it, and the rest.
func restoreBound(restore, imp, rewrite *series) string {
	if imp == nil || !imp.ok() {
		return "the service's import"
	}
	s := fmt.Sprintf("the service's import: the same archive restored through the bindings, nothing of podvm's, takes %s p50", ms(imp.p50()))
	if restore != nil && restore.ok() {
		s += fmt.Sprintf(", vm.Restore alone %s", ms(restore.p50()))
	}
	if rewrite != nil && rewrite.ok() {
		s += fmt.Sprintf("; podvm's rewrite of the archive for the copy's identity %s", ms(rewrite.p50()))
	}
	return s + "; the rest is the copy's agent reached again and the first answer"
}

// whole is err's message on one line, uncut (a skip's reason, whose
// last words say why), fit for a table cell.
func whole(err error) string {
	return strings.ReplaceAll(strings.Join(strings.Fields(err.Error()), " "), "|", `\|`)
}
