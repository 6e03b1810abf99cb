package kube

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/httpstream"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/podvm/podvm/internal/driver"
)

// This file is how the driver talks to a pod's containers: attach and
// exec sessions, each a stream of its own, and the attach's held stdin.

// lifeline attaches to the stdin of Main of pod id, which runs cat behind
// the gate (pod.go), and keeps the attach. Once the gate's first dot came
// through it, the attach reaches the running container: it opens the gate
// with a line (once beforeGate lets it), and only then does the pod's end
// hang on this process's. (A line written before then could reach a stdin
// nobody reads yet, and the attach that wrote it be cut as the container
// starts.) again says whether another attempt may do better: not once the
// attach reached the container, whose stdin (stdinOnce) ends with it.
func (d *Driver) lifeline(ctx context.Context, id string) (again bool, err error) {
	pr, pw := io.Pipe()
	dot := &firstByte{seen: make(chan struct{})}
	line, err := d.open(id, "attach", &corev1.PodAttachOptions{Container: Main, Stdin: true, Stdout: true},
		remotecommand.StreamOptions{Stdin: pr, Stdout: dot})
	if err != nil {
		return true, err
	}
	line.closers = append(line.closers, pw)
	select {
	case <-dot.seen:
		if err := d.beforeGate(ctx, id); err != nil {
			line.Close()
			return false, err
		}
		go func() { _, _ = pw.Write([]byte("\n")) }()
		d.mu.Lock()
		d.held[id] = line
		d.mu.Unlock()
		return false, nil
	case <-line.done:
		line.Close()
		if line.err == nil {
			return true, fmt.Errorf("%w: kube: pod %s: cat ended", driver.ErrContainerNotRunning, id)
		}
		return true, classify("attach to", id, line.err)
	case <-ctx.Done():
		line.Close()
		return false, fmt.Errorf("vm: kube: attaching to pod %s: %w", id, ctx.Err())
	}
}

// beforeGate returns once pod id may run what the caller asks of it:
// at once, unless it has a deny-all policy on a cluster that enforces
// them (Options.Enforced). Then it waits until the pod's status names
// its IP. Plugins that enforce policies by the pods' IPs as the API
// server reports them (kube-router's, kube-network-policies) can match
// nothing of a pod before, and the kubelet reports the IP only at its
// next relist, up to a second after the container runs. The wait
// narrows that window to the plugin's own lag behind the status; it
// does not close it (plugins that learn the IP as they give it, as
// Calico and Cilium do, have none). It goes on through reads of the
// status that fail for a moment, and returns at once when the pod is
// gone or failed, the API server refuses for good, or the pod was
// removed (or the driver closed) meanwhile.
func (d *Driver) beforeGate(ctx context.Context, id string) error {
	d.mu.Lock()
	policed := d.policed[id]
	d.mu.Unlock()
	if !policed {
		return nil
	}
	for {
		p, err := d.c.CS.CoreV1().Pods(d.o.Namespace).Get(ctx, id, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err), apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
			return classify("get pod", id, err)
		case err != nil: // a moment's trouble, or ctx: see below
		case failure(p) != nil:
			return failure(p)
		case p.Status.PodIP != "":
			d.mu.Lock()
			defer d.mu.Unlock()
			if !d.policed[id] {
				return fmt.Errorf("%w: kube: pod %s was removed, or its driver closed, while it waited for its IP", driver.ErrNoSuchContainer, id)
			}
			delete(d.policed, id)
			return nil
		}
		select {
		case <-ctx.Done():
			why := describe(p)
			if err != nil {
				why = err.Error()
			}
			return fmt.Errorf("vm: kube: waiting for pod %s's IP, which its NetworkPolicy needs to hold (%s): %w", id, why, ctx.Err())
		case <-time.After(ipEvery):
		}
	}
}

// ipEvery is how often beforeGate reads a pod's status.
const ipEvery = 50 * time.Millisecond

// firstByte closes seen at the first byte written to it, and drops them
// all.
type firstByte struct {
	seen chan struct{}
	once sync.Once
}

func (f *firstByte) Write(p []byte) (int, error) {
	if len(p) > 0 {
		f.once.Do(func() { close(f.seen) })
	}
	return len(p), nil
}

