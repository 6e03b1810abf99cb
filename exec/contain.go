package exec

import (
	"errors"
	"fmt"

	"github.com/podvm/podvm/internal/cgroup"
)

// ErrUnsupported: what was asked cannot be enforced here: a [Containment]
// this host or this program does not offer, or a limit the executor's
// containment cannot apply. Nothing ran. It also matches
// [errors.ErrUnsupported].
var ErrUnsupported error = unsupported{}

type unsupported struct{}

func (unsupported) Error() string        { return "exec: not supported here" }
func (unsupported) Is(target error) bool { return target == errors.ErrUnsupported }

// Containment is how a [CommandExecutor] keeps hold of everything a
// command starts, so that a timeout, a cancellation or the end of the run
// kills all of it. From the strongest to the weakest:
//
//   - [ContainCgroup] (Linux, a writable cgroup v2 with cgroup.kill, 5.14+):
//     each run gets a cgroup of its own, entered by the command at clone
//     (nothing runs outside it, even for an instant) and killed whole with
//     cgroup.kill, then removed before Run returns; a watcher process
//     kills it when the caller dies mid-run. Nothing a process does to
//     detach, setsid, double fork, a cleared environment, a new name or a
//     fork bomb, takes it out of its cgroup (one that means to escape
//     can, as the caller's user, write itself into another cgroup:
//     hostile code belongs in a sandbox). Usage counts the whole tree;
//     memory and pids limits are enforced by the kernel where the parent
//     cgroup gives run cgroups those controllers.
//   - [ContainSubreaper] (Linux, a program that calls [Init]): each run
//     gets a small helper process, this program re-executed, that is the
//     child subreaper (PR_SET_CHILD_SUBREAPER) of the command: every
//     orphan of the tree, whatever its session, group or name, becomes its
//     child, and it kills and reaps them all until none is left. If the
//     calling program dies, the helper sees it and kills the run.
//   - [ContainProcessGroup] (every Unix system; the only one off Linux):
//     the command runs in a process group of its own, and that group is
//     killed. A process that leaves the group (setsid, setpgid) escapes;
//     Run still returns on time (see [DefaultKillGrace]), but the escaped
//     process lives on.
//
// The zero value, [ContainAuto], picks the strongest the host and the
// program offer.
type Containment int

const (
	// ContainAuto picks ContainCgroup where it works, else
	// ContainSubreaper where [Init] was called, else ContainProcessGroup.
	ContainAuto Containment = iota
	// ContainCgroup: a cgroup v2 per run, killed with cgroup.kill.
	ContainCgroup
	// ContainSubreaper: a subreaper helper process per run.
	ContainSubreaper
	// ContainProcessGroup: a process group per run.
	ContainProcessGroup
)

// String returns "auto", "cgroup", "subreaper" or "process-group".
func (c Containment) String() string {
	switch c {
	case ContainAuto:
		return "auto"
	case ContainCgroup:
		return "cgroup"
	case ContainSubreaper:
		return "subreaper"
	case ContainProcessGroup:
		return "process-group"
	}
	return fmt.Sprintf("Containment(%d)", int(c))
}

// WithContainment requires a containment instead of the best available
// one. When the host or the program cannot offer it, every Run fails with
// an error matching [ErrUnsupported], and [CommandExecutor.Containment]
// says why.
func WithContainment(c Containment) Option {
	return optionFunc(func(e *CommandExecutor) { e.want = c })
}

// WithCgroupParent sets the cgroup v2 directory under which run cgroups
// are created (for instance a delegated, process-free cgroup whose
// cgroup.subtree_control enables memory and pids, so limits work),
// instead of the calling process's own cgroup.
func WithCgroupParent(dir string) Option {
	return optionFunc(func(e *CommandExecutor) { e.cgroupDir = dir })
}

// Containment returns the containment the executor's runs get, never
// [ContainAuto]. The choice is made once, on the first call to
// Containment or Run. The error, matching [ErrUnsupported], says why a
// containment required by [WithContainment] is not available.
func (e *CommandExecutor) Containment() (Containment, error) {
	e.once.Do(e.choose)
	return e.mode, e.modeErr
}

