package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	osexec "os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/vm"
)

// The live comparison: what a running sandbox serves and holds
// (docs/live.md), on each podvm backend with the agent, against what a
// user would otherwise do, in one run:
//
//   - the first byte: from calling vm.Dial to the first byte of a server
//     in the sandbox, and from calling vm.Start of `echo hi` to its first
//     stdout byte, against a Run's round trip on the same backend; with
//     the bounds of the first: a line echoed over a connection kept open
//     (the channel alone), and a command started in the sandbox (what
//     the server does for each connection);
//   - throughput: a server's bytes read through a vm.Forward (and through
//     a vm.Dial connection) against the same dd's bytes through Run's
//     stdout;
//   - connect and echo: a line echoed through a vm.Forward, plain and
//     WithWarmConnection, against the same server in a container on
//     Podman's bridge network whose port `podman run -p` publishes.
//
// The servers are busybox nc, one per port, which forks the answering
// command for each connection (for every alternative alike). Each is
// started once per sandbox with vm.Start, bounded by serverLifetime,
// waited for with vm.WaitListening, and counted with vm.Processes; the
// forwards are made once. At the section's end, whatever ends it, the
// forwards are closed, the servers killed and waited for, and the
// published-port container removed (it carries the run's labels, so the
// bench's cleanup removes it too).

// The servers' ports, on each sandbox's loopback.
const (
	helloPort = 7001 // says hello and closes
	bulkPort  = 7002 // sends the stream's bytes and closes
	echoPort  = 7003 // echoes what comes until its client closes
)

// serverLifetime bounds each server's life, whatever happens to the
// bench: the sandbox's removal ends it long before.
const serverLifetime = time.Hour

// labelPublished marks the published-port container, so that the
// section's end removes it and nothing else of the run.
const labelPublished = "io.podvm.bench.published"

// helloName is the hello server's file in the sandbox's /tmp.
const helloName = "hellosrv"

var (
	helloServerArgv = []string{"/tmp/" + helloName, strconv.Itoa(helloPort)}
	helloWant       = "hello\n"
	echoArgv        = []string{"cat"}
	echoPayload     = "ping\n"
	echoHiCommand   = exec.Command{Name: echoHiArgv[0], Args: echoHiArgv[1:]}
)

// The targets (issue 38 §6).
const (
	dialFirstTarget  = time.Millisecond       // vm.Dial to the first byte, p50
	forwardBWTarget  = 0.8                    // a forward's bytes/s, against Run's stdout's
	warmEchoTarget   = 1.0                    // a warm forward's connect and echo, against a published port's
	startFirstTarget = 200 * time.Microsecond // vm.Start's first byte, past a Run's round trip
)

// Names of the rows: a backend's are "BACKEND: what".
const (
	whatDial      = "`vm.Dial` to the first byte"
	whatStart     = "`vm.Start` of `echo hi` to its first stdout byte"
	whatRun       = "a Run's round trip"
	whatChannel   = "a line echoed over a `vm.Dial` connection kept open (the channel alone)"
	whatSpawn     = "the command alone: `sh -c …` started and waited by a shell loop in the sandbox, per command"
	whatFwdBulk   = "through a `vm.Forward`"
	whatDialBulk  = "through a `vm.Dial` connection"
	whatRunBulk   = "Run's stdout, into its capture"
	whatPlain     = "through a `vm.Forward`"
	whatWarm      = "through a `vm.Forward` `WithWarmConnection`"
	whatDialEcho  = "through a `vm.Dial` connection (no listener)"
	namePublished = "the same nc in a container on the bridge network, its port published with `podman run -p 127.0.0.1::7003`"
)

func liveRow(backend, what string) string { return backend + ": " + what }

// ncArgv serves argv on port: nc forks it for each connection, with
// the connection as its stdin and stdout.
func ncArgv(port int, argv ...string) []string {
	return append([]string{"nc", "-ll", "-p", strconv.Itoa(port), "-e"}, argv...)
}

