package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/podvm/podvm/vm"
	"github.com/podvm/podvm/vm/kube"
)

// The kube section's data rows: stdout through a Run on the direct
// channel (TCP to the pod's agent), on the attach stream alone
// (kube.WithAttachOnly) and through exec sessions, against `kubectl exec
// POD -- head -c N /dev/zero` into /dev/null and the pod network's own
// TCP (the floor); stdin on both channels, against the floor the other
// way; the files rows' tree in and out on the direct channel; each
// channel's throughput with kubeStreams Runs at once against one; and a
// Run's round trip while a bulk copy runs beside it.

// Names of the data rows.
const (
	nameKubeDirect  = "podvm kube, agent, direct channel"
	nameKubeAttach  = "podvm kube, agent, attach stream alone (`kube.WithAttachOnly`)"
	nameKubectlHead = "`kubectl exec POD -- head -c N /dev/zero` into /dev/null (a process)"
	nameKubeOne     = "one Run of N bytes"
	nameKubeMany    = "16 Runs of N/16 bytes at once"
	nameFloorOut    = "the pod network: N bytes from `nc` in a pod of kubectl's, read by this process (the floor)"
	nameFloorIn     = "the pod network: N bytes from this process into `nc` in a pod of kubectl's (the floor)"
	nameAttachOne   = "attach stream alone: one Run of N bytes"
	nameAttachMany  = "attach stream alone: 16 Runs of N/16 bytes at once"
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
	stdin  []*series // direct, attach: n bytes of stdin each
	in     []*series // direct: the files rows' tree in
	out    []*series // direct: and out
	many   []*series // direct, then attach alone: one Run of n against kubeStreams of n/kubeStreams
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
	floorOut, floorIn := c.floor(ctx, r.n)
	alts = append(alts, floorOut)
	var err error
	if r.stream, err = measure(ctx, "kube: stdout throughput", alts, 1, b.sz.stream, b.sz.budget); err != nil {
		return err
	}

	stdin := []alt{{name: nameKubeDirect, op: vmStdin(direct, r.n)}, {name: nameKubeAttach, skip: why}, floorIn}
	if attach != nil {
		stdin[1].op = vmStdin(attach, r.n)
	}
	if r.stdin, err = measure(ctx, "kube: stdin throughput", stdin, 1, b.sz.stream, b.sz.budget); err != nil {
		return err
	}
	if err := b.kubeFiles(ctx, direct); err != nil {
		return err
	}

	many := []alt{{name: nameKubeOne, op: vmStream(direct, r.n)}, {name: nameKubeMany, op: func(ctx context.Context) error {
		return together(ctx, kubeStreams, vmStream(direct, r.n/kubeStreams))
	}}, {name: nameAttachOne, skip: why}, {name: nameAttachMany, skip: why}}
	if attach != nil {
		many[2].op = vmStream(attach, r.n)
		many[3].op = func(ctx context.Context) error { return together(ctx, kubeStreams, vmStream(attach, r.n/kubeStreams)) }
	}
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

// floorPorts are the floor pod's servers: floorOutPort sends the bytes
// and closes, floorInPort reads them to the end.
const floorOutPort, floorInPort = 7005, 7004

// floor returns the pod network's throughput rows, both ways, with n
// bytes: TCP between this process and busybox nc in a pod of kubectl's,
// no podvm, no encryption; skipped, saying why, when the pod cannot be
// made or this process does not reach its address. The pod goes with the
// section's.
func (c *cluster) floor(ctx context.Context, n int64) (out, in alt) {
	out, in = alt{name: nameFloorOut, skip: c.kubectlWhy}, alt{name: nameFloorIn, skip: c.kubectlWhy}
	if c.kubectl == "" {
		return out, in
	}
	// dd in blocks of 64 KiB, as the Runs' stdout rows: busybox head
	// writes 4 KiB at a time, which bounded a first version at 76 MiB/s.
	send := fmt.Sprintf("dd if=/dev/zero bs=65536 count=%d", n/65536)
	if n%65536 != 0 {
		send = fmt.Sprintf("head -c %d /dev/zero", n)
	}
	script := fmt.Sprintf("nc -ll -p %d -e %s & nc -ll -p %d -e dd of=/dev/null bs=65536 & exec sleep 3600",
		floorOutPort, send, floorInPort)
	pod, err := c.startPod(ctx, "floor", "sh", "-c", script)
	var ip []byte
	if err == nil {
		ip, err = c.command(ctx, "get", "pod", pod, "-o", "jsonpath={.status.podIP}").Output()
	}
	if err == nil && len(ip) == 0 {
		err = fmt.Errorf("pod %s has no IP", pod)
	}
	if err != nil {
		out.skip, in.skip = "failed: "+oneLine(err), "failed: "+oneLine(err)
		return out, in
	}
	at := func(port int) string { return net.JoinHostPort(string(ip), strconv.Itoa(port)) }
	var d net.Dialer
	out.skip, out.op = "", func(ctx context.Context) error {
		conn, err := d.DialContext(ctx, "tcp", at(floorOutPort))
		if err != nil {
			return err
		}
		defer conn.Close()
		defer bound(ctx, conn)()
		got, err := io.Copy(io.Discard, conn)
		if err == nil && got != n {
			err = fmt.Errorf("read %d bytes, want %d", got, n)
		}
		return err
	}
	in.skip, in.op = "", func(ctx context.Context) error {
		conn, err := d.DialContext(ctx, "tcp", at(floorInPort))
		if err != nil {
			return err
		}
		defer conn.Close()
		defer bound(ctx, conn)()
		if _, err := io.Copy(conn, io.LimitReader(zeros{}, n)); err != nil {
			return err
		}
		if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
			return err
		}
		_, err = io.Copy(io.Discard, conn) // dd read it all: nc closes
		return err
	}
	return out, in
}

