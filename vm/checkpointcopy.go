package vm

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/agent"
	"github.com/podvm/podvm/internal/ckpt"
	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/podman"
)

// This file takes a running sandbox's checkpoint as files of the
// caller's, and restores copies from it: sandboxes of their own, whose
// processes go on from the checkpoint's instant.

// CheckpointOptions says how [TakeCheckpoint] writes a checkpoint.
type CheckpointOptions struct {
	// Dir is the directory the checkpoint is written to: the caller's
	// alone (mode 0700; made so when missing), never in the system's
	// temporary directory. "" is [DefaultCheckpointDir].
	Dir string
	// Labels are added to the checkpoint's; podvm's own win.
	Labels map[string]string
	// Remove stops the sandbox at the checkpoint's instant (the dump
	// ends its processes, so that nothing they would do after it, a
	// write to a bind mount, a message out, is done but by the copies)
	// and removes it once its checkpoint is written, as [VM.Remove]
	// does: what it was lives on in the checkpoint alone. Between the
	// two it is stopped as [Suspend] leaves it; when a step after the
	// dump fails, it is left so (the error matches [ErrSuspended]), and
	// [Resume] or [VM.Remove] may follow. When the removal fails,
	// TakeCheckpoint returns the checkpoint with the error, and
	// [VM.Remove] may be tried again. A failed dump leaves it running,
	// as without Remove, unless it failed after it stopped it (an export
	// cut short): the error then matches ErrSuspended too. Once the dump
	// is done, an ended ctx no longer stops the rest. (To stop a sandbox
	// and bring it back later on the same service, see [Suspend].)
	Remove bool
}

// RestoreOptions says what [Restore] makes of a checkpoint.
type RestoreOptions struct {
	// Name is the new sandbox's container name; "" lets podvm choose one,
	// "podvm-" and 12 hex digits.
	Name string
	// Labels are added to the source's Config.Labels, less [LabelPool]:
	// a copy is no pool's sandbox unless Labels says so.
	Labels map[string]string
}

// TakeCheckpoint saves v's sandbox, running, as a [Checkpoint]: its
// processes, their memory and its filesystem, in opts.Dir. The sandbox
// goes on (unless opts.Remove), frozen for the length of the dump: calls
// made meanwhile wait for its end, a Run in flight goes on as it was,
// and its result is the original's alone (see [Restore]). It needs what
// [CheckpointSupport] checks, which it asks first: [ErrNotSupported],
// naming why, before anything changes.
//
// The dump fails, the sandbox left running and nothing written, when a
// process in the sandbox holds what CRIU cannot dump (on Linux 6.18
// with CRIU 4.1, any TCP socket: close them first), and when ctx ends
// first. On a Podman service of this machine, the sandbox must be made
// with [Config.Checkpointable]. Remove waits for a checkpoint under way.
func TakeCheckpoint(ctx context.Context, v VM, opts CheckpointOptions) (*Checkpoint, error) {
	s, ok := capability[interface {
		checkpoint(context.Context, CheckpointOptions) (*Checkpoint, error)
	}](v)
	if !ok {
		return nil, fmt.Errorf("%w: checkpoint: %T cannot checkpoint", ErrNotSupported, v)
	}
	return s.checkpoint(ctx, opts)
}