func loopback(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// liveResult is the section's measurements.
type liveResult struct {
	first, bulk, echo []*series
	ref               map[string]string // a row's reference row: its backend's Run
	published         string            // how the published port was made: "rootful", "rootless"
	notes             []string
}

// liveBox is one sandbox's servers and forwards.
type liveBox struct {
	name              string // the backend's
	v                 vm.VM
	skip              string
	servers           []*vm.Process
	bulk, plain, warm *vm.Forwarder
	kept              net.Conn // to the echo server, for the channel's row
}

func (b *bench) lives(ctx context.Context) error {
	r := &liveResult{ref: map[string]string{}}
	b.live = r
	n := b.sz.streamBytes

	progress("live: setting up")
	var boxes []*liveBox
	defer func() {
		for _, x := range boxes {
			if err := x.close(ctx); err != nil {
				r.notes = append(r.notes, x.name+": "+oneLine(err))
			}
		}
	}()
	hello, err := buildHello(ctx)
	if err != nil {
		return err
	}
	for _, be := range backends[:2] { // through the agent
		x := &liveBox{name: be.name, skip: b.vmErr[be.name]}
		boxes = append(boxes, x)
		if x.skip != "" {
			continue
		}
		x.v = b.vms[be.name]
		if err := x.setup(ctx, n, hello); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			x.skip = "failed: " + oneLine(err)
		}
	}
	pub := alt{name: namePublished}
	addr, how, err := b.startPublished(ctx)
	defer b.removePublished(ctx)
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case err != nil:
		pub.skip = "failed: " + oneLine(err)
	default:
		pub.op, r.published = echoAt(addr), how
	}

	// Three groups, each round-robin on its own (a row's ratio may be to
	// a Run timed in another group: the Run is the same op in each): a
	// Run, a Start or a spawn returns while
	// the agent still has work of its own (the shim that replaces the
	// one the run used, the reaping), which falls on the op timed after
	// it. A service is dialed in a sandbox that is not starting
	// processes; a Start and a Run each follow the other, never the
	// spawn rows' loop of shells, which would charge its leftovers to
	// whichever came next.
	dials := r.boxAlts(boxes, whatRun,
		liveAlt{whatDial, func(x *liveBox) alt { return alt{timed: dialFirstByte(x.v)} }},
		liveAlt{whatChannel, func(x *liveBox) alt {
			return alt{op: func(ctx context.Context) error { return echoLine(ctx, x.kept) }}
		}},
	)
	starts := r.boxAlts(boxes, whatRun,
		liveAlt{whatStart, func(x *liveBox) alt { return alt{timed: startFirstByte(x.v)} }},
		liveAlt{whatRun, func(x *liveBox) alt { return alt{op: vmRoundTrip(x.v)} }},
	)
	spawns := r.boxAlts(boxes, whatRun,
		liveAlt{whatSpawn, func(x *liveBox) alt { return alt{op: vmRun(x.v, spawnArgv), per: spawnLoops} }},
	)
	for _, g := range [][]alt{dials, starts, spawns} {
		got, err := measure(ctx, "live: first byte", g, b.sz.warm, b.sz.exec, b.sz.budget)
		if err != nil {
			return err
		}
		r.first = append(r.first, got...)
	}

	bulk := r.boxAlts(boxes, whatRunBulk,
		liveAlt{whatFwdBulk, func(x *liveBox) alt { return alt{op: forwardBulk(x.bulk, n)} }},
		liveAlt{whatDialBulk, func(x *liveBox) alt { return alt{op: dialBulk(x.v, n)} }},
		liveAlt{whatRunBulk, func(x *liveBox) alt { return alt{op: vmStream(x.v, n)} }},
	)
	if r.bulk, err = measure(ctx, "live: throughput", bulk, 1, b.sz.stream, b.sz.budget); err != nil {
		return err
	}

	echo := append(r.boxAlts(boxes, "",
		liveAlt{whatPlain, func(x *liveBox) alt { return alt{op: echoAt(x.plain.Addr().String())} }},
		liveAlt{whatWarm, func(x *liveBox) alt { return alt{op: echoAt(x.warm.Addr().String())} }},
		liveAlt{whatDialEcho, func(x *liveBox) alt { return alt{op: dialEcho(x.v)} }},
	), pub)
	if r.echo, err = measure(ctx, "live: connect and echo", echo, b.sz.warm, b.sz.exec, b.sz.budget); err != nil {
		return err
	}
	progress("")
	return nil
}

