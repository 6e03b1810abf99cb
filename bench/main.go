// Command bench compares podvm with what its users would otherwise use, in
// one run on one Podman service and one image, and prints the result as
// markdown tables: exec round trips, sandbox lifecycles, stdout
// throughput, memory while output streams, concurrency, pools, files,
// snapshots, and the services and processes a live sandbox holds
// (live.go), with the ratios podvm sets itself as targets; then, on a
// Kubernetes cluster, podvm's kube backend against kubectl (kube.go).
//
// The alternatives are the podman CLI run as a process (`podman --url
// URL ...`), Podman's own Go bindings (pkg/bindings/containers), and the
// OCI runtime itself (`runc exec`, the floor). Within each comparison they
// run round-robin after a warm-up, so that machine noise hits all alike.
//
// It needs CONTAINER_HOST (a Podman API socket on this machine) and uses
// PODVM_TEST_IMAGE (default localhost/podvm-test:latest). BENCH_QUICK=1
// (or -quick) makes a short smoke run; BENCH_ONLY=exec,stream (or -only)
// runs only some comparisons. A comparison stops adding rounds after a
// time budget, so a loaded machine yields fewer samples, not a longer
// run; the header gives the load average. Every container it makes
// carries io.podvm.managed=true and a label of this run, and is removed
// at the end, on failure or on Ctrl-C.
//
// The checkpoint section (checkpoint.go) needs a service whose CRIU can
// checkpoint (vm.CheckpointSupport): the Podman 5.4 service of `make
// podman5`, which `BENCH_PODMAN5=1 make bench` uses with its own CLI
// ($PODMAN, scripts/podman5-cli); elsewhere it is skipped, saying why.
// Its checkpoints are written in a directory of the run's under
// vm.DefaultCheckpointDir, removed at the section's end.
//
// The kube section uses the cluster of $KUBECONFIG with the image
// $PODVM_KUBE_IMAGE in $PODVM_KUBE_NAMESPACE, and $PODVM_KUBECTL (what
// `eval "$(scripts/kube-up.sh)"` sets); without them it is skipped,
// saying why, and the others run as before. Its pods carry the same
// labels and are deleted the same way.
//
// It lives in its own module because pkg/bindings/containers needs the
// build tags "remote containers_image_openpgp exclude_graphdriver_btrfs";
// the podvm module itself builds with none.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/sshhost"
	"github.com/podvm/podvm/vm"
)

// labelRun marks every container of one bench run, so the end of the run
// removes exactly those.
const labelRun = "io.podvm.bench.run"

// sizes is how much each comparison does.
type sizes struct {
	warm        int           // untimed rounds before each comparison
	exec        int           // timed exec round trips per alternative
	lifecycle   int           // timed lifecycles per alternative
	stream      int           // timed streams per alternative
	streamBytes int64         // bytes per stream
	memBytes    int64         // bytes streamed through the capture: the target is per GiB
	budget      time.Duration // time after which a comparison stops adding rounds
	window      time.Duration // per concurrency measurement
	callers     []int
}

var (
	full  = sizes{warm: 3, exec: 40, lifecycle: 10, stream: 5, streamBytes: 256 << 20, memBytes: 1 << 30, budget: 45 * time.Second, window: 3 * time.Second, callers: []int{1, 4, 16}}
	quick = sizes{warm: 1, exec: 8, lifecycle: 2, stream: 1, streamBytes: 64 << 20, memBytes: 256 << 20, budget: 10 * time.Second, window: time.Second / 2, callers: []int{1, 4, 16}}
)

func main() {
	os.Exit(run())
}

func run() int {
	q := flag.Bool("quick", os.Getenv("BENCH_QUICK") == "1", "a short smoke run (also BENCH_QUICK=1)")
	only := flag.String("only", os.Getenv("BENCH_ONLY"), "run only these comparisons, comma-separated: "+strings.Join(sectionNames, ",")+" (also BENCH_ONLY)")
	flag.Parse()
	sections, err := pickSections(*only)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 2
	}
	sz := full
	if *q {
		sz = quick
	}
	host := os.Getenv("CONTAINER_HOST")
	if host == "" {
		fmt.Fprintln(os.Stderr, `bench: CONTAINER_HOST is not set: run eval "$(scripts/podman-up.sh)" first`)
		return 2
	}
	image := os.Getenv("PODVM_TEST_IMAGE")
	if image == "" {
		image = "localhost/podvm-test:latest"
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The bindings and `podman --url` below would add an ssh:// host
	// missing from known_hosts to it: refuse it first, as podvm does.
	if err := sshhost.Check(ctx, host); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %s: %v\n", host, err)
		return 2
	}

	var tok [6]byte
	_, _ = rand.Read(tok[:])
	token := strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(tok[:])
	b := &bench{
		sz:    sz,
		quick: *q,
		// podvm's own labels, so that vm.Reap removes what a killed run left.
		p: &podman{bin: podmanBin(), url: host, labels: vm.ManagedLabels(map[string]string{labelRun: token})},
	}
	b.cfg = vm.Config{Image: image, Labels: map[string]string{labelRun: token}}

	err = b.run(ctx, sections)
	cleanupErr := b.cleanup()
	switch {
	case ctx.Err() != nil:
		fmt.Fprintln(os.Stderr, "bench: interrupted; its containers are removed")
		return 130
	case err != nil:
		fmt.Fprintln(os.Stderr, "bench:", err)
		return 1
	}
	b.report(os.Stdout)
	b.reportPool(os.Stdout)
	b.reportSnapshots(os.Stdout)
	b.reportCheckpoint(os.Stdout)
	b.reportKube(os.Stdout)
	if cleanupErr != nil {
		fmt.Fprintln(os.Stderr, "bench: cleanup:", cleanupErr)
		return 1
	}
	return 0
}