// limitError checks that the executor's containment can enforce cmd's
// limits, returning an error matching [ErrUnsupported] when it cannot.
func (e *CommandExecutor) limitError(cmd Command) error {
	if cmd.MaxMemoryBytes == 0 && cmd.MaxPids == 0 && cmd.MaxCPUTime == 0 {
		return nil
	}
	unsupported := func(what, why string) error {
		return fmt.Errorf("%w: %s: %s %s", ErrUnsupported, cmd.Name, what, why)
	}
	memory, pids := e.controllers()
	switch {
	case cmd.MaxMemoryBytes > 0 && !memory:
		return unsupported("MaxMemoryBytes", e.controllerWhy("memory"))
	case cmd.MaxPids > 0 && !pids:
		return unsupported("MaxPids", e.controllerWhy("pids"))
	case cmd.MaxCPUTime > 0 && (e.mode == ContainProcessGroup || !helperReady()):
		return unsupported("MaxCPUTime", "needs the subreaper helper (a Linux program that calls exec.Init) and a cgroup or subreaper containment")
	}
	return nil
}

func (e *CommandExecutor) controllerWhy(name string) string {
	if e.mode != ContainCgroup {
		return "needs the cgroup containment; this executor's is " + e.mode.String()
	}
	return "needs the " + name + " controller in " + e.cgroupParentDir() + "/cgroup.subtree_control"
}

// choose settles the executor's containment, once.
func (e *CommandExecutor) choose() {
	unsupported := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrUnsupported}, a...)...)
	}
	switch e.want {
	case ContainAuto:
		e.mode = ContainProcessGroup
		if p, err := cgroup.Find(e.cgroupDir); err == nil {
			e.mode, e.parent = ContainCgroup, p
		} else if helperReady() {
			e.mode = ContainSubreaper
		}
	case ContainCgroup:
		e.mode = ContainCgroup
		if e.parent, e.modeErr = cgroup.Find(e.cgroupDir); e.modeErr != nil {
			e.modeErr = unsupported("cgroup containment: %v", e.modeErr)
		}
	case ContainSubreaper:
		e.mode = ContainSubreaper
		if !helperReady() {
			e.modeErr = unsupported("subreaper containment: %s", helperWhy)
		}
	case ContainProcessGroup:
		e.mode = ContainProcessGroup
	default:
		e.mode, e.modeErr = e.want, unsupported("unknown containment %v", e.want)
	}
}

// controllers reports which cgroup limits the executor's runs can get.
func (e *CommandExecutor) controllers() (memory, pids bool) {
	if e.mode != ContainCgroup || e.parent == nil {
		return false, false
	}
	return e.parent.Controllers()
}

func (e *CommandExecutor) cgroupParentDir() string {
	if e.parent == nil {
		return "the parent cgroup"
	}
	return e.parent.Dir()
}

// newCgroup starts creating the run's cgroup, where the containment has
// one, while Run prepares the rest (the kernel's mkdir of a cgroup takes
// about as long as making the two pipes). The returned function waits for
// it; it must be called once.
func (e *CommandExecutor) newCgroup(cmd Command) func() (*cgroup.Run, error) {
	if e.mode != ContainCgroup {
		return func() (*cgroup.Run, error) { return nil, nil }
	}
	type made struct {
		cg  *cgroup.Run
		err error
	}
	ch := make(chan made, 1)
	go func() {
		cg, err := e.parent.New(cgroup.Limits{MemoryBytes: cmd.MaxMemoryBytes, Pids: int64(cmd.MaxPids)})
		ch <- made{cg, err}
	}()
	return func() (*cgroup.Run, error) {
		m := <-ch
		if m.err != nil {
			return nil, fmt.Errorf("exec: %s: %w", cmd.Name, m.err)
		}
		return m.cg, nil
	}
}

// start starts cmd under the executor's containment, in the cgroup that
// newCgroup made (none without the cgroup containment), with the given
// environment (nil: the calling process's) and standard files. The
// cgroup is removed when the start fails.
func (e *CommandExecutor) start(cmd Command, env []string, files stdio, cg *cgroup.Run) (proc, error) {
	var p proc
	var err error
	if e.mode == ContainSubreaper || cmd.MaxCPUTime > 0 {
		p, err = startHelper(cmd, env, files, cg)
	} else {
		p, err = startDirect(cmd, env, files, cg)
	}
	if err != nil && cg != nil {
		cg.Remove()
	}
	return p, err
}
