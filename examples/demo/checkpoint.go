package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// The fork part of the demo: a process warms up in a sandbox (it
// computes a table and seeds its random generator, in its memory
// alone), the sandbox is checkpointed while it runs, and the checkpoint
// is restored as fresh sandboxes whose copies of the process go on from
// that instant: each answers from the warm state, with the same memory
// (the same next random number as the original's). Where the service
// cannot checkpoint (vm.CheckpointSupport: Podman 4.3's CRIU, rootless
// Podman, …), it says why in one line and the demo goes on.
const copies = 3 // sandboxes restored from the checkpoint

// warmProcess warms up (the sum of the squares below warmN, and $RANDOM
// seeded), says "ready", then answers each line it reads, counting them.
const warmN = 20000

var warmProcess = exec.Command{Name: "sh", Args: []string{"-c", fmt.Sprintf(`RANDOM=%d; s=0; i=0
while [ $i -lt %d ]; do s=$((s + i * i)); i=$((i + 1)); done
echo ready; n=0
while read q; do n=$((n + 1)); echo "answer $n to $q: sum of squares $s, next random $RANDOM"; done`, 1234, warmN)}}

// forks runs the fork part, printing a line a step. It removes
// everything it made (sandboxes, the checkpoint and its directory), and
// returns the promises that were broken.
func (d *demo) forks(ctx context.Context, w io.Writer) (failures []string) {
	fmt.Fprintf(w, "\nforks: a warm process checkpointed while it runs, and restored into %d fresh sandboxes\n\n", copies)
	// Checkpointable: the agent talks over the container's stdio, which
	// a checkpoint carries, even where a unix socket would reach it.
	src, err := vm.New(ctx, vm.Config{Image: d.image, Pull: vm.PullNever, Checkpointable: true}, vm.WithURL(d.url))
	if err != nil {
		return []string{"forks: " + err.Error()}
	}
	defer cleanup(ctx, src)
	switch err := vm.CheckpointSupport(ctx, src); {
	case errors.Is(err, vm.ErrNotSupported):
		fmt.Fprintf(w, "  skipped: %s\n", oneLine(err))
		return nil
	case err != nil:
		return []string{"forks: vm.CheckpointSupport: " + err.Error()}
	}

	tw := tabwriter.NewWriter(w, 0, 0, 3, ' ', 0)
	defer tw.Flush()
	line := func(name string, start time.Time, text string, err error) bool {
		if err != nil {
			text = "FAILED"
			failures = append(failures, fmt.Sprintf("forks %s: %v", name, err))
		}
		fmt.Fprintf(tw, "  %s\t%s\t%6.2fs\n", name, text, time.Since(start).Seconds())
		return err == nil
	}

	start := time.Now()
	var p *vm.Process
	var first string
	err = src.Create(ctx)
	if err == nil {
		p, err = vm.Start(ctx, src, warmProcess)
	}
	if err == nil {
		first, err = askWarm(ctx, p, "ready", "the original")
	}
	if !line("warm up", start, fmt.Sprintf("created; sh summed the squares below %d and seeded $RANDOM, then %s", warmN, first), err) {
		return failures
	}

	start = time.Now()
	dir, err := checkpointDir()
	if err != nil {
		line("checkpoint", start, "", err)
		return failures
	}
	defer os.RemoveAll(dir)
	cp, err := vm.TakeCheckpoint(ctx, src, vm.CheckpointOptions{Dir: dir})
	if errors.Is(err, vm.ErrNotSupported) {
		// The service can, but not this sandbox.
		fmt.Fprintf(tw, "  checkpoint\tskipped: %s\n", oneLine(err))
		return failures
	}
	if err == nil {
		defer removeCheckpoint(ctx, cp, dir)
	}
	text := ""
	if err == nil {
		text = fmt.Sprintf("%s of the running sandbox's memory and files, in %s", size(int(cp.Size)), rel(dir))
	}
	if !line("checkpoint", start, text, err) {
		return failures
	}

	// The original goes on; what it answers next, each copy must.
	start = time.Now()
	want, err := askWarm(ctx, p, "", "the original")
	if !line("original", start, want, err) {
		return failures
	}
	wantState := want[strings.Index(want, ":"):]
	var slowest time.Duration
	for i := 1; i <= copies; i++ {
		start = time.Now()
		name := fmt.Sprintf("copy %d", i)
		text, err := d.restoreCopy(ctx, cp, name, wantState)
		slowest = max(slowest, time.Since(start))
		if !line(name, start, text, err) {
			return failures
		}
	}
	fmt.Fprintf(tw, "  \teach copy, restored, asked and removed in at most %.2fs, answered from the warm state with the original's memory: its count, its sum, its next random number\n", slowest.Seconds())
	return failures
}