// podmanBin is $PODMAN, else podman.
func podmanBin() string {
	if p := os.Getenv("PODMAN"); p != "" {
		return p
	}
	return "podman"
}

// bench holds one run: its setup, its sandboxes and its results.
type bench struct {
	sz    sizes
	quick bool
	cfg   vm.Config // the podvm sandboxes'; its Image is every sandbox's
	p     *podman   // its url is the service's; its labels mark this run

	base    string            // the sandbox the non-podvm alternatives exec in
	bind    *podmanBindings   // one shared connection
	runtime *runc             // nil when the runtime cannot be reached
	rtErr   error             // why
	vms     map[string]vm.VM  // one running sandbox per podvm backend
	vmErr   map[string]string // backends that could not make one
	bare    bares             // the agent's bounds, in bare.go

	env     environment
	started time.Time

	execRes, lifeRes, streamRes []*series
	stdinRes                    []*series // in stdin.go
	filesIn, filesOut           []*series // in files.go
	treeFiles                   int
	treeBytes                   int64
	mem                         []memRow
	conc                        []concRow
	leaks                       []string
	pool                        []poolResult
	snaps                       []snapshotResult // in snapshot.go
	live                        *liveResult      // in live.go
	ckpt                        *ckptResult      // in checkpoint.go
	kube                        *kubeResult      // in kube.go
	cluster                     *cluster         // the kube section's, nil without one
}

type memRow struct {
	name string
	g    growth
	skip string
}

type concRow struct {
	name  string
	rates []rate
	skip  string
}

// sectionNames name the comparisons, in the order they run.
var sectionNames = []string{"exec", "lifecycle", "stream", "stdin", "memory", "concurrency", "pool", "files", "snapshot", "live", "checkpoint", "kube"}

// pickSections parses -only; empty means every comparison.
func pickSections(only string) (map[string]bool, error) {
	pick := map[string]bool{}
	for _, s := range strings.Split(only, ",") {
		s = strings.TrimSpace(s)
		switch {
		case s == "":
		case slices.Contains(sectionNames, s):
			pick[s] = true
		default:
			return nil, fmt.Errorf("-only %q: no comparison %q; there are %s", only, s, strings.Join(sectionNames, ", "))
		}
	}
	if len(pick) == 0 {
		for _, s := range sectionNames {
			pick[s] = true
		}
	}
	return pick, nil
}

func (b *bench) run(ctx context.Context, sections map[string]bool) error {
	b.started = time.Now()
	var err error
	if b.env, err = probeEnvironment(ctx, b.p); err != nil {
		return err
	}
	b.vms, b.vmErr = map[string]vm.VM{}, map[string]string{}
	if podmanSections(sections) {
		if err := b.setup(ctx); err != nil {
			return err
		}
	}

	if sections["exec"] || sections["stream"] {
		b.setupBares(ctx)
	}

	steps := []func(context.Context) error{b.execRoundTrips, b.lifecycles, b.streams, b.stdins, b.memory, b.concurrency, b.pools, b.files, b.snapshots, b.lives, b.checkpoints, b.kubes}
	for i, step := range steps {
		if !sections[sectionNames[i]] {
			continue
		}
		if err := step(ctx); err != nil {
			return err
		}
		if err := b.checkSandboxes(ctx); err != nil {
			return err
		}
	}
	b.env.loadEnd = loadAverage()
	return nil
}

// podmanSections reports whether a picked section needs the Podman
// sandboxes: every one but kube, and checkpoint, which makes its own.
func podmanSections(sections map[string]bool) bool {
	for s, on := range sections {
		if on && s != "kube" && s != "checkpoint" {
			return true
		}
	}
	return false
}

