package exec

import (
	"errors"
	"os"
	osexec "os/exec"
	"sync"

	"github.com/podvm/podvm/internal/cgroup"
)

// stdio holds a command's standard files; in is nil for an empty input.
type stdio struct{ in, out, err *os.File }

// proc is a started run, whatever contains it.
type proc interface {
	// kill kills the whole run now. It is safe at any time, concurrently
	// with end and after it.
	kill()
	// end waits for the command to exit, kills and reaps what it left
	// and reports how the command ended. It is called once.
	end() (outcome, error)
}

// outcome is how a command ended.
type outcome struct {
	code   int  // exit status, or 128+signal
	killed bool // it died by SIGKILL
	usage  *Usage
}

// directProc is a command started by this process: in a process group of
// its own, and in a cgroup of its own when cg is not nil.
type directProc struct {
	c  *osexec.Cmd
	cg *cgroup.Run

	mu     sync.Mutex
	reaped bool // the command has been reaped: its pid is no longer ours (process group only)
}

func startDirect(cmd Command, env []string, files stdio, cg *cgroup.Run) (proc, error) {
	c := osexec.Command(cmd.Name, cmd.Args...)
	c.Dir, c.Env = cmd.Dir, env
	c.Stdout, c.Stderr = files.out, files.err
	if files.in != nil { // not a typed nil: os/exec would close fd 0
		c.Stdin = files.in
	}
	setProcessGroup(c)
	if cg != nil {
		enterCgroup(c, cg.FD())
	}
	if err := c.Start(); err != nil {
		return nil, startError(cmd.Name, err)
	}
	return &directProc{c: c, cg: cg}, nil
}

func (p *directProc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.reaped {
		p.killAll()
	}
}

func (p *directProc) killAll() {
	if p.cg != nil {
		p.cg.Kill()
	} else {
		killGroup(p.c.Process.Pid)
	}
}

func (p *directProc) end() (outcome, error) {
	var waitErr error
	if p.cg == nil {
		// The command has exited but is not reaped: its pid, hence its
		// group id, cannot be reused while what it left is killed.
		awaitExit(p.c.Process.Pid)
		p.mu.Lock()
		killGroup(p.c.Process.Pid)
		p.reaped = true
		p.mu.Unlock()
		waitErr = p.c.Wait()
	} else {
		// A cgroup is killed by its directory, not by a pid that could be
		// reused: what the command left is killed by Finish.
		waitErr = p.c.Wait()
	}

	var out outcome
	out.code, out.killed = exitStatus(p.c.ProcessState)
	out.usage = rusage(p.c.ProcessState)
	var err error
	if waitErr != nil {
		if ee := (*osexec.ExitError)(nil); !errors.As(waitErr, &ee) {
			err = waitErr
		}
	}
	if p.cg != nil {
		err = errors.Join(err, finishCgroup(p.cg, &out))
	}
	return out, err
}

// finishCgroup kills what is left in the run's cgroup, takes the whole
// run's usage from it and removes it. Where the cgroup does not measure
// memory, the peak stays the one out has.
func finishCgroup(cg *cgroup.Run, out *outcome) error {
	user, system, peak, err := cg.Finish()
	if peak < 0 {
		peak = 0
		if out.usage != nil {
			peak = out.usage.PeakRSS
		}
	}
	out.usage = &Usage{UserCPU: user, SystemCPU: system, PeakRSS: peak}
	return err
}
