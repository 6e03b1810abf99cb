package exec_test

import (
	"bytes"
	"context"
	osexec "os/exec"
	"testing"
	"time"

	"github.com/podvm/podvm/exec"
)

// BenchmarkRunOverhead runs /bin/true through CommandExecutor, under each
// containment this host offers, and through plain os/exec (capturing both
// streams, as Run does) alternately in the same loop, so machine noise
// hits both alike; "ratio" is podvm's time over os/exec's. The default
// row is what NewCommandExecutor() picks here.
func BenchmarkRunOverhead(b *testing.B) {
	for _, c := range []struct {
		name string
		opts []exec.Option
	}{
		{"default", nil},
		{"cgroup", []exec.Option{exec.WithContainment(exec.ContainCgroup)}},
		{"subreaper", []exec.Option{exec.WithContainment(exec.ContainSubreaper)}},
		{"process-group", []exec.Option{exec.WithContainment(exec.ContainProcessGroup)}},
	} {
		x := exec.NewCommandExecutor(c.opts...)
		mode, err := x.Containment()
		if err != nil {
			b.Logf("%s: %v", c.name, err)
			continue
		}
		b.Run(c.name, func(b *testing.B) {
			b.Logf("containment %v", mode)
			benchOverhead(b, x)
		})
	}
}

func benchOverhead(b *testing.B, x *exec.CommandExecutor) {
	ctx := context.Background()
	var podvm, plain time.Duration
	for b.Loop() {
		t0 := time.Now()
		if _, err := x.Run(ctx, exec.Command{Name: "/bin/true"}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		var out, errb bytes.Buffer
		c := osexec.Command("/bin/true")
		c.Stdout, c.Stderr = &out, &errb
		if err := c.Run(); err != nil {
			b.Fatal(err)
		}
		podvm += t1.Sub(t0)
		plain += time.Since(t1)
	}
	b.ReportMetric(float64(podvm)/float64(b.N), "podvm-ns/op")
	b.ReportMetric(float64(plain)/float64(b.N), "osexec-ns/op")
	b.ReportMetric(float64(podvm)/float64(plain), "ratio")
}
