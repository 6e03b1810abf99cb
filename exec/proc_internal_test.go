package exec

import (
	"context"
	"os"
	"testing"
)

// A proc's kill is safe after its end: by then its cgroup may serve the
// next run, which a kill arriving late (a timeout firing as the command
// exits) must not touch.
func TestKillAfterEndSparesTheNextRun(t *testing.T) {
	x := NewCommandExecutor(WithContainment(ContainCgroup))
	if _, err := x.Containment(); err != nil {
		t.Skip(err)
	}
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	for _, c := range []struct {
		name string
		cmd  Command
	}{
		{"direct", Command{Name: "true"}},
		{"helper", Command{Name: "true", MaxCPUTime: 10e9}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := x.Run(context.Background(), c.cmd); err != nil { // runs that follow one another
				t.Fatal(err)
			}
			cg, err := x.newCgroup(c.cmd)()
			if err != nil {
				t.Fatal(err)
			}
			p, err := x.start(c.cmd, nil, stdio{out: null, err: null}, cg)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.end(); err != nil {
				t.Fatal(err)
			}
			p.kill() // late: the cgroup is kept for the next run
			res, err := x.Run(context.Background(), c.cmd)
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("the next run, in the same cgroup: %+v, %v", res, err)
			}
		})
	}
}