// liveAlt is a row of each sandbox: what it is, and its operation.
type liveAlt struct {
	what string
	mk   func(*liveBox) alt // sets op or timed
}

// boxAlts are, for each sandbox, an alternative per row, named by the
// backend and the row, or skipped saying why the sandbox has none. Each
// row is compared with the same backend's row ref, if any.
func (r *liveResult) boxAlts(boxes []*liveBox, ref string, rows ...liveAlt) []alt {
	var alts []alt
	for _, x := range boxes {
		for _, row := range rows {
			a := alt{skip: x.skip}
			if x.skip == "" {
				a = row.mk(x)
			}
			a.name = liveRow(x.name, row.what)
			if ref != "" && row.what != ref {
				r.ref[a.name] = liveRow(x.name, ref)
			}
			alts = append(alts, a)
		}
	}
	return alts
}

// setup starts the sandbox's servers, waits until each listens, and
// makes the forwards.
func (x *liveBox) setup(ctx context.Context, n int64, hello []byte) error {
	if err := x.v.CopyIn(ctx, "/tmp", bytes.NewReader(executableTar(helloName, hello))); err != nil {
		return fmt.Errorf("copying the hello server in: %w", err)
	}
	for _, s := range []struct {
		port int
		argv []string
	}{{helloPort, helloServerArgv}, {bulkPort, ncArgv(bulkPort, streamArgv(n)...)}, {echoPort, ncArgv(echoPort, echoArgv...)}} {
		p, err := startServer(ctx, x.v, s.port, s.argv)
		if err != nil {
			return err
		}
		x.servers = append(x.servers, p)
	}
	if got := len(vm.Processes(x.v)); got != len(x.servers) {
		return fmt.Errorf("%d processes of vm.Start run in the sandbox after starting its %d servers", got, len(x.servers))
	}
	var err error
	if x.bulk, err = vm.Forward(ctx, x.v, "tcp", loopback(bulkPort)); err != nil {
		return err
	}
	if x.plain, err = vm.Forward(ctx, x.v, "tcp", loopback(echoPort)); err != nil {
		return err
	}
	if x.warm, err = vm.Forward(ctx, x.v, "tcp", loopback(echoPort), vm.WithWarmConnection()); err != nil {
		return err
	}
	x.kept, err = vm.Dial(ctx, x.v, "tcp", loopback(echoPort))
	return err
}