// setup starts the sandboxes the Podman sections share: the reference
// one, the bindings' connection, the runtime's, and one per podvm
// backend.
func (b *bench) setup(ctx context.Context) error {
	progress("setting up")
	var err error
	if b.base, err = b.p.start(ctx, b.cfg.Image); err != nil {
		return fmt.Errorf("starting the reference sandbox: %w", err)
	}
	if b.bind, err = connectBindings(ctx, b.p.url, b.p.labels); err != nil {
		return err
	}
	b.runtime, b.rtErr = findRuntime(ctx, b.env.rtName, b.env.rtPath, b.base)
	for _, be := range backends {
		v, err := be.new(ctx, b.p.url, b.cfg)
		if err == nil {
			b.vms[be.name] = v // Remove is safe after a failed Create
			err = v.Create(ctx)
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			b.vmErr[be.name] = "failed: " + oneLine(err)
		}
	}
	return nil
}

// checkSandboxes fails when a sandbox the run relies on is gone: results
// measured against a missing container are errors, not timings.
func (b *bench) checkSandboxes(ctx context.Context) error {
	ids := map[string]string{}
	if b.base != "" {
		ids["the reference sandbox"] = b.base
	}
	for name, v := range b.vms {
		if _, bad := b.vmErr[name]; !bad {
			ids[name+"'s sandbox"] = v.ID()
		}
	}
	for what, id := range ids {
		ok, err := b.p.exists(ctx, id)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%s (%.12s) was removed behind the bench's back: is another process running scripts/podman-clean.sh or check-leaks.sh?", what, id)
		}
	}
	return nil
}

// vmAlts are podvm's alternatives, one per backend, built by mk from the
// backend's sandbox, or skipped saying why there is none.
func (b *bench) vmAlts(mk func(vm.VM) op) []alt {
	var alts []alt
	for _, be := range backends {
		if why, bad := b.vmErr[be.name]; bad {
			alts = append(alts, alt{name: be.name, skip: why})
			continue
		}
		alts = append(alts, alt{name: be.name, op: mk(b.vms[be.name])})
	}
	return alts
}

func (b *bench) runcAlt(name string, mk func(*runc) op) alt {
	if b.runtime == nil {
		return alt{name: name, skip: "unavailable: " + oneLine(b.rtErr)}
	}
	return alt{name: name, op: mk(b.runtime)}
}

func (b *bench) execRoundTrips(ctx context.Context) error {
	alts := b.vmAlts(vmRoundTrip)
	for _, name := range []string{nameAPIVM, nameCLIVM} {
		if v, ok := b.vms[name]; ok {
			alts = append(alts, alt{name: name + ": `/bin/true`", op: vmRun(v, []string{"/bin/true"})})
		}
	}
	alts = append(alts, b.bareAlts(nameFloorAPI, nameFloorCLI, (*bare).echo)...)
	if _, bad := b.vmErr[nameAPIVM]; bad {
		alts = append(alts, alt{name: nameSpawn, skip: "no sandbox: " + b.vmErr[nameAPIVM]})
	} else {
		alts = append(alts, alt{name: nameSpawn, op: vmRun(b.vms[nameAPIVM], spawnArgv), per: spawnLoops})
	}
	alts = append(alts,
		alt{name: nameHost, op: hostRoundTrip(exec.NewCommandExecutor())},
		alt{name: nameCLIExec, op: b.p.execRoundTrip(b.base)},
		alt{name: nameBindings, op: b.bind.execRoundTrip(b.base)},
		b.runcAlt(nameRunc, func(r *runc) op { return r.execRoundTrip(b.base) }),
	)
	// Count what each alternative leaves open: the calls run one at a
	// time, so the difference around a call is that call's.
	held := make([]leak, len(alts))
	for i := range alts {
		alts[i].held = &held[i]
	}
	var err error
	b.execRes, err = measure(ctx, "exec round trip", alts, b.sz.warm, b.sz.exec, b.sz.budget)
	for i, a := range alts {
		if s := held[i].String(); s != "" {
			b.leaks = append(b.leaks, fmt.Sprintf("%s: %s after %d exec round trips", a.name, s, held[i].calls))
		}
	}
	return err
}

func (b *bench) lifecycles(ctx context.Context) error {
	var alts []alt
	for _, be := range backends {
		alts = append(alts, alt{name: be.name, op: vmLifecycle(be, b.p.url, b.cfg)})
	}
	alts = append(alts,
		alt{name: nameCLIPair, op: b.p.lifecycle(b.cfg.Image)},
		alt{name: nameBindingsLife, op: connectedLifecycle(b.p.url, b.p.labels, b.cfg.Image)},
	)
	var err error
	b.lifeRes, err = measure(ctx, "lifecycle", alts, 1, b.sz.lifecycle, b.sz.budget)
	return err
}