func (s *sandbox) checkpoint(ctx context.Context, opts CheckpointOptions) (*Checkpoint, error) {
	dir, err := checkpointDir(opts.Dir)
	if err != nil {
		return nil, err
	}
	// Before s.mu: the first answer for a kind of sandbox takes a probe.
	if err := s.checkpointSupport(ctx); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := socketRefusal(s.chanDir != ""); err != nil {
		return nil, err
	}
	st, err := s.container()
	if err != nil {
		return nil, err
	}
	if err := openCheckpointDir(dir); err != nil {
		return nil, err
	}
	c := s.d.(driver.Checkpointer) // checkpointSupport found it
	_, service := s.d.Local()
	m := checkpointMeta{Version: checkpointMetaVersion, ID: randomHex(), Source: st.id, Service: service,
		Image: s.cfg.Image, Config: s.cfg}
	if st.agent != nil {
		m.Arch = st.agent.main.Info().Arch
		if m.Agent, err = agent.Digest(m.Arch); err != nil {
			return nil, err
		}
	}
	partial := filepath.Join(dir, spoolName(m.ID, "partial"))
	defer os.Remove(partial) // renamed once whole
	// With Remove, the dump stops the sandbox: its processes go no
	// further than the checkpoint's instant, and it is left as Suspend
	// leaves it until the removal.
	held, after, err := s.frozenDump(ctx, st, "checkpoint", opts.Remove, func(ctx context.Context) error {
		return c.Export(ctx, st.id, partial, !opts.Remove)
	})
	m.NextRun, m.Processes = held.nextRun, held.processes
	switch {
	case after == dumped:
		// Stopped: what is left is this machine's work, done whatever
		// ctx says, rather than lose the only state the sandbox has.
		s.setSuspended(true)
	case after != goesOn: // stopped (with Remove alone), or lost
		if opts.Remove {
			s.setSuspended(true)
		}
		return nil, fmt.Errorf("vm: checkpoint: %w", suspendedBy(after, err))
	case err == nil:
		err = ctx.Err()
	}
	if err != nil && after != dumped {
		return nil, fmt.Errorf("vm: checkpoint: %w", err)
	}
	// fail is a failure from here on, which leaves a sandbox the dump
	// stopped suspended.
	fail := func(err error) (*Checkpoint, error) {
		if after == dumped {
			err = fmt.Errorf("%w (the dump stopped the sandbox: %w, Resume or Remove it)", err, ErrSuspended)
		}
		return nil, fmt.Errorf("vm: checkpoint: %w", err)
	}
	info, size, err := inspectArchive(partial)
	if err != nil {
		return fail(fmt.Errorf("the archive Podman wrote: %w", err))
	}
	if info.ID != st.id {
		return fail(fmt.Errorf("%w: the archive Podman wrote is of container %s, not %s", ErrInvalidCheckpoint, info.ID, st.id))
	}
	m.Labels = maps.Clone(opts.Labels)
	if m.Labels == nil {
		m.Labels = map[string]string{}
	}
	m.Labels[LabelCheckpoint] = "true"
	m.Labels[LabelCheckpointSource] = st.id
	setOwner(m.Labels)
	m.Created, m.Size = time.Now(), size
	m.Labels[LabelCreated] = strconv.FormatInt(m.Created.Unix(), 10)
	cp := m.checkpoint(dir)
	if err := os.Rename(partial, cp.Path); err != nil {
		return fail(err)
	}
	if err := writeMeta(dir, m); err != nil {
		os.Remove(cp.Path)
		return fail(err)
	}
	if opts.Remove {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if err := s.removeLocked(rctx); err != nil {
			return cp, fmt.Errorf("vm: checkpoint %s written; removing the sandbox: %w", cp.ID, err)
		}
	}
	return cp, nil
}

// heldRecords lists the processes of Start that live, for a copy to
// adopt; the agent is frozen.
func (s *sandbox) heldRecords() []heldRecord {
	var list []heldRecord
	for _, p := range s.Processes() {
		if isDone(p.p.Done()) {
			continue // its Exit came before the freeze: it ended
		}
		c := p.cmd
		list = append(list, heldRecord{Run: p.p.ID(), PID: p.PID(), Name: c.Name, Args: c.Args, Dir: c.Dir,
			TTY: p.tty, MaxOutput: c.MaxOutputBytes, Start: p.start})
	}
	return list
}

// inspectArchive checks the archive at path as a restore needs it whole,
// and returns what its config.dump says and its size.
func inspectArchive(path string) (ckpt.Info, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return ckpt.Info{}, 0, err
	}
	defer f.Close()
	info, err := ckpt.Inspect(f)
	if err != nil {
		return info, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		return info, 0, err
	}
	return info, fi.Size(), nil
}

