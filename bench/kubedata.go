package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/kube"
)

// The kube section's data rows: stdout through a Run on the direct
// channel (TCP to the pod's agent), on the attach stream alone
// (kube.WithAttachOnly) and through exec sessions, against `kubectl exec
// POD -- head -c N /dev/zero` into /dev/null; the direct channel's
// throughput with kubeStreams Runs at once against one; and a Run's round
// trip while a bulk copy runs beside it.

// Names of the data rows.
const (
	nameKubeDirect  = "podvm kube, agent, direct channel"
	nameKubeAttach  = "podvm kube, agent, attach stream alone (`kube.WithAttachOnly`)"
	nameKubectlHead = "`kubectl exec POD -- head -c N /dev/zero` into /dev/null (a process)"
	nameKubeOne     = "one Run of N bytes"
	nameKubeMany    = "16 Runs of N/16 bytes at once"
)

// kubeStreams is how many Runs share the channel in the concurrency row.
const kubeStreams = 16

// The data targets.
const (
	kubeDirectVsPodman  = 0.5 // the direct channel's stdout MiB/s, against Podman's socket path's (podvm API)
	kubeAttachVsKubectl = 0.9 // the attach stream's, against kubectl exec's
	kubeManyVsOne       = 0.8 // kubeStreams Runs' MiB/s together, against one Run's
	kubeBesideTarget    = 3 * time.Millisecond
)

// kubeDataResult is what the data rows measured.
type kubeDataResult struct {
	n      int64
	stream []*series // direct, attach, exec sessions, kubectl: n bytes each
	many   []*series // direct: one Run of n against kubeStreams of n/kubeStreams
	beside *series   // direct: a Run of true while a bulk copy runs
	bulk   int64     // the bulk copy's bytes
	skip   string
}

// kubeData measures the data rows with the direct channel's sandbox
// direct, the exec path's viaExec and kubectl's pod (each may be nil or
// "": its rows then say why not).
func (b *bench) kubeData(ctx context.Context, c *cluster, cfg vm.Config, direct, viaExec vm.VM, pod string) error {
	r := &b.kube.data
	r.n = b.sz.streamBytes / 4 // the attach stream takes seconds per 64 MiB
	if direct == nil {
		r.skip = "no sandbox of the agent's path"
		return nil
	}
	attachOnly := backend{name: nameKubeAttach, new: func(ctx context.Context, _ string, cfg vm.Config) (vm.VM, error) {
		return kube.New(ctx, cfg, append(c.opts, kube.WithAttachOnly())...)
	}}
	attach, why := c.sandbox(ctx, attachOnly, cfg)
	alts := []alt{{name: nameKubeDirect, op: vmStream(direct, r.n)}, {name: nameKubeAttach, skip: why}}
	if attach != nil {
		alts[1].op = vmStream(attach, r.n)
	}
	if viaExec != nil {
		alts = append(alts, alt{name: nameKubeExec, op: vmStream(viaExec, r.n)})
	}
	kc := alt{name: nameKubectlHead, skip: c.kubectlWhy}
	if pod != "" {
		kc.op, kc.skip = c.execHead(pod, r.n), ""
	}
	alts = append(alts, kc)
	var err error
	if r.stream, err = measure(ctx, "kube: stdout throughput", alts, 1, b.sz.stream, b.sz.budget); err != nil {
		return err
	}

	many := []alt{{name: nameKubeOne, op: vmStream(direct, r.n)}, {name: nameKubeMany, op: func(ctx context.Context) error {
		return together(ctx, kubeStreams, vmStream(direct, r.n/kubeStreams))
	}}}
	if r.many, err = measure(ctx, "kube: concurrent streams", many, 1, b.sz.stream, b.sz.budget); err != nil {
		return err
	}

	// A Run's round trip while a copy of r.bulk bytes goes on beside it,
	// the copy started again while the measure lasts.
	r.bulk = 4 * r.n
	bctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for bctx.Err() == nil {
			_ = vmStream(direct, r.bulk)(bctx)
		}
	}()
	time.Sleep(200 * time.Millisecond) // the copy is under way
	beside, err := measure(ctx, "kube: round trip beside a copy", []alt{{name: nameKubeDirect, op: vmTrue(direct)}}, b.sz.warm, b.sz.exec, b.sz.budget)
	stop()
	wg.Wait()
	if err != nil {
		return err
	}
	r.beside = beside[0]
	return nil
}

