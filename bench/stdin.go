package main

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// Row names of the stdin comparison.
const (
	nameCLIStdin  = "`podman exec -i …` fed through a pipe"
	nameRuncStdin = "`runc exec …` fed through a pipe (the floor)"
)

// stdinArgv reads its stdin to the end into /dev/null.
var stdinArgv = []string{"dd", "of=/dev/null", "bs=" + strconv.Itoa(streamBlock), "status=none"}

// zeros is an endless reader of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// vmStdin is a Run of stdinArgv in v fed n zero bytes.
func vmStdin(v vm.VM, n int64) op {
	cmd := exec.Command{Name: stdinArgv[0], Args: stdinArgv[1:]}
	return func(ctx context.Context) error {
		c := cmd
		c.Stdin = io.LimitReader(zeros{}, n)
		res, err := v.Run(ctx, c)
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
		}
		return err
	}
}

// stdins feeds the same n bytes to a command that reads them into
// /dev/null: podvm's Run with Stdin on each backend against `podman exec
// -i` and `runc exec` fed by this process through a pipe.
func (b *bench) stdins(ctx context.Context) error {
	n := b.sz.streamBytes
	input := func() io.Reader { return io.LimitReader(zeros{}, n) }
	alts := b.vmAlts(func(v vm.VM) op { return vmStdin(v, n) })
	alts = append(alts,
		alt{name: nameCLIStdin, op: func(ctx context.Context) error {
			c := b.p.command(ctx, append([]string{"exec", "-i", b.base}, stdinArgv...)...)
			c.Stdin = input()
			return toDevNull(c)
		}},
		b.runcAlt(nameRuncStdin, func(r *runc) op {
			return func(ctx context.Context) error {
				c := r.command(ctx, b.base, stdinArgv)
				c.Stdin = input()
				return toDevNull(c)
			}
		}),
	)
	var err error
	b.stdinRes, err = measure(ctx, "stdin throughput", alts, 1, b.sz.stream, b.sz.budget)
	return err
}

func (b *bench) reportStdin(w io.Writer) {
	n := b.sz.streamBytes
	reportThroughput(w, fmt.Sprintf("**Stdin throughput** of %s into `%s`, %s", mib(n), shellLine(stdinArgv), runs(b.stdinRes)),
		b.stdinRes, n, nameRuncStdin, "runc")
}