// Attach attaches to the stdio of Main of pod id and opens the gate
// (pod.go) by writing a line: the size of the agent's tar stream that
// [Driver.CopyIn] kept, then the stream, which the gate installs before
// it runs the agent (installGate). The agent's handshake comes next.
// Until the gate's first dot came through, it tries again while the
// kubelet says Main is not running yet (its status, which the kubelet
// reports a second or more late, is not waited for, but where
// beforeGate says: a pod whose deny-all policy an enforcing plugin
// must find by its IP).
func (d *Driver) Attach(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	var a *attached
	err := d.retry(ctx, id, "attaching to the agent", func() (again bool, err error) {
		a, again, err = d.attach(ctx, id)
		return again, err
	})
	return a, err
}

// attach is one attempt of Attach; again as lifeline's.
func (d *Driver) attach(ctx context.Context, id string) (a *attached, again bool, err error) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	// Not stderr: the agent puts /dev/null on its fd 2 as it starts, and
	// containerd ends an attach whose stderr reached its end, closing the
	// container's stdin with it (stdinOnce), and so the agent.
	first := &firstByte{seen: make(chan struct{})}
	s, err := d.open(id, "attach", &corev1.PodAttachOptions{Container: Main, Stdin: true, Stdout: true},
		remotecommand.StreamOptions{Stdin: inR, Stdout: io.MultiWriter(first, outW)})
	if err != nil {
		return nil, true, err
	}
	s.closers = append(s.closers, inW, outR)
	go func() {
		<-s.done
		why := s.err
		if why == nil {
			why = io.EOF
		}
		outW.CloseWithError(why)
	}()
	d.mu.Lock()
	tarball := d.installs[id]
	d.mu.Unlock()
	// The gate's line, once its first dot came through this attach (the
	// container runs and the attach reaches it: pod.go's gate) and
	// beforeGate lets it: with the agent's tar stream after it when there
	// is one to install, in one Write, so that nothing of the caller's
	// can come between them.
	line := []byte("\n")
	if tarball != nil {
		line = append([]byte(fmt.Sprintf("%d\n", len(tarball))), tarball...)
	}
	select {
	case <-first.seen:
		if err := d.beforeGate(ctx, id); err != nil {
			s.Close() // and so Main's stdin: the pod ends
			return nil, false, err
		}
		go func() { _, _ = inW.Write(line) }() // the stream's Close ends it
		// Held for Remove, which waits for it to end (the agent's exit)
		// before deleting the pod.
		d.mu.Lock()
		d.held[id] = s
		delete(d.installs, id) // written on this attach, or it ends
		d.mu.Unlock()
		out := &dotless{r: outR, early: func(err error) error { return d.diagnose(id, err) }}
		return &attached{s: s, in: inW, out: out}, false, nil
	case <-s.done:
		s.Close()
		if s.err == nil {
			return nil, true, fmt.Errorf("%w: kube: pod %s: the agent's stream ended before its handshake", driver.ErrContainerNotRunning, id)
		}
		return nil, true, classify("attach to", id, s.err)
	case <-ctx.Done():
		s.Close()
		return nil, false, fmt.Errorf("vm: kube: attaching to pod %s: %w", id, ctx.Err())
	}
}

// attached is Main's stdio as a stream: reads are its stdout (the
// agent's, the gate's dots dropped), writes its stdin.
type attached struct {
	s   *stream
	in  *io.PipeWriter
	out io.Reader
}

// dotless reads r but for the dots it starts with (the gate's). When r
// ends or fails before a byte that is not a dot, early, when set, says
// why: the pod's account of it (the agent's install failed, the
// container exited) rather than a bare EOF.
type dotless struct {
	r     io.Reader
	past  bool // the first byte that is not a dot has been read
	early func(error) error
}

func (d *dotless) Read(p []byte) (int, error) {
	for {
		n, err := d.r.Read(p)
		if !d.past && n == 0 && err != nil && d.early != nil {
			err, d.early = d.early(err), nil
		}
		if d.past || n == 0 {
			return n, err
		}
		i := 0
		for i < n && p[i] == '.' {
			i++
		}
		if i < n {
			d.past = true
			return copy(p, p[i:n]), err
		}
		if err != nil {
			return 0, err
		}
	}
}

func (a *attached) Read(p []byte) (int, error) { return a.out.Read(p) }

func (a *attached) Write(p []byte) (int, error) { return a.in.Write(p) }

// Close closes Main's stdin, and so ends the agent (stdinOnce: it kills
// everything and exits), and stops reading its stdout. It does not cut
// the attach: that ends by itself once the agent has exited, which
// [Driver.Remove], called after Close or not, waits for. Past endWait
// it is cut anyway.
func (a *attached) Close() error {
	a.s.closeStdin()
	go a.s.end(context.Background(), endWait)
	return nil
}

