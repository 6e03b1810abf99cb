package kube_test

import (
	"context"
	"os"
	osexec "os/exec"
	"testing"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/kube"
)

// The targets, measured in one run on the cluster the
// integration tests use: a Run's round trip against `kubectl exec`'s,
// runs per second at 16 callers, a fresh sandbox to its first result
// against `kubectl run --rm -i`. `go test -run '^$' -bench . ./vm/kube/`
// with the integration tests' variables, and PODVM_KUBECTL for kubectl's
// rows.

func benchBox(b *testing.B, viaExec bool) vm.VM {
	e := need(b)
	ctx := context.Background()
	v, err := kube.New(ctx, e.config(vm.Config{PodmanExec: viaExec}), e.options()...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = v.Remove(context.Background()) })
	if err := v.Create(ctx); err != nil {
		b.Fatal(err)
	}
	return v
}

func benchRuns(b *testing.B, v vm.VM) {
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		if _, err := v.Run(ctx, exec.Command{Name: "true"}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRun is a Run's round trip through the agent.
func BenchmarkRun(b *testing.B) { benchRuns(b, benchBox(b, false)) }

// BenchmarkRunExec is a Run's round trip as an exec session.
func BenchmarkRunExec(b *testing.B) { benchRuns(b, benchBox(b, true)) }

// BenchmarkRun16 is Runs from 16 callers on one sandbox: ns/op is the
// inverse of the throughput.
func BenchmarkRun16(b *testing.B) {
	v := benchBox(b, false)
	ctx := context.Background()
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := v.Run(ctx, exec.Command{Name: "true"}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkFirstResult is a fresh sandbox to its first result (Create
// and one Run; Remove is not counted).
func BenchmarkFirstResult(b *testing.B) {
	e := need(b)
	ctx := context.Background()
	for b.Loop() {
		v, err := kube.New(ctx, e.config(vm.Config{}), e.options()...)
		if err != nil {
			b.Fatal(err)
		}
		err = v.Create(ctx)
		if err == nil {
			_, err = v.Run(ctx, exec.Command{Name: "true"})
		}
		b.StopTimer()
		_ = v.Remove(ctx)
		b.StartTimer()
		if err != nil {
			b.Fatal(err)
		}
	}
}

func kubectl(b *testing.B) (string, env) {
	e := need(b)
	k := os.Getenv("PODVM_KUBECTL")
	if k == "" {
		b.Skip("set PODVM_KUBECTL for kubectl's rows")
	}
	return k, e
}

// BenchmarkKubectlExec is `kubectl exec POD -- true`, the baseline of a
// Run's round trip.
func BenchmarkKubectlExec(b *testing.B) {
	k, e := kubectl(b)
	v := benchBox(b, true)
	b.ResetTimer()
	for b.Loop() {
		if out, err := osexec.Command(k, "-n", e.namespace, "exec", v.ID(), "--", "true").CombinedOutput(); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
	}
}

// BenchmarkKubectlRun is `kubectl run --rm -i … -- true`, the baseline of
// a fresh sandbox's first result (its deletion included: kubectl waits
// for it).
func BenchmarkKubectlRun(b *testing.B) {
	k, e := kubectl(b)
	for b.Loop() {
		name := "podvm-bench-" + time.Now().Format("150405.000000")
		name = name[:len(name)-7] + name[len(name)-6:]
		if out, err := osexec.Command(k, "-n", e.namespace, "run", name, "--rm", "-i", "--restart=Never",
			"--image="+e.image, "--image-pull-policy=Never", "--labels="+runLabel+"="+runID, "--", "true").CombinedOutput(); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
	}
}