// Restore makes a new sandbox from checkpoint cp, created and running,
// on the Podman service the options find as [New] finds one: the
// sandbox's processes go on from the checkpoint's instant, in a
// container of their own (its own ID, name, labels and owner: the
// caller), reached through the same calls as any sandbox, which the
// caller removes. Restore may be called at once for many copies of one
// checkpoint.
//
// What a copy keeps, and what it cannot:
//
//   - A process held by handle at the checkpoint ([Start]) goes on in
//     the copy; [Processes] of the copy returns a new handle on it (its
//     Command has the original's Name, Args, Dir and MaxOutputBytes, not
//     its Env, Stdin, Stdout, Stderr and Timeout; output from the
//     checkpoint's instant on).
//   - A Run in flight at the checkpoint is the original's: it is killed
//     in the copy, unheard. So are connections of [Dial] and [Forward].
//   - Memory is the same in every copy: a random generator seeded before
//     the checkpoint (a shell's $RANDOM, math/rand with a fixed seed, a
//     generator of UUIDs) yields the same numbers in each; reads of
//     /dev/urandom and getrandom made after the restore differ.
//   - The clocks are the host's: CLOCK_REALTIME and CLOCK_MONOTONIC jump
//     forward by the time since the checkpoint, and timers due in between
//     fire at once.
//   - The hostname is the source's.
//
// Restore trusts the checkpoint: Podman restores what its archive says,
// mounts included. It reads it only from a directory that is the
// caller's alone (mode 0700), and fails with [ErrInvalidConfig] on
// another.
//
// It fails with [ErrCheckpointNotFound] when cp's files are gone,
// [ErrInvalidCheckpoint] when they are not a whole checkpoint, an error
// matching [ErrImageNotFound] when the service lacks the sandbox's
// image (nothing is pulled: the checkpoint holds a layer on top of that
// image, exactly), [ErrNotSupported] as [CheckpointSupport] says or when
// cp was taken by a podvm with another agent, all before anything is
// made. When a later step fails, or ctx ends, what was made is removed.
func Restore(ctx context.Context, cp *Checkpoint, ro RestoreOptions, opts ...Option) (VM, error) {
	cfg, err := cp.copyConfig(ro)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(cp.archive); errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s: its archive %s is gone", ErrCheckpointNotFound, cp.ID, cp.archive)
	}
	// The archive is restored as it says (its mounts, its processes):
	// from a directory that is the caller's alone, which nobody else
	// can have planted it in.
	if err := checkCheckpointDir(filepath.Dir(cp.archive)); err != nil {
		return nil, err
	}
	o := newOptions(opts)
	d, err := o.driver(ctx)
	if err != nil {
		return nil, fmt.Errorf("vm: restore %s: %w", cp.ID, err)
	}
	var v interface {
		VM
		init(driver.Driver, Config) error
		restore(context.Context, *Checkpoint) error
	} = new(CLIVM)
	if _, ok := driver.Lookup(string(o.backend)); ok {
		v = new(sandbox) // as New makes it on a registered backend
	} else if _, ok := d.(podman.API); ok {
		v = new(APIVM)
	}
	if err := v.init(d, cfg); err != nil {
		return nil, err
	}
	if err := v.restore(ctx, cp); err != nil {
		return nil, err
	}
	return v, nil
}