// stream is one attach or exec session, run in a goroutine of its own
// until it ends or is closed.
type stream struct {
	cancel  context.CancelFunc
	done    chan struct{}
	err     error       // once done is closed
	closers []io.Closer // the session's stdin, and what reads its output
	once    sync.Once   // closes the closers
}

// Close ends the session and waits (a moment at most) for it to return.
//
// It first closes the session's stdin (the closers), which ends an
// attach to a stdinOnce container by itself (the container exits), and
// gives it a moment (250 ms) to: a connection cut under it makes
// client-go log its goroutines' read errors.
func (s *stream) Close() error {
	s.end(context.Background(), 250*time.Millisecond)
	return nil
}

// closeStdin closes the session's stdin (the closers), once.
func (s *stream) closeStdin() {
	s.once.Do(func() {
		for _, c := range s.closers {
			c.Close()
		}
	})
}

// end closes the session's stdin and waits for the session to end by
// itself, until bound has passed or ctx ends; then it cuts the session,
// and waits (a moment at most) for it to return.
func (s *stream) end(ctx context.Context, bound time.Duration) {
	s.closeStdin()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case <-s.done:
		return
	case <-t.C:
	case <-ctx.Done():
	}
	s.cancel()
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
	}
}

// open starts the session sub ("attach" or "exec") on pod id with
// params, streaming so, in a goroutine: the session outlives the call
// that opened it, until it ends or is closed.
func (d *Driver) open(id, sub string, params kruntime.Object, so remotecommand.StreamOptions) (*stream, error) {
	ex, err := d.executor(id, sub, params)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &stream{cancel: cancel, done: make(chan struct{})}
	if sub == "attach" && so.Stdin != nil {
		so.Stdin = &heldStdin{r: so.Stdin, ended: s.done, opened: time.Now()}
	}
	go func() {
		defer close(s.done)
		defer cancel()
		s.err = ex.StreamWithContext(ctx, so)
	}()
	return s, nil
}

// heldStdin holds the first Read of an attach's stdin for a while (see
// hold), and is at its end if the session ends first. An attach to a
// container the kubelet has made but not started yet is upgraded, then
// reset: client-go logs the write of stdin that meets the reset
// ("Unhandled Error ... connection reset by peer", on the process's
// stderr, once for about every Create), while an attach that ends before
// any write of stdin is simply an error, which the retries expect.
type heldStdin struct {
	r      io.Reader
	ended  <-chan struct{}
	opened time.Time // when the session was asked for
	once   sync.Once
	eof    bool
}

// stdinHold and maxStdinHold bound how long an attach's stdin is held.
const (
	stdinHold    = 40 * time.Millisecond
	maxStdinHold = time.Second
)

// hold is how long to hold stdin, given how long the upgrade took (the
// first Read comes right after it). The reset comes 10-20 ms after the
// upgrade on a quiet machine; on a busy one both take longer, in
// proportion: a fixed hold that a quiet machine needs fails a loaded one.
func hold(upgrade time.Duration) time.Duration {
	return min(max(stdinHold, 3*upgrade), maxStdinHold)
}

func (h *heldStdin) Read(p []byte) (int, error) {
	h.once.Do(func() {
		t := time.NewTimer(hold(time.Since(h.opened)))
		defer t.Stop()
		select {
		case <-h.ended:
			h.eof = true
		case <-t.C:
		}
	})
	if h.eof {
		return 0, io.EOF
	}
	return h.r.Read(p)
}

// executor is kubectl's: WebSocket, falling back to SPDY where the
// server cannot upgrade to it.
func (d *Driver) executor(id, sub string, params kruntime.Object) (remotecommand.Executor, error) {
	req := d.c.CS.CoreV1().RESTClient().Post().Resource("pods").Namespace(d.o.Namespace).Name(id).
		SubResource(sub).VersionedParams(params, scheme.ParameterCodec)
	return newExecutor(d.c.REST, req.URL())
}

func newExecutor(rc *rest.Config, u *url.URL) (remotecommand.Executor, error) {
	spdy, err := remotecommand.NewSPDYExecutor(rc, "POST", u)
	if err != nil {
		return nil, fmt.Errorf("%w: kube: %w", driver.ErrEngine, err)
	}
	ws, err := remotecommand.NewWebSocketExecutor(rc, "GET", u.String())
	if err != nil {
		return nil, fmt.Errorf("%w: kube: %w", driver.ErrEngine, err)
	}
	return remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
}
