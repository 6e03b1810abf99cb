package vmtest

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// Restorer is implemented by a [Harness] whose VMs can be checkpointed
// where the engine can: RestoreOptions are the options that make
// [vm.Restore] use the harness's backend and service. Without it, the
// checkpoint cases expect [vm.ErrNotSupported].
type Restorer interface {
	RestoreOptions() []vm.Option
}

// checkpointCases are the conformance cases of checkpoints: where the
// engine can ([vm.CheckpointSupport]), a running sandbox forked into a
// copy that goes on from the checkpoint; elsewhere, the refusal, the
// same on every backend of a way.
func checkpointCases(h Harness) []testCase {
	checkpointable := func(c *vm.Config) { c.Checkpointable = true }
	return []testCase{
		{Name: "checkpoint/support", Promise: "CheckpointSupport answers before anything is made, and TakeCheckpoint and Suspend agree with it once the sandbox is",
			Config: checkpointable, Uncreated: true, Deadline: 2 * time.Minute,
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				err := vm.CheckpointSupport(ctx, v)
				if err != nil && !errors.Is(err, vm.ErrNotSupported) {
					t.Fatalf("CheckpointSupport: %v", err)
				}
				if v.ID() != "" {
					t.Errorf("CheckpointSupport made the sandbox: %s", v.ID())
				}
				if cerr := v.Create(ctx); cerr != nil {
					t.Fatalf("Create: %v", cerr)
				}
				_, terr := vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{Dir: checkpointDir(t)})
				serr := vm.Suspend(ctx, v)
				if err == nil {
					serr = errors.Join(serr, vm.Resume(ctx, v))
				}
				agree := func(got error) bool {
					return (err == nil) == (got == nil) && (got == nil || errors.Is(got, vm.ErrNotSupported))
				}
				if !agree(terr) || !agree(serr) {
					t.Errorf("CheckpointSupport: %v; TakeCheckpoint: %v; Suspend and Resume: %v: want them to agree", err, terr, serr)
				}
				return []observation{observeCheckpoint("support", err), observeCheckpoint("take", terr), observeCheckpoint("suspend", serr)}
			}},
		{Name: "checkpoint/fork", Promise: "a copy restored from a checkpoint is a sandbox of its own whose held process goes on from the checkpoint with its memory, and whose files are the source's at that instant",
			Config: checkpointable, Deadline: 3 * time.Minute, Agent: true,
			Test: func(ctx context.Context, t *testing.T, v vm.VM) []observation {
				return checkpointFork(ctx, t, h, v)
			}},
	}
}

func checkpointFork(ctx context.Context, t *testing.T, h Harness, v vm.VM) []observation {
	if err := vm.CheckpointSupport(ctx, v); err != nil {
		if !errors.Is(err, vm.ErrNotSupported) {
			t.Fatalf("CheckpointSupport: %v", err)
		}
		return []observation{observeCheckpoint("support", err)}
	}
	r, ok := h.(Restorer)
	if !ok {
		t.Fatalf("the engine can checkpoint, and the harness %T cannot restore (vmtest.Restorer)", h)
	}
	p, err := vm.Start(ctx, v, sh(`n=0; while read l; do n=$((n+1)); echo "$n $l"; done`))
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if _, err := p.Stdin().Write([]byte("warm\n")); err != nil {
		t.Fatal(err)
	}
	if res, err := v.Run(ctx, sh(`echo before > /tmp/state`)); err != nil || res.ExitCode != 0 {
		t.Fatalf("writing: %v %+v", err, res)
	}
	waitOutput(t, p, "1 warm\n")
	cp, err := vm.TakeCheckpoint(ctx, v, vm.CheckpointOptions{Dir: checkpointDir(t)})
	if err != nil {
		t.Fatalf("TakeCheckpoint: %v", err)
	}
	if res, err := v.Run(ctx, sh(`echo after > /tmp/state`)); err != nil || res.ExitCode != 0 {
		t.Fatalf("writing: %v %+v", err, res)
	}
	c, err := vm.Restore(ctx, cp, vm.RestoreOptions{}, r.RestoreOptions()...)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	t.Cleanup(func() {
		rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.Remove(rctx); err != nil {
			t.Errorf("removing the copy: %v", err)
		}
	})
	if c.ID() == v.ID() || c.ID() == "" {
		t.Errorf("the copy's container %q: want one of its own, not the source's %q", c.ID(), v.ID())
	}
	res, err, obs := run(ctx, c, "copy's file", exec.Command{Name: "cat", Args: []string{"/tmp/state"}})
	if err != nil || res.Stdout != "before\n" {
		t.Errorf("the copy's file: %v %+v: want the source's at the checkpoint", err, res)
	}
	procs := vm.Processes(c)
	if len(procs) != 1 {
		t.Fatalf("the copy holds %d processes: want the source's one, adopted", len(procs))
	}
	if _, err := procs[0].Stdin().Write([]byte("copy\n")); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, procs[0], "2 copy\n")
	_, out := procs[0].Stdout().Bytes()
	return []observation{obs, {Label: "adopted process", Result: &exec.Result{Stdout: string(out)}}}
}

// observeCheckpoint records the outcome of a checkpoint call.
func observeCheckpoint(label string, err error) observation {
	if err == nil {
		return observation{Label: label, Result: &exec.Result{}}
	}
	return observe(label, nil, err)
}

// waitOutput waits, 30 s at most, for p's stdout to end with want.
func waitOutput(t *testing.T, p *vm.Process, want string) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if _, b := p.Stdout().Bytes(); strings.HasSuffix(string(b), want) {
			return
		}
	}
	_, b := p.Stdout().Bytes()
	t.Fatalf("the process wrote %q: want it to end with %q", b, want)
}

// checkpointDir is a directory for a case's checkpoints, out of the
// temporary directory (which vm refuses), removed when the case ends.
func checkpointDir(t *testing.T) string {
	t.Helper()
	base, err := vm.DefaultCheckpointDir()
	if err == nil {
		err = os.MkdirAll(base, 0o700)
	}
	if err != nil {
		t.Fatalf("checkpoint directory: %v", err)
	}
	dir, err := os.MkdirTemp(base, "vmtest-")
	if err != nil {
		t.Fatalf("checkpoint directory: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