// copyConfig is the Config of a copy of cp that ro describes, checked
// with all Restore can know without cp's files: that cp is a Checkpoint
// of this package's making, whose agent this podvm speaks to, and holds
// no more processes than a sandbox does. The copy's labels are the
// source's, less [LabelPool] (a copy is no pool's sandbox unless ro says
// so), and ro's.
func (cp *Checkpoint) copyConfig(ro RestoreOptions) (Config, error) {
	if cp == nil {
		return Config{}, fmt.Errorf("%w: nil checkpoint", ErrInvalidCheckpoint)
	}
	m := cp.meta
	if m.ID == "" {
		return Config{}, fmt.Errorf("%w: a Checkpoint that TakeCheckpoint, OpenCheckpoint or ListCheckpoints did not return", ErrInvalidCheckpoint)
	}
	if m.Agent != "" {
		if d, err := agent.Digest(m.Arch); err != nil || d != m.Agent {
			return Config{}, fmt.Errorf("%w: restore: checkpoint %s holds another podvm's agent (%s), which this one cannot speak to", ErrNotSupported, cp.ID, m.Agent)
		}
	}
	if len(m.Processes) > MaxProcesses {
		return Config{}, fmt.Errorf("%w: %s holds %d processes of vm.Start, more than a sandbox holds (vm.MaxProcesses %d)", ErrLimit, cp.ID, len(m.Processes), MaxProcesses)
	}
	cfg := m.Config
	cfg.Name = ro.Name
	cfg.Labels = maps.Clone(cfg.Labels)
	if cfg.Labels == nil {
		cfg.Labels = map[string]string{}
	}
	delete(cfg.Labels, LabelPool)
	maps.Copy(cfg.Labels, ro.Labels)
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// restore makes s, new, from cp.
func (s *sandbox) restore(ctx context.Context, cp *Checkpoint) (err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() {
		if err != nil {
			s.d.Close()
			st := s.state()
			st.removed = true
			s.st.Store(&st)
		}
	}()
	s.created = true
	m := cp.meta
	if err := s.checkpointSupport(ctx); err != nil {
		return err
	}
	c := s.d.(driver.Checkpointer)
	if _, err := s.d.Image(ctx, m.Image); err != nil {
		if errors.Is(err, ErrImageNotFound) {
			return fmt.Errorf("vm: restore %s: the checkpoint holds the sandbox's layer on top of image %s, which the service does not have: %w", cp.ID, m.Image, err)
		}
		return fmt.Errorf("vm: restore %s: %w", cp.ID, err)
	}
	id, err := newContainerID()
	if err != nil {
		return err
	}
	name := s.cfg.Name
	if name == "" {
		name = "podvm-" + s.token[:12]
	}
	labels := s.cfg.labels()
	labels[labelToken] = s.token
	labels[LabelCreated] = strconv.FormatInt(time.Now().Unix(), 10)
	labels[LabelRestoredFrom] = cp.ID
	ident := ckpt.Identity{ID: id, Name: name, Labels: labels}
	// The copy's archive: the checkpoint's rewritten for its identity
	// (planned first: a bad archive is refused before anything is made),
	// streamed into an engine that takes it so, else spooled to a file.
	src, plan, err := planCopy(cp.archive, ident)
	if err != nil {
		return fmt.Errorf("vm: restore %s: %w", cp.ID, err)
	}
	defer src.Close()
	var imp func(context.Context) (string, error)
	if si, ok := c.(driver.StreamImporter); ok {
		imp = func(ctx context.Context) (string, error) { return importRewritten(ctx, si, src, plan) }
	} else {
		spool := filepath.Join(filepath.Dir(cp.archive), spoolName(id[:24], "restore"))
		defer os.Remove(spool)
		if err := spoolRewritten(spool, src, plan); err != nil {
			return fmt.Errorf("vm: restore %s: %w", cp.ID, err)
		}
		imp = func(ctx context.Context) (string, error) { return c.Import(ctx, spool) }
	}
	s.made = true // from here on, a failure removes id
	defer func() {
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
			defer cancel()
			if rerr := s.d.Remove(rctx, id); rerr != nil && !errors.Is(rerr, ErrNoSuchContainer) {
				err = errors.Join(err, fmt.Errorf("vm: removing what the failed restore made: %w", rerr))
			}
		}
	}()
	got, err := finishDespiteCancel(ctx, "restore", imp)
	if err != nil {
		return fmt.Errorf("vm: restore %s: %w", cp.ID, err)
	}
	if got != id {
		return fmt.Errorf("%w: restore %s: Podman made container %s, not %s", ErrPodman, cp.ID, got, id)
	}
	st := state{id: id}
	if m.Agent != "" {
		l, err := s.resumeCopy(ctx, c, id, m)
		if err != nil {
			return fmt.Errorf("vm: restore %s: %w", cp.ID, err)
		}
		st.agent = l
	}
	s.st.Store(&st)
	return nil
}