// close closes the sandbox's forwards and kills its servers, and fails
// unless the servers were the only processes of vm.Start left running
// and all have ended.
func (x *liveBox) close(ctx context.Context) error {
	var errs []error
	if x.kept != nil {
		errs = append(errs, x.kept.Close())
	}
	for _, f := range []*vm.Forwarder{x.bulk, x.plain, x.warm} {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	if x.v == nil {
		return errors.Join(errs...)
	}
	if got := len(vm.Processes(x.v)); got > len(x.servers) {
		errs = append(errs, fmt.Errorf("%d processes of vm.Start were left running in the sandbox, for its %d servers", got, len(x.servers)))
	}
	for _, p := range x.servers {
		errs = append(errs, endProcess(ctx, p))
	}
	if got := len(vm.Processes(x.v)); got > 0 {
		errs = append(errs, fmt.Errorf("%d processes of vm.Start still run in the sandbox once its servers ended", got))
	}
	return errors.Join(errs...)
}

// startServer starts the server argv, listening on port in v, and waits
// until it listens.
func startServer(ctx context.Context, v vm.VM, port int, nc []string) (*vm.Process, error) {
	p, err := vm.Start(ctx, v, exec.Command{Name: nc[0], Args: nc[1:], Timeout: serverLifetime})
	if err != nil {
		return nil, fmt.Errorf("starting `%s`: %w", shellLine(nc), err)
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := vm.WaitListening(wctx, v, "tcp", loopback(port)); err != nil {
		_, said := p.Stderr().Bytes()
		return nil, errors.Join(fmt.Errorf("`%s` never listened: %w (its stderr: %q)", shellLine(nc), err, said), endProcess(ctx, p))
	}
	return p, nil
}

// endProcess kills p, if it still runs, and waits for its end.
func endProcess(ctx context.Context, p *vm.Process) error {
	if err := p.Kill(); err != nil && !errors.Is(err, vm.ErrProcessDone) {
		return fmt.Errorf("killing %s: %w", p.Command().Name, err)
	}
	wctx, cancel := removeContext(ctx)
	defer cancel()
	select {
	case <-p.Done():
		return nil
	case <-wctx.Done():
		return fmt.Errorf("%s did not end within a minute of its kill", p.Command().Name)
	}
}

// startPublished runs the echo server in a container on Podman's bridge
// network, its port published on this machine's loopback, and returns
// the published address once a line comes back through it, and whether
// the service is rootful or rootless.
func (b *bench) startPublished(ctx context.Context) (addr, how string, err error) {
	if scheme(b.p.url) != "a unix socket" {
		return "", "", fmt.Errorf("the service (%s) is not on this machine: the port it publishes is not on this loopback", scheme(b.p.url))
	}
	how = "rootful"
	if rootless, err := b.p.output(ctx, "info", "--format", "{{.Host.Security.Rootless}}"); err == nil && rootless == "true" {
		how = "rootless"
	}
	// The sandbox's flags, labels included, but on the bridge network.
	flags := b.p.sandboxFlags()
	if i := slices.Index(flags, "--network"); i >= 0 {
		flags[i+1] = "bridge"
	}
	args := append([]string{"run", "-d", "--pull", "missing", "--label", labelPublished + "=" + b.p.labels[labelRun]}, flags...)
	args = append(args, "-p", "127.0.0.1::"+strconv.Itoa(echoPort), "--init", b.cfg.Image)
	id, err := b.p.output(ctx, append(args, ncArgv(echoPort, echoArgv...)...)...)
	if err != nil {
		return "", how, err
	}
	out, err := b.p.output(ctx, "port", id, strconv.Itoa(echoPort)+"/tcp")
	if err != nil {
		return "", how, err
	}
	addr, _, _ = strings.Cut(out, "\n")
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", how, fmt.Errorf("podman port: %q: %w", out, err)
	}
	// The container runs; nc may not listen yet.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		err := echoAt(addr)(wctx)
		if err == nil {
			return addr, how, nil
		}
		select {
		case <-wctx.Done():
			return "", how, fmt.Errorf("no echo through %s: %w", addr, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// removePublished removes the published-port container, if any.
func (b *bench) removePublished(ctx context.Context) {
	rctx, cancel := removeContext(ctx)
	defer cancel()
	_ = b.p.removeLabelled(rctx, labelPublished, b.p.labels[labelRun]) // the bench's cleanup tries again
}

// bound ends c's reads and writes when ctx ends, or opTimeout from now;
// call the function it returns once done with c.
func bound(ctx context.Context, c net.Conn) func() bool {
	_ = c.SetDeadline(time.Now().Add(opTimeout))
	return context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
}

// dialFirstByte times vm.Dial of the hello server to the first byte
// read, then reads the rest and checks it, untimed.
func dialFirstByte(v vm.VM) func(context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		t0 := time.Now()
		c, err := vm.Dial(ctx, v, "tcp", loopback(helloPort))
		if err != nil {
			return 0, err
		}
		defer c.Close()
		defer bound(ctx, c)()
		var first [1]byte
		if _, err := io.ReadFull(c, first[:]); err != nil {
			return 0, fmt.Errorf("reading the first byte: %w", err)
		}
		d := time.Since(t0)
		rest, err := io.ReadAll(c)
		if got := string(first[:]) + string(rest); err != nil || got != helloWant {
			return 0, fmt.Errorf("the server said %q (%v), want %q", got, err, helloWant)
		}
		return d, nil
	}
}

// startFirstByte times vm.Start of `echo hi` to the first byte of its
// stdout, then waits for its end and checks its result, untimed.
func startFirstByte(v vm.VM) func(context.Context) (time.Duration, error) {
	return func(ctx context.Context) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(ctx, opTimeout)
		defer cancel()
		t0 := time.Now()
		p, err := vm.Start(ctx, v, echoHiCommand)
		if err != nil {
			return 0, err
		}
		r := p.Stdout().Reader(0)
		stop := context.AfterFunc(ctx, func() { r.Close() })
		var first [1]byte
		_, err = io.ReadFull(r, first[:])
		d := time.Since(t0)
		stop()
		if err != nil {
			return 0, errors.Join(fmt.Errorf("reading the first byte: %w", err), endProcess(ctx, p))
		}
		res, err := p.Wait(ctx)
		switch {
		case err != nil:
			return 0, errors.Join(err, endProcess(ctx, p))
		case res.ExitCode != 0 || res.Stdout != "hi\n":
			return 0, fmt.Errorf("echo hi: exit %d, stdout %q, want 0 and %q", res.ExitCode, res.Stdout, "hi\n")
		}
		return d, nil
	}
}

// readBulk reads c to its end with 64 KiB reads, closes it, and fails
// unless n bytes came. The copy's buffer is used as it is: io.Discard's
// ReadFrom and a TCP connection's WriteTo would read 8 KiB at a time.
func readBulk(ctx context.Context, c net.Conn, n int64) error {
	defer c.Close()
	defer bound(ctx, c)()
	got, err := io.CopyBuffer(struct{ io.Writer }{io.Discard}, struct{ io.Reader }{c}, make([]byte, streamBlock))
	switch {
	case err != nil:
		return fmt.Errorf("after %d bytes: %w", got, err)
	case got != n:
		return fmt.Errorf("%d bytes, want %d", got, n)
	}
	return nil
}

// forwardBulk reads the bulk server's n bytes through forward f.
func forwardBulk(f *vm.Forwarder, n int64) op {
	addr := f.Addr().String()
	return func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return readBulk(ctx, c, n)
	}
}

// dialBulk reads the bulk server's n bytes through a vm.Dial connection.
func dialBulk(v vm.VM, n int64) op {
	return func(ctx context.Context) error {
		c, err := vm.Dial(ctx, v, "tcp", loopback(bulkPort))
		if err != nil {
			return err
		}
		return readBulk(ctx, c, n)
	}
}

// echoAt connects to addr, writes a line, reads it back and closes.
func echoAt(addr string) op {
	return func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return echoOver(ctx, c)
	}
}

