package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/podvm/podvm/vm"
)

// Where a fresh sandbox's first result spends its time, phase by phase:
// the bench's own clock around kube.New, Create and the Run, and, for
// what happens in the cluster, when a watch of the namespace's pods saw
// each change arrive (the API server's view, as a caller has it; the
// pod's own timestamps are whole seconds). A phase the watch did not see
// (the kubelet may report two changes in one status update) is left out
// of that run's deltas.

// The phases, in order; each ends at its mark.
var kubePhases = []struct{ mark, what string }{
	{"added", "the pod's POST seen (kube.New, Create's checks)"},
	{"scheduled", "scheduled to the node"},
	{"main", "the sandbox's container running, as the kubelet reports it (the pod's sandbox, its network, the container)"},
	{"created", "Create returns (the NetworkPolicy, the attach, its gate, the agent's tar, hello, the direct channel's first peer)"},
	{"result", "the first Run's result"},
}

// podTimes records, per pod, when the watch first saw each mark.
type podTimes struct {
	mu   sync.Mutex
	seen map[string]map[string]time.Time // pod → mark → when
	err  error                           // the watch's failure, if any
}

// watchPods records the marks of the namespace's podvm pods (those
// podvm labels its own) until ctx ends. A watch that the API server ends
// or breaks (its timeout, a stream it could not go on with) is made
// again, from the last version it saw, so that a run's marks do not stop
// at the first; its failure is kept only if making it again fails.
func (c *cluster) watchPods(ctx context.Context) (*podTimes, error) {
	w, err := c.cs.CoreV1().Pods(c.namespace).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	pt := &podTimes{seen: map[string]map[string]time.Time{}}
	go func() {
		version := ""
		for {
			version = pt.follow(w, version)
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond): // not a tight loop on a server that ends each at once
			}
			if w, err = c.cs.CoreV1().Pods(c.namespace).Watch(ctx, metav1.ListOptions{ResourceVersion: version}); err != nil {
				// Too old a version, say: from now on, whatever comes.
				if w, err = c.cs.CoreV1().Pods(c.namespace).Watch(ctx, metav1.ListOptions{}); err != nil {
					if ctx.Err() == nil {
						pt.mu.Lock()
						pt.err = fmt.Errorf("the pods' watch, made again: %w", err)
						pt.mu.Unlock()
					}
					return
				}
			}
		}
	}()
	return pt, nil
}

// follow records the marks w brings until it ends or fails, and returns
// the last resource version it saw (version if none).
func (pt *podTimes) follow(w watch.Interface, version string) string {
	defer w.Stop()
	for ev := range w.ResultChan() {
		now := time.Now()
		if ev.Type == watch.Error {
			return version
		}
		p, ok := ev.Object.(*corev1.Pod)
		if !ok {
			continue
		}
		version = p.ResourceVersion
		if p.Labels[vm.LabelManaged] != "true" {
			continue
		}
		pt.mark(p.Name, "added", now)
		if p.Spec.NodeName != "" {
			pt.mark(p.Name, "scheduled", now)
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.State.Running != nil {
				pt.mark(p.Name, "main", now)
			}
		}
	}
	return version
}

func (pt *podTimes) mark(pod, mark string, at time.Time) {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	m := pt.seen[pod]
	if m == nil {
		m = map[string]time.Time{}
		pt.seen[pod] = m
	}
	if _, ok := m[mark]; !ok {
		m[mark] = at
	}
}

// phaseRun is one measured run: its pod and the bench's own marks.
type phaseRun struct {
	pod                    string
	start, created, result time.Time
}

// phases is what the breakdown measured.
type phases struct {
	runs  []phaseRun
	times *podTimes
	skip  string
}

// kubeFirstPhases makes n fresh sandboxes with be, one at a time, each
// to the result of `echo hi`, with the pods watched.
func (b *bench) kubeFirstPhases(ctx context.Context, c *cluster, be backend, cfg vm.Config, n int) phases {
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	pt, err := c.watchPods(wctx)
	if err != nil {
		return phases{skip: "failed: " + oneLine(err)}
	}
	ph := phases{times: pt}
	for range n {
		r := phaseRun{start: time.Now()}
		v, err := be.new(ctx, "", cfg)
		if err == nil {
			err = v.Create(ctx)
			r.created, r.pod = time.Now(), v.ID()
			if err == nil {
				err = vmRunOK(ctx, v, echoHiArgv, "hi")
				r.result = time.Now()
			}
			rctx, cancel := removeContext(ctx)
			err = errors.Join(err, v.Remove(rctx))
			cancel()
		}
		if err != nil {
			return phases{skip: "failed: " + oneLine(err)}
		}
		ph.runs = append(ph.runs, r)
	}
	return ph
}

// report writes the median of each phase over the runs that saw both
// its ends.
func (ph phases) report(w io.Writer) {
	if ph.skip != "" {
		fmt.Fprintf(w, "\n**Kubernetes, a fresh sandbox's first result, phase by phase**: skipped: %s\n", ph.skip)
		return
	}
	ph.times.mu.Lock()
	defer ph.times.mu.Unlock()
	fmt.Fprintf(w, "\n**Kubernetes, a fresh sandbox's first result, phase by phase**: `kube.New`, `Create`, `Run` of `echo hi`, one sandbox at a time, %d runs; each phase from the end of the one before, as this process saw it (its own clock around the calls, and a watch of the namespace's pods for what happens in the cluster); p50 of the runs whose watch saw its end; a phase whose end it did not see (the kubelet reports a pod's containers as it finds them, once a second) is counted in the next\n\n", len(ph.runs))
	fmt.Fprintln(w, "| phase | p50 | runs |")
	fmt.Fprintln(w, "|---|--:|--:|")
	var total []time.Duration
	for i, p := range kubePhases {
		var ds []time.Duration
		for _, r := range ph.runs {
			at := ph.marks(r)
			end, ok := at[p.mark]
			if !ok {
				continue
			}
			// From the latest mark before this one that the watch saw.
			prev := r.start
			for _, q := range kubePhases[:i] {
				if t, ok := at[q.mark]; ok {
					prev = t
				}
			}
			ds = append(ds, end.Sub(prev))
		}
		fmt.Fprintf(w, "| %s | %s | %d |\n", p.what, p50Of(ds), len(ds))
	}
	for _, r := range ph.runs {
		total = append(total, r.result.Sub(r.start))
	}
	fmt.Fprintf(w, "| all of it | %s | %d |\n", p50Of(total), len(total))
	if ph.times.err != nil {
		fmt.Fprintf(w, "\nThe watch ended early: %s\n", oneLine(ph.times.err))
	}
}

// marks are run r's marks: the watch's for its pod, and its own.
func (ph phases) marks(r phaseRun) map[string]time.Time {
	at := map[string]time.Time{"created": r.created, "result": r.result}
	for k, t := range ph.times.seen[r.pod] {
		at[k] = t
	}
	return at
}

func p50Of(ds []time.Duration) string {
	if len(ds) == 0 {
		return "–"
	}
	slices.Sort(ds)
	return ms(ds[(len(ds)-1)/2])
}