// together runs n copies of o at once and returns the first error.
func together(ctx context.Context, n int, o op) error {
	errs := make(chan error, n)
	for range n {
		go func() { errs <- o(ctx) }()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// execHead is `kubectl exec POD -- head -c n /dev/zero`, its output
// counted into /dev/null.
func (c *cluster) execHead(pod string, n int64) op {
	return func(ctx context.Context) error {
		cmd := c.command(ctx, "exec", pod, "--", "head", "-c", strconv.FormatInt(n, 10), "/dev/zero")
		var count countWriter
		cmd.Stdout = &count
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("kubectl exec: %w", err)
		}
		if count.n != n {
			return fmt.Errorf("kubectl exec printed %d bytes, want %d", count.n, n)
		}
		return nil
	}
}

// countWriter counts what is written to it.
type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// reportKubeData writes the data rows' tables.
func (b *bench) reportKubeData(w io.Writer) {
	r := b.kube.data
	if r.skip != "" {
		fmt.Fprintf(w, "\n**Kubernetes, data**: skipped: %s\n", r.skip)
		return
	}
	reportThroughput(w, fmt.Sprintf("**Kubernetes, stdout throughput** of %s: `head -c N /dev/zero`, through a Run into its 1 MiB capped capture, %s", mib(r.n), runs(r.stream)),
		r.stream, r.n, nameKubectlHead, "`kubectl exec`")
	reportThroughput(w, fmt.Sprintf("**Kubernetes, streams at once** on the direct channel: %s in one Run, and in %d Runs of %s at once, %s", mib(r.n), kubeStreams, mib(r.n/kubeStreams), runs(r.many)),
		r.many, r.n, nameKubeOne, "one Run")
	if r.beside != nil {
		reportP50(w, fmt.Sprintf("**Kubernetes, a Run's round trip beside a copy**: `true` through the direct channel while Runs of %s of stdout follow one another on the same sandbox;", mib(r.bulk)), []*series{r.beside}, "", "")
	}
}

// reportKubeDataTargets writes the data rows' verdicts.
func (b *bench) reportKubeDataTargets(w io.Writer, verdict func(what, measured string, have, pass bool, bound string)) {
	r := b.kube.data
	rate := func(ss []*series, name string, n int64) (float64, bool) {
		s := find(ss, name)
		if s == nil || !s.ok() {
			return 0, false
		}
		return mibps(n, s.p50()), true
	}
	direct, okD := rate(r.stream, nameKubeDirect, r.n)
	podman, okP := rate(b.streamRes, nameAPIVM, b.sz.streamBytes)
	verdict(fmt.Sprintf("kube, direct channel: stdout ≥ %.1f× Podman's socket path (%s)", kubeDirectVsPodman, nameAPIVM),
		fmt.Sprintf("%.2f× (%.0f vs %.0f MiB/s)", direct/podman, direct, podman), okD && okP, direct >= kubeDirectVsPodman*podman,
		"the pod network (a veth pair and a bridge) and the record layer's AES-GCM on both ends, on two cores shared with the cluster")
	attach, okA := rate(r.stream, nameKubeAttach, r.n)
	kubectl, okK := rate(r.stream, nameKubectlHead, r.n)
	verdict(fmt.Sprintf("kube, attach stream alone: stdout ≥ %.1f× `kubectl exec`'s", kubeAttachVsKubectl),
		fmt.Sprintf("%.2f× (%.0f vs %.0f MiB/s)", attach/kubectl, attach, kubectl), okA && okK, attach >= kubeAttachVsKubectl*kubectl,
		"the relay through the API server, the kubelet and containerd, which both cross")
	one, ok1 := rate(r.many, nameKubeOne, r.n)
	many, okM := rate(r.many, nameKubeMany, r.n)
	verdict(fmt.Sprintf("kube, direct channel: %d Runs at once ≥ %.1f× one Run's MiB/s", kubeStreams, kubeManyVsOne),
		fmt.Sprintf("%.2f× (%.0f vs %.0f MiB/s)", many/one, many, one), ok1 && okM, many >= kubeManyVsOne*one,
		"the agent's per-run shims and pipes, and the peers' count (4)")
	have := r.beside != nil && r.beside.ok()
	measured := ""
	if have {
		measured = ms(r.beside.p50())
	}
	verdict(fmt.Sprintf("kube, direct channel: a Run's round trip p50 ≤ %s beside a bulk copy", ms(kubeBesideTarget)), measured, have,
		have && r.beside.p50() <= kubeBesideTarget, "the copy's share of the two cores")
}