func (b *bench) streams(ctx context.Context) error {
	n := b.sz.streamBytes
	alts := append(b.vmAlts(func(v vm.VM) op { return vmStream(v, n) }),
		b.bareAlts(nameBareStreamAPI, nameBareStreamCLI, func(x *bare) op { return x.stream(n) })...)
	alts = append(alts,
		alt{name: nameCLIStream, op: b.p.execStream(b.base, n)},
		alt{name: nameCLIPipe, op: b.p.execStreamPipe(b.base, n)},
		alt{name: nameBindingsStream, op: b.bind.execStream(b.base, n)},
		b.runcAlt(nameRuncStream, func(r *runc) op { return r.execStream(b.base, n) }),
	)
	var err error
	b.streamRes, err = measure(ctx, "stdout throughput", alts, 1, b.sz.stream, b.sz.budget)
	return err
}

// memory streams memBytes through each alternative alone, after the
// earlier comparisons warmed them up.
func (b *bench) memory(ctx context.Context) error {
	n := b.sz.memBytes
	alts := append(b.vmAlts(func(v vm.VM) op { return vmStream(v, n) }),
		alt{name: nameBindingsStream, op: b.bind.execStream(b.base, n)})
	for _, a := range alts {
		progress("memory: %s", a.name)
		if a.skip != "" {
			b.mem = append(b.mem, memRow{name: a.name, skip: a.skip})
			continue
		}
		b.mem = append(b.mem, memRow{name: a.name, g: measureGrowth(ctx, a.op)})
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	progress("")
	return nil
}

func (b *bench) concurrency(ctx context.Context) error {
	type cAlt struct {
		name string
		mk   func() op // one per caller
		skip string
	}
	var alts []cAlt
	for _, a := range b.vmAlts(vmRoundTrip) {
		alts = append(alts, cAlt{name: a.name, skip: a.skip, mk: func() op { return a.op }})
	}
	alts = append(alts,
		cAlt{name: nameCLIExec, mk: func() op { return b.p.execRoundTrip(b.base) }},
		cAlt{name: nameBindingsShared, mk: func() op { return b.bind.execRoundTrip(b.base) }},
		cAlt{name: nameBindingsOwn, mk: func() op {
			own, err := connectBindings(ctx, b.p.url, b.p.labels)
			if err != nil {
				return func(context.Context) error { return err }
			}
			return own.execRoundTrip(b.base)
		}},
	)
	b.conc = make([]concRow, len(alts))
	for i, a := range alts {
		b.conc[i] = concRow{name: a.name, skip: a.skip, rates: make([]rate, len(b.sz.callers))}
	}
	for j, callers := range b.sz.callers {
		for k := range alts {
			i := (j + k) % len(alts)
			if alts[i].skip != "" {
				continue
			}
			progress("concurrency: %d callers: %s", callers, alts[i].name)
			b.conc[i].rates[j] = hammerEach(ctx, alts[i].mk, callers, b.sz.window)
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	}
	progress("")
	return nil
}

// cleanup removes the podvm sandboxes with their own Remove, then every
// container of this run that is left, with a context of its own: ctx may
// be what ended the run.
func (b *bench) cleanup() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	b.closeBares()
	for name, v := range b.vms {
		if err := v.Remove(ctx); err != nil {
			errs = append(errs, fmt.Errorf("%s: Remove: %w", name, err))
		}
	}
	if err := b.p.removeLabelled(ctx, labelRun, b.p.labels[labelRun]); err != nil {
		errs = append(errs, err)
	}
	if err := b.removeImages(ctx); err != nil {
		errs = append(errs, err)
	}
	if b.cluster != nil {
		if err := b.cluster.release(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// environment is what the header says about the machine and the service.
type environment struct {
	server, api, runtime, kernel, cpu, mem, goVersion string
	rtName, rtPath                                    string // the OCI runtime's, from podman info
	loadStart, loadEnd                                string // 1-minute load averages
	cpus                                              int
}

func probeEnvironment(ctx context.Context, p *podman) (environment, error) {
	var e environment
	v, err := p.output(ctx, "version", "--format", "{{.Server.Version}}\t{{.Server.APIVersion}}")
	if err != nil {
		return e, fmt.Errorf("is the Podman service at %s up? %w", p.url, err)
	}
	e.server, e.api, _ = strings.Cut(v, "\t")
	// The version goes last: it may span lines.
	if rt, err := p.output(ctx, "info", "--format", "{{.Host.OCIRuntime.Name}}\t{{.Host.OCIRuntime.Path}}\t{{.Host.OCIRuntime.Version}}"); err == nil {
		f := strings.SplitN(rt, "\t", 3)
		if len(f) == 3 {
			e.rtName, e.rtPath = f[0], f[1]
			e.runtime, _, _ = strings.Cut(f[2], "\n")
		}
	}
	e.fillMachine()
	e.loadStart = loadAverage()
	return e, nil
}