// dialEcho is echoAt through a vm.Dial connection to the echo server.
func dialEcho(v vm.VM) op {
	return func(ctx context.Context) error {
		c, err := vm.Dial(ctx, v, "tcp", loopback(echoPort))
		if err != nil {
			return err
		}
		return echoOver(ctx, c)
	}
}

// echoOver echoes a line over c and closes c.
func echoOver(ctx context.Context, c net.Conn) error {
	defer c.Close()
	return echoLine(ctx, c)
}

// echoLine writes a line on c and reads it back.
func echoLine(ctx context.Context, c net.Conn) error {
	defer bound(ctx, c)()
	if _, err := io.WriteString(c, echoPayload); err != nil {
		return fmt.Errorf("writing: %w", err)
	}
	buf := make([]byte, len(echoPayload))
	if _, err := io.ReadFull(c, buf); err != nil {
		return fmt.Errorf("reading the echo: %w", err)
	}
	if string(buf) != echoPayload {
		return fmt.Errorf("echoed %q, want %q", buf, echoPayload)
	}
	return nil
}

func (b *bench) reportLive(w io.Writer) {
	r := b.live
	n := b.sz.streamBytes
	fmt.Fprintf(w, "\n**Live, first byte**: from calling `vm.Dial` to the first byte of a server on the sandbox's loopback (`%s`, cmd/hellosrv: a Go server that answers in the process that accepts, where busybox's fork one per connection; the sandbox has no network), and from calling `vm.Start` of `%s` to the first byte of its stdout, against a Run's round trip of `%s` on the same backend; reading the rest, closing and waiting untimed; with what bounds the first: a line echoed over a connection kept open to `%s`, and the command alone; the Dial rows round-robin with the echo rows, the Start rows with the Run rows and the spawn rows apart (a Run or a spawn leaves the agent work that falls on the next op timed); %s\n\n",
		shellLine(helloServerArgv), shellLine(echoHiArgv), shellLine(roundTripArgv), shellLine(ncArgv(echoPort, echoArgv...)), runs(r.first))
	fmt.Fprintln(w, "| how | p50 | p90 | p50 vs the backend's Run | failures |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|")
	for _, s := range r.first {
		fmt.Fprintln(w, row(s, find(r.first, r.ref[s.name])))
	}

	fmt.Fprintf(w, "\n**Live, throughput** of %s from `%s` in the sandbox, read by this process with 64 KiB reads through a `vm.Forward` (a TCP connection to its port on 127.0.0.1) and through a `vm.Dial` connection, against the same dd's stdout through a Run into its 1 MiB capped capture; %s\n\n",
		mib(n), shellLine(ncArgv(bulkPort, streamArgv(n)...)), runs(r.bulk))
	fmt.Fprintln(w, "| how | p50 | p90 | MiB/s at p50 | vs the backend's Run | failures |")
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|")
	for _, s := range r.bulk {
		if !s.ok() {
			fmt.Fprintf(w, "| %s | %s | | | | %s |\n", s.name, skipped(s), failures(s))
			continue
		}
		vs := "–"
		if ref := find(r.bulk, r.ref[s.name]); ref != nil {
			vs = ratio(float64(ref.p50()), float64(s.p50()))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.0f | %s | %s |\n", s.name, ms(s.p50()), ms(s.p90()), mibps(n, s.p50()), vs, failures(s))
	}

	how := ""
	if r.published != "" {
		how = ", " + r.published
	}
	reportP50(w, fmt.Sprintf("**Live, connect and echo**: connect, write a line, read it back, close; to `%s` in each sandbox (no network) through a `vm.Forward`, plain and `WithWarmConnection`, and through `vm.Dial`, against the same server in a container on Podman's bridge network with its port published on 127.0.0.1 (`podman run -p`%s);",
		shellLine(ncArgv(echoPort, echoArgv...)), how), r.echo, namePublished, "published port")
	if len(r.notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range r.notes {
			fmt.Fprintln(w, "- Live: "+n)
		}
	}
}

// liveTargets are the section's rows of the targets table.
func (b *bench) liveTargets() []target {
	r := b.live
	if r == nil {
		return nil
	}
	n := b.sz.streamBytes
	var ts []target
	for _, be := range backends[:2] {
		short := strings.TrimPrefix(be.name, "podvm ")
		get := func(ss []*series, what string) *series { return find(ss, liveRow(be.name, what)) }
		run := get(r.first, whatRun)

		t := target{what: fmt.Sprintf("%s: `vm.Dial` to the first byte p50 ≤ %s", short, ms(dialFirstTarget))}
		if x := get(r.first, whatDial); x != nil {
			t.have, t.pass, t.measured = true, x.p50() <= dialFirstTarget, ms(x.p50())
			t.bound = "the agent's connect in the sandbox, and the channel the byte crosses"
			if ch := get(r.first, whatChannel); ch != nil {
				t.bound = fmt.Sprintf("the channel (a line echoed over an open connection takes %s) and the agent's connect in the sandbox with this process's side, the other %s",
					ms(ch.p50()), ms(max(0, x.p50()-ch.p50())))
			}
		}
		ts = append(ts, t)

		t = target{what: fmt.Sprintf("%s: a forwarded connection carries ≥ %.1f× the bytes/s of Run's stdout", short, forwardBWTarget)}
		if x, y := get(r.bulk, whatFwdBulk), get(r.bulk, whatRunBulk); x != nil && y != nil {
			fx, fy := mibps(n, x.p50()), mibps(n, y.p50())
			t.have, t.pass = true, fx >= forwardBWTarget*fy
			t.measured = fmt.Sprintf("%.2f× (%.0f vs %.0f MiB/s)", fx/fy, fx, fy)
			t.bound = "the agent's connection: framing and credit per window, and the copy into the client's socket"
			if d := get(r.bulk, whatDialBulk); d != nil {
				t.bound = fmt.Sprintf("the agent's connection: a `vm.Dial` connection read alike does %.0f MiB/s, and the forward carries %.0f%% of that", mibps(n, d.p50()), 100*float64(d.p50())/float64(x.p50()))
			}
		}
		ts = append(ts, t)

		t = target{what: fmt.Sprintf("%s: connect + echo through a forward `WithWarmConnection` p50 ≤ %.1f× a port published with `podman run -p`", short, warmEchoTarget)}
		pub, plain, warm := find(r.echo, namePublished), get(r.echo, whatPlain), get(r.echo, whatWarm)
		if warm != nil && pub != nil {
			q := float64(warm.p50()) / float64(pub.p50())
			t.have, t.pass = true, q <= warmEchoTarget
			t.measured = fmt.Sprintf("warm %.2f× (%s vs %s)", q, ms(warm.p50()), ms(pub.p50()))
			if plain != nil {
				t.measured += fmt.Sprintf("; plain %.2f× (%s)", float64(plain.p50())/float64(pub.p50()), ms(plain.p50()))
			}
			t.bound = "the agent's channel: the line crosses it both ways"
			if d := get(r.echo, whatDialEcho); d != nil {
				t.bound += fmt.Sprintf("; through `vm.Dial`, no listener in between, it takes %s", ms(d.p50()))
			}
		}
		ts = append(ts, t)

		t = target{what: fmt.Sprintf("%s: `vm.Start`'s first output byte p50 ≤ a Run's round trip p50 + %s", short, ms(startFirstTarget))}
		if x := get(r.first, whatStart); x != nil && run != nil {
			t.have, t.pass = true, x.p50() <= run.p50()+startFirstTarget
			t.measured = fmt.Sprintf("%s vs %s + %s", ms(x.p50()), ms(run.p50()), ms(startFirstTarget))
			t.bound = fmt.Sprintf("starting the process and reading its stream: %s past the Run's round trip", ms(x.p50()-run.p50()))
		}
		ts = append(ts, t)
	}
	return ts
}

// buildHello builds cmd/hellosrv, static, and returns the executable.
func buildHello(ctx context.Context) ([]byte, error) {
	dir, err := os.MkdirTemp("", "podvm-bench-hello-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	_, here, _, _ := runtime.Caller(0)
	out := filepath.Join(dir, helloName)
	c := osexec.CommandContext(ctx, "go", "build", "-buildvcs=false", "-o", out, "./cmd/hellosrv")
	c.Dir, c.Env = filepath.Dir(here), append(os.Environ(), "CGO_ENABLED=0")
	if said, err := c.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building cmd/hellosrv: %w: %s", err, said)
	}
	return os.ReadFile(out)
}

// executableTar is a tar stream of one executable file, name, holding b.
func executableTar(name string, b []byte) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o755, Size: int64(len(b))})
	_, _ = tw.Write(b)
	_ = tw.Close()
	return buf.Bytes()
}