// restoreCopy restores a sandbox from cp, asks its copy of the warm
// process, checks that it answers from the original's state, and removes
// the sandbox.
func (d *demo) restoreCopy(ctx context.Context, cp *vm.Checkpoint, name, wantState string) (string, error) {
	v, err := vm.Restore(ctx, cp, vm.RestoreOptions{}, vm.WithURL(d.url))
	if err != nil {
		return "", err
	}
	defer cleanup(ctx, v)
	procs := vm.Processes(v)
	if len(procs) != 1 {
		return "", fmt.Errorf("the restored sandbox holds %d processes, want the warm one", len(procs))
	}
	got, err := askWarm(ctx, procs[0], "", name)
	switch {
	case err != nil:
		return "", err
	case !strings.HasSuffix(got, wantState) || !strings.HasPrefix(got, "answer 2 to "+name+":"):
		return "", fmt.Errorf("it answered %q, want answer 2 and %q", got, wantState)
	}
	if err := v.Remove(ctx); err != nil {
		return "", err
	}
	return fmt.Sprintf("container %.12s: %s", v.ID(), got), nil
}

// askWarm reads the warm process's stdout from the start: first waits
// for the line wait when set (its warm-up), then sends q and returns the
// answer.
func askWarm(ctx context.Context, p *vm.Process, wait, q string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, runTimeout)
	defer cancel()
	r := p.Stdout().Reader(p.Stdout().Len())
	if wait != "" {
		r = p.Stdout().Reader(0)
	}
	stop := context.AfterFunc(ctx, func() { r.Close() })
	defer stop()
	lines := bufio.NewScanner(r)
	next := func() (string, error) {
		if lines.Scan() {
			return lines.Text(), nil
		}
		if ctx.Err() != nil {
			_, e := p.Stderr().Bytes()
			return "", fmt.Errorf("no answer within %v: %s", runTimeout, strings.TrimSpace(string(e)))
		}
		return "", fmt.Errorf("its output ended: %v", lines.Err())
	}
	if wait != "" {
		if l, err := next(); err != nil || l != wait {
			return "", fmt.Errorf("the process said %q, want %q: %v", l, wait, err)
		}
	}
	if _, err := p.Stdin().Write([]byte(q + "\n")); err != nil {
		return "", err
	}
	return next()
}

// checkpointDir makes a directory for the demo's checkpoint under
// vm.DefaultCheckpointDir: the caller's alone, never in the temporary
// directory (which vm refuses: checkpoints hold a sandbox's memory).
func checkpointDir() (string, error) {
	base, err := vm.DefaultCheckpointDir()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(base, 0o700); err != nil {
		return "", err
	}
	return os.MkdirTemp(base, "demo-")
}

// removeCheckpoint removes cp with a context of its own, once the
// sandboxes restored from it are gone.
func removeCheckpoint(ctx context.Context, cp *vm.Checkpoint, dir string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := vm.RemoveCheckpoint(ctx, cp.ID, vm.WithCheckpointDir(dir)); err != nil {
		fmt.Fprintln(os.Stderr, "demo: removing the checkpoint:", err)
	}
}

// oneLine is err's message on one line.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

// showForks runs the fork part alone (-forks).
func (d *demo) showForks(ctx context.Context, w io.Writer) error {
	start := time.Now()
	fmt.Fprintf(w, "podvm demo: forks, on %s\n", or(d.url, "the service vm.New finds"))
	failures := d.forks(ctx, w)
	switch {
	case ctx.Err() != nil:
		return errors.New("interrupted; its sandboxes were removed")
	case len(failures) > 0:
		fmt.Fprintf(w, "\n%s\n", strings.Join(failures, "\n"))
		return errors.New("some promises were broken")
	}
	fmt.Fprintf(w, "\nnothing is left behind (%.1fs)\n", time.Since(start).Seconds())
	return nil
}