// kubeFiles copies the files rows' tree into the direct channel's
// sandbox and out again, as the files rows do on Podman.
func (b *bench) kubeFiles(ctx context.Context, direct vm.VM) error {
	r := &b.kube.data
	src, out, done, err := b.tree("kube")
	if err != nil {
		return err
	}
	defer done()
	if r.in, err = measure(ctx, "kube: files in", []alt{{name: nameKubeDirect, op: treeIn(direct, src)}}, 1, b.sz.stream, b.sz.budget); err != nil {
		return err
	}
	r.out, err = measure(ctx, "kube: files out", []alt{{name: nameKubeDirect, op: treeOut(direct, b.freshTree(out))}}, 1, b.sz.stream, b.sz.budget)
	return err
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
	reportThroughput(w, fmt.Sprintf("**Kubernetes, stdin throughput** of %s into `%s`, %s", mib(r.n), shellLine(stdinArgv), runs(r.stdin)),
		r.stdin, r.n, nameKubeAttach, "the attach stream")
	fmt.Fprintf(w, "\n**Kubernetes, files** on the direct channel: the files rows' tree of %d files, %s, `vm.CopyDirIn` and `vm.CopyDirOut` (to a new host directory, checked and removed inside the timing); %s\n\n",
		b.treeFiles, mib(b.treeBytes), runs(append(r.in, r.out...)))
	fmt.Fprintln(w, "| how | in p50 | in MiB/s | out p50 | out MiB/s | failures |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|---|")
	for i, s := range r.in {
		o := r.out[i]
		cell := func(s *series) string {
			if !s.ok() {
				return skipped(s) + " | "
			}
			return fmt.Sprintf("%s | %.0f", ms(s.p50()), mibps(b.treeBytes, s.p50()))
		}
		fmt.Fprintf(w, "| %s | %s | %s | in %s, out %s |\n", s.name, cell(s), cell(o), failures(s), failures(o))
	}
	reportThroughput(w, fmt.Sprintf("**Kubernetes, streams at once** on the direct channel, then on the attach stream alone: %s in one Run, and in %d Runs of %s at once, %s", mib(r.n), kubeStreams, mib(r.n/kubeStreams), runs(r.many)),
		r.many, r.n, nameKubeOne, "the direct channel's one Run")
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
	// vsPodman is the verdict of a direct channel's row against
	// Podman's socket path, quoting the pod network's floor that way.
	vsPodman := func(what string, kube, podman []*series, podmanBytes int64, floor, floorWay string) {
		k, okK := rate(kube, nameKubeDirect, r.n)
		p, okP := rate(podman, nameAPIVM, podmanBytes)
		bound := "the pod network and the record layer's AES-GCM on both ends, on two cores shared with the cluster"
		if f, ok := rate(kube, floor, r.n); ok {
			bound = fmt.Sprintf("the channel's own work (the record layer's AES-GCM on both ends, the agent's pumps), on two cores shared with the cluster: the pod network's TCP %s does %.0f MiB/s, and the channel carries %.0f%% of that", floorWay, f, 100*k/f)
		}
		verdict(fmt.Sprintf("kube, direct channel: %s ≥ %.1f× Podman's socket path (%s)", what, kubeDirectVsPodman, nameAPIVM),
			fmt.Sprintf("%.2f× (%.0f vs %.0f MiB/s)", k/p, k, p), okK && okP, k >= kubeDirectVsPodman*p, bound)
	}
	vsPodman("stdout", r.stream, b.streamRes, b.sz.streamBytes, nameFloorOut, "from nc in a pod into this process")
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
	attachOne, okA1 := rate(r.many, nameAttachOne, r.n)
	attachMany, okAM := rate(r.many, nameAttachMany, r.n)
	verdict(fmt.Sprintf("kube, attach stream alone: %d Runs at once ≥ %.1f× one Run's MiB/s (no collapse)", kubeStreams, kubeManyVsOne),
		fmt.Sprintf("%.2f× (%.0f vs %.0f MiB/s)", attachMany/attachOne, attachMany, attachOne), okA1 && okAM, attachMany >= kubeManyVsOne*attachOne,
		"the one attach stream every call of the sandbox shares, relayed by the API server, the kubelet and containerd")
	vsPodman("stdin", r.stdin, b.stdinRes, b.sz.streamBytes, nameFloorIn, "from this process into nc in a pod")
	for _, way := range []struct {
		what         string
		kube, podman []*series
	}{{"files in", r.in, b.filesIn}, {"files out", r.out, b.filesOut}} {
		k, okK := rate(way.kube, nameKubeDirect, b.treeBytes)
		p, okP := rate(way.podman, nameAPIVM, b.treeBytes)
		verdict(fmt.Sprintf("kube, direct channel: %s ≥ %.1f× Podman's socket path (%s)", way.what, kubeDirectVsPodman, nameAPIVM),
			fmt.Sprintf("%.2f× (%.0f vs %.0f MiB/s)", k/p, k, p), okK && okP, k >= kubeDirectVsPodman*p,
			"the pod network and the record layer's AES-GCM on both ends, on two cores shared with the cluster")
	}
	have := r.beside != nil && r.beside.ok()
	measured := ""
	if have {
		measured = ms(r.beside.p50())
	}
	verdict(fmt.Sprintf("kube, direct channel: a Run's round trip p50 ≤ %s beside a bulk copy", ms(kubeBesideTarget)), measured, have,
		have && r.beside.p50() <= kubeBesideTarget, "the copy's share of the two cores")
}