// resumeCopy reaches the agent of copy id, restored from m, and adopts
// the processes m lists as s's.
func (s *sandbox) resumeCopy(ctx context.Context, c driver.Checkpointer, id string, m checkpointMeta) (*link, error) {
	procs := make([]*Process, len(m.Processes))
	adopt := make([]agent.Adoption, len(m.Processes))
	for i, h := range m.Processes {
		cmd := exec.Command{Name: h.Name, Args: h.Args, Dir: h.Dir, MaxOutputBytes: h.MaxOutput}
		p, stdin, w := s.newProcess(cmd, h.TTY, h.Start)
		procs[i] = p
		adopt[i] = agent.Adoption{ID: h.Run, PID: h.PID, Stdin: stdin, Stdout: w[0], Stderr: w[1]}
	}
	hctx, cancel := context.WithTimeout(ctx, agentHello)
	defer cancel()
	rw, err := c.AttachRunning(hctx, id)
	if err != nil {
		return nil, err
	}
	client, aps, err := agent.ResumeCopy(hctx, rw, m.NextRun, adopt)
	if err != nil {
		return nil, fmt.Errorf("the copy's agent did not answer: %w", err)
	}
	for i, p := range procs {
		s.reserve(&s.procs, MaxProcesses) // Restore checked there is room
		s.hold(p, aps[i])
	}
	return newLink(client, nil, nil), nil
}

// newContainerID returns a container ID as Podman makes them.
func newContainerID() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return hex.EncodeToString(b[:]), nil
}

// planCopy opens the archive at path and plans its rewrite for id,
// checking it whole (without reading CRIU's pages).
func planCopy(path string, id ckpt.Identity) (*os.File, *ckpt.Plan, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, archiveError(path, err)
	}
	plan, err := ckpt.PlanRewrite(f, id)
	if err != nil {
		f.Close()
		return nil, nil, archiveError(path, err)
	}
	return f, plan, nil
}

// spoolRewritten writes to dst, a new file, the archive src rewritten as
// plan says: the kernel copies what passes through.
func spoolRewritten(dst string, src *os.File, plan *ckpt.Plan) error {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = plan.Copy(out, src)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return archiveError(src.Name(), err)
}

// importRewritten uploads the archive src, rewritten as plan says while
// it is read, to the engine's import. A copy that fails (src cut short
// since it was planned, a read error) ends the upload with its error
// (the engine makes nothing of a cut archive), and is the error
// returned.
func importRewritten(ctx context.Context, si driver.StreamImporter, src *os.File, plan *ckpt.Plan) (string, error) {
	pr, pw := io.Pipe()
	copied := make(chan error, 1)
	go func() {
		_, err := plan.Copy(pw, src)
		pw.CloseWithError(err) // nil: the upload's end
		copied <- err
	}()
	got, err := si.ImportStream(ctx, pr)
	pr.CloseWithError(errImportEnded) // a copy the import stopped reading ends
	if cerr := <-copied; cerr != nil && !errors.Is(cerr, errImportEnded) {
		return "", archiveError(src.Name(), cerr)
	}
	return got, err
}

// errImportEnded ends a rewrite whose import stopped reading it.
var errImportEnded = errors.New("the import ended")

// archiveError is err, met reading the checkpoint archive at src, as
// Restore names it: ErrCheckpointNotFound when src is gone,
// ErrInvalidCheckpoint when it is no whole archive.
func archiveError(src string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w: %s is gone", ErrCheckpointNotFound, src)
	case errors.Is(err, ckpt.ErrInvalid):
		return fmt.Errorf("%w: %w", ErrInvalidCheckpoint, err)
	}
	return err
}
