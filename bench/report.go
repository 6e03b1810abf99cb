package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Row names of the alternatives that are not podvm.
const (
	nameCLIExec        = "`podman exec` (a process)"
	nameBindings       = "bindings: ExecCreate + ExecStartAndAttach + ExecInspect"
	nameRunc           = "`runc exec` (the floor)"
	nameHost           = "the same command on the host, `exec.CommandExecutor` (no sandbox)"
	nameCLIPair        = "`podman run -d` + `podman exec` + `podman rm -f -t 0`"
	nameBindingsLife   = "bindings: NewConnection + CreateWithSpec + Start + exec + Remove"
	nameCLIStream      = "`podman exec … > /dev/null`"
	nameCLIPipe        = "`podman exec …` read through a pipe, discarded"
	nameBindingsStream = "bindings into a 1 MiB capped capture"
	nameRuncStream     = "`runc exec … > /dev/null` (the floor)"
	nameBindingsShared = "bindings, one shared connection"
	nameBindingsOwn    = "bindings, one connection per caller"
	nameAPIVM          = "podvm APIVM, agent"
	nameCLIVM          = "podvm CLIVM, agent"
	nameAPIVMExec      = "podvm APIVM, Podman exec"
	nameCLIVMExec      = "podvm CLIVM, Podman exec"
	nameFloorAPI       = "the channel alone, APIVM's: a line echoed by a bare container's shell through the service's attach (no agent, no process)"
	nameFloorCLI       = "the channel alone, CLIVM's: the same through `podman start -a -i`"
	nameSpawn          = "the command alone: started and waited by a shell loop in APIVM's sandbox, output to /dev/null, per command"
	nameBareStreamAPI  = "a bare container's dd, read through the service's attach (no agent)"
	nameBareStreamCLI  = "a bare container's dd, read through `podman start -a -i` (no agent)"
)

// leak counts what timed calls left open: file descriptors and
// goroutines, counted by measure around each call, outside its timing.
type leak struct{ calls, fds, goroutines, f0, g0 int }

func (l *leak) before() { l.f0, l.g0 = openFDs(), runtime.NumGoroutine() }

func (l *leak) after() {
	l.calls++
	l.fds += openFDs() - l.f0
	l.goroutines += runtime.NumGoroutine() - l.g0
}

// String describes a leak, "" when the descriptors stay within what a
// connection pool keeps. Goroutines are only reported: other
// alternatives' idle connections start and end theirs at any time.
func (l *leak) String() string {
	if l.fds < 4 {
		return ""
	}
	return fmt.Sprintf("+%d open file descriptors, +%d goroutines", l.fds, l.goroutines)
}

func openFDs() int {
	d, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 0
	}
	return len(d)
}

func (e *environment) fillMachine() {
	e.cpus = runtime.NumCPU()
	e.goVersion = runtime.Version()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		e.kernel = strings.TrimSpace(string(b))
	}
	e.cpu = procField("/proc/cpuinfo", "model name")
	if m := procField("/proc/meminfo", "MemTotal"); m != "" {
		kb, _ := strconv.ParseInt(strings.TrimSuffix(m, " kB"), 10, 64)
		e.mem = fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20))
	}
}

// loadAverage is the 1-minute load average, "" if unknown.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// procField is the value of the first "key: value" line of a /proc file.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func find(ss []*series, name string) *series {
	for _, s := range ss {
		if s.name == name && s.ok() {
			return s
		}
	}
	return nil
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// mibps is the throughput of n bytes in d.
func mibps(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / (1 << 20) / d.Seconds()
}

// report writes the tables of the comparisons that ran as markdown.
func (b *bench) report(w io.Writer) {
	e := b.env
	mode := "`make bench`"
	if b.quick {
		mode = "`BENCH_QUICK=1 make bench` (a smoke run: few samples)"
	}
	fmt.Fprintf(w, "### podvm benchmark, %s\n\n", b.started.UTC().Format("2006-01-02 15:04 MST"))
	fmt.Fprintf(w, "Podman %s server (API %s, %s) over %s; image `%s`; Linux %s, %d CPUs (%s), %s RAM; %s; %s, %s in all. ",
		e.server, e.api, e.runtime, scheme(b.p.url), b.cfg.Image, e.kernel, e.cpus, e.cpu, e.mem, e.goVersion, mode,
		time.Since(b.started).Round(time.Second))
	fmt.Fprintf(w, "Load average %s at the start, %s at the end. The alternatives run round-robin after warm-up rounds (%d before the exec round trips, 1 before the other comparisons); p50 and p90 by nearest rank.\n",
		e.loadStart, e.loadEnd, b.sz.warm)
	if len(b.execRes) > 0 {
		b.reportExec(w)
	}
	if len(b.lifeRes) > 0 {
		b.reportLifecycle(w)
	}
	if len(b.streamRes) > 0 {
		b.reportStream(w)
	}
	if len(b.stdinRes) > 0 {
		b.reportStdin(w)
	}
	if len(b.mem) > 0 {
		b.reportMemory(w)
	}
	if len(b.conc) > 0 {
		b.reportConcurrency(w)
	}
	if len(b.filesIn) > 0 {
		b.reportFiles(w)
	}
	if b.live != nil {
		b.reportLive(w)
	}
	if b.base != "" { // the Podman sections ran: not kube alone
		b.reportTargets(w)
		b.reportNotes(w)
	}
}

func (b *bench) reportExec(w io.Writer) {
	reportP50(w, fmt.Sprintf("**Exec round trip** of `%s` in one running sandbox,", shellLine(roundTripArgv)), b.execRes, nameRunc, "runc")
}

func (b *bench) reportLifecycle(w io.Writer) {
	reportP50(w, "**Sandbox lifecycle**: create, start, the round trip, remove;", b.lifeRes, nameCLIPair, "CLI")
}

// reportP50 is a table of ss with each p50 as a ratio to base's.
func reportP50(w io.Writer, caption string, ss []*series, base, baseLabel string) {
	fmt.Fprintf(w, "\n%s %s\n\n", caption, runs(ss))
	ref := find(ss, base)
	if ref == nil { // nothing to compare with: no column for it
		fmt.Fprintln(w, "| how | p50 | p90 | failures |")
		fmt.Fprintln(w, "|---|--:|--:|--:|")
		for _, s := range ss {
			if !s.ok() {
				fmt.Fprintf(w, "| %s | %s | | %s |\n", s.name, skipped(s), failures(s))
				continue
			}
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", s.name, ms(s.p50()), ms(s.p90()), failures(s))
		}
		return
	}
	fmt.Fprintf(w, "| how | p50 | p90 | p50 vs %s | failures |\n", baseLabel)
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|")
	for _, s := range ss {
		fmt.Fprintln(w, row(s, ref))
	}
}

func (b *bench) reportStream(w io.Writer) {
	n := b.sz.streamBytes
	reportThroughput(w, fmt.Sprintf("**Stdout throughput** of %s: `%s`, %s; podvm keeps its default 1 MiB capture", mib(n), shellLine(streamArgv(n)), runs(b.streamRes)),
		b.streamRes, n, nameCLIStream, "CLI")
}

// reportThroughput is a table of how fast each of ss moved n bytes, and
// its speed against that of the row named ref.
func reportThroughput(w io.Writer, caption string, ss []*series, n int64, ref, refLabel string) {
	fmt.Fprintf(w, "\n%s\n\n", caption)
	base := find(ss, ref)
	fmt.Fprintf(w, "| how | p50 | p90 | MiB/s at p50 | vs %s | failures |\n", refLabel)
	fmt.Fprintln(w, "|---|--:|--:|--:|--:|--:|")
	for _, s := range ss {
		if !s.ok() {
			fmt.Fprintf(w, "| %s | %s | | | | %s |\n", s.name, skipped(s), failures(s))
			continue
		}
		vs := "–"
		if base != nil {
			vs = ratio(float64(base.p50()), float64(s.p50()))
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.0f | %s | %s |\n", s.name, ms(s.p50()), ms(s.p90()), mibps(n, s.p50()), vs, failures(s))
	}
}

func (b *bench) reportMemory(w io.Writer) {
	fmt.Fprintf(w, "\n**Memory**: growth of this process while %s streams through a 1 MiB capped capture, one run each\n\n", mib(b.sz.memBytes))
	fmt.Fprintln(w, "| how | peak RSS growth | peak heap growth | allocated |")
	fmt.Fprintln(w, "|---|--:|--:|--:|")
	for _, r := range b.mem {
		switch {
		case r.skip != "":
			fmt.Fprintf(w, "| %s | %s | | |\n", r.name, r.skip)
		case r.g.err != nil:
			fmt.Fprintf(w, "| %s | failed: %s | | |\n", r.name, oneLine(r.g.err))
		default:
			fmt.Fprintf(w, "| %s | %s | %s | %s |\n", r.name, mib(r.g.rss), mib(r.g.heap), mib(int64(r.g.alloc)))
		}
	}
}

func (b *bench) reportConcurrency(w io.Writer) {
	fmt.Fprintf(w, "\n**Concurrency**: exec round trips per second, the callers sharing one sandbox, %v per measure\n\n", b.sz.window)
	fmt.Fprint(w, "| how |")
	for _, c := range b.sz.callers {
		fmt.Fprintf(w, " %d caller%s |", c, plural(c))
	}
	fmt.Fprint(w, " failures |\n|---|")
	for range b.sz.callers {
		fmt.Fprint(w, "--:|")
	}
	fmt.Fprintln(w, "---|")
	for _, r := range b.conc {
		if r.skip != "" {
			fmt.Fprintf(w, "| %s |%s %s |\n", r.name, strings.Repeat(" |", len(b.sz.callers)), r.skip)
			continue
		}
		fmt.Fprintf(w, "| %s |", r.name)
		var fails []string
		for i, rt := range r.rates {
			fmt.Fprintf(w, " %.1f |", rt.perSecond())
			if rt.fails > 0 {
				fails = append(fails, fmt.Sprintf("%d of %d with %d: %s", rt.fails, rt.fails+rt.ops, b.sz.callers[i], oneLine(rt.err)))
			}
		}
		fmt.Fprintf(w, " %s |\n", orNone(strings.Join(fails, "; ")))
	}
}

func (b *bench) reportNotes(w io.Writer) {
	var notes []string
	if b.runtime != nil {
		notes = append(notes, fmt.Sprintf("The floor is `%s --root %s exec` on the sandbox Podman made: no API, no conmon, no exec session.", b.runtime.bin, b.runtime.root))
	}
	notes = append(notes, "Podman 4.x keeps each exec session's conmon for 300 s (`--exit-delay 300`): a run leaves hundreds of them behind for five minutes, for every alternative alike but the floor.")
	for _, l := range b.leaks {
		notes = append(notes, "Left open: "+l+".")
	}
	for _, ss := range [][]*series{b.execRes, b.lifeRes, b.streamRes} {
		for _, s := range ss {
			if s.fails > 0 {
				notes = append(notes, fmt.Sprintf("%s failed %d time(s), first: %s", s.name, s.fails, oneLine(s.err)))
			}
		}
	}
	fmt.Fprintln(w)
	for _, n := range notes {
		fmt.Fprintln(w, "- "+n)
	}
}

// runs says how many timed runs each alternative had: "40 runs each".
func runs(ss []*series) string {
	n := 0
	for _, s := range ss {
		n = max(n, len(s.d)+s.fails)
	}
	return fmt.Sprintf("%d run%s each", n, plural(n))
}

// target is a row of the targets table: what podvm promises, what was
// measured, and, on a miss, what bounds it.
type target struct {
	what     string
	measured string
	pass     bool
	have     bool // false: not measured in this run
	bound    string
}

func (b *bench) reportTargets(w io.Writer) {
	var ts []target
	p50ratio := func(what string, ss []*series, a, bName string, limit float64, bound func(x, y *series) string) {
		t := target{what: what}
		x, y := find(ss, a), find(ss, bName)
		if x != nil && y != nil {
			r := float64(x.p50()) / float64(y.p50())
			t.have, t.pass = true, r <= limit
			t.measured = fmt.Sprintf("%.2f× (%s vs %s)", r, ms(x.p50()), ms(y.p50()))
			if !t.pass {
				t.bound = bound(x, y)
			}
		}
		ts = append(ts, t)
	}
	floor := find(b.execRes, nameRunc)
	floorNote := func(x, _ *series) string {
		if floor == nil {
			return "the service's exec path"
		}
		return fmt.Sprintf("the service's exec path: runc alone takes %s of the %s", ms(floor.p50()), ms(x.p50()))
	}
	agentNote := func(x, _ *series) string {
		ch, cmd := find(b.execRes, floorOf(x.name)), find(b.execRes, nameSpawn)
		if ch == nil || cmd == nil {
			return "not measured in this run: the channel's and the command's rows are missing"
		}
		return fmt.Sprintf("the channel and the command: the channel alone (%s p50) and the command alone (%s) take %s of the %s; the agent and this process, the other %s",
			ms(ch.p50()), ms(cmd.p50()), ms(ch.p50()+cmd.p50()), ms(x.p50()), ms(x.p50()-ch.p50()-cmd.p50()))
	}
	for _, name := range []string{nameAPIVM, nameCLIVM} {
		short := strings.TrimPrefix(name, "podvm ")
		p50ratio(short+" round trip p50 ≤ 0.05× `runc exec`'s", b.execRes, name, nameRunc, 0.05, agentNote)
		t := target{what: short + " round trip p50 ≤ 1.2 ms"}
		if x := find(b.execRes, name); x != nil {
			t.have, t.pass, t.measured = true, x.p50() <= 1200*time.Microsecond, ms(x.p50())
			if !t.pass {
				t.bound = agentNote(x, nil)
			}
		}
		ts = append(ts, t)
	}
	p50ratio("APIVM, Podman exec: p50 ≤ 0.9× the bindings'", b.execRes, nameAPIVMExec, nameBindings, 0.9, floorNote)
	p50ratio("APIVM, Podman exec: p50 ≤ 0.6× `podman exec`'s", b.execRes, nameAPIVMExec, nameCLIExec, 0.6, floorNote)
	p50ratio("CLIVM, Podman exec: p50 ≤ 1.1× `podman exec`'s", b.execRes, nameCLIVMExec, nameCLIExec, 1.1, func(x, y *series) string {
		return fmt.Sprintf("`podman exec` itself: CLIVM runs one per Run, and adds %s for the capture and podvm's marker variable", ms(x.p50()-y.p50()))
	})
	p50ratio("APIVM lifecycle p50 ≤ 0.6× the CLI's", b.lifeRes, nameAPIVM, nameCLIPair, 0.6, func(x, _ *series) string {
		if bl := find(b.lifeRes, nameBindingsLife); bl != nil {
			return fmt.Sprintf("creating and starting the container in the service: Podman's own bindings take %s for the same", ms(bl.p50()))
		}
		return "creating and starting the container in the service"
	})
	for _, name := range []string{nameAPIVM, nameCLIVM} {
		short := strings.TrimPrefix(name, "podvm ")
		t := target{what: short + " throughput ≥ 0.8× `runc exec … > /dev/null`'s"}
		x, y := find(b.streamRes, name), find(b.streamRes, nameRuncStream)
		if x != nil && y != nil {
			n := b.sz.streamBytes
			t.have = true
			t.pass = mibps(n, x.p50()) >= 0.8*mibps(n, y.p50())
			t.measured = fmt.Sprintf("%.0f vs %.0f MiB/s", mibps(n, x.p50()), mibps(n, y.p50()))
			if !t.pass {
				t.bound = "not measured in this run: the bare container's row is missing"
				if bare := find(b.streamRes, bareStreamOf(name)); bare != nil {
					t.bound = fmt.Sprintf("the container's stdio: a bare container's dd read through the same attach, no agent in between, does %.0f MiB/s; the agent's path carries %.0f%% of that",
						mibps(n, bare.p50()), 100*float64(bare.p50())/float64(x.p50()))
				}
			}
		}
		ts = append(ts, t)
		t = target{what: short + " ≥ 1000 round trips/s with 16 callers"}
		for _, r := range b.conc {
			if r.name != name || r.skip != "" {
				continue
			}
			for i, c := range b.sz.callers {
				if c == 16 {
					ps := r.rates[i].perSecond()
					t.have, t.pass, t.measured = true, ps >= 1000, fmt.Sprintf("%.0f/s", ps)
					if !t.pass {
						t.bound = "not measured in this run: the command's row is missing"
						if cmd := find(b.execRes, nameSpawn); cmd != nil {
							t.bound = fmt.Sprintf("two cores: the command alone takes %s per run in the sandbox (%.0f/s on two cores with nothing else running), and this process, the service and conmon share them",
								ms(cmd.p50()), 2/cmd.p50().Seconds())
						}
					}
				}
			}
		}
		ts = append(ts, t)
	}
	for _, name := range []string{nameAPIVM, nameCLIVM} {
		short := strings.TrimPrefix(name, "podvm ")
		t := target{what: short + " stdin throughput ≥ 0.8× `runc exec`'s"}
		if x, y := find(b.stdinRes, name), find(b.stdinRes, nameRuncStdin); x != nil && y != nil {
			n := b.sz.streamBytes
			t.have, t.pass = true, mibps(n, x.p50()) >= 0.8*mibps(n, y.p50())
			t.measured = fmt.Sprintf("%.0f vs %.0f MiB/s", mibps(n, x.p50()), mibps(n, y.p50()))
			t.bound = "the agent's channel: framing, credit and one more copy per byte"
		}
		ts = append(ts, t)
		for _, way := range []struct {
			what string
			ss   []*series
		}{{"in", b.filesIn}, {"out", b.filesOut}} {
			x, floor, cp := find(way.ss, name), find(way.ss, nameTarFloor), find(way.ss, nameCp)
			// Not 2x `podman cp`: it runs at 0.7-1.3x the floor here.
			t := target{what: fmt.Sprintf("%s files %s ≥ 0.8× a host `tar | tar`'s and ≥ `podman cp`'s", short, way.what)}
			if x != nil && floor != nil && cp != nil {
				n := b.treeBytes
				t.have = true
				t.pass = mibps(n, x.p50()) >= 0.8*mibps(n, floor.p50()) && x.p50() <= cp.p50()
				t.measured = fmt.Sprintf("%.0f vs %.0f and %.0f MiB/s", mibps(n, x.p50()), mibps(n, floor.p50()), mibps(n, cp.p50()))
				t.bound = "the agent's channel and the host's guard, which decodes and re-encodes the archive"
				if rt := find(way.ss, nameRuncTar); rt != nil {
					t.bound = fmt.Sprintf("the sandbox's filesystem: busybox tar in the sandbox, fed by runc exec with nothing of Podman's or podvm's between, does %.0f MiB/s; `podman cp` is at %.0f%% of the host's floor",
						mibps(n, rt.p50()), 100*mibps(n, cp.p50())/mibps(n, floor.p50()))
				}
			}
			ts = append(ts, t)
		}
	}
	for _, name := range []string{nameAPIVMExec, nameCLIVMExec} {
		t := target{what: strings.TrimPrefix(name, "podvm ") + " throughput ≥ `podman exec … > /dev/null`'s"}
		x, y := find(b.streamRes, name), find(b.streamRes, nameCLIStream)
		if x != nil && y != nil {
			n := b.sz.streamBytes
			t.have, t.pass = true, x.p50() <= y.p50()
			t.measured = fmt.Sprintf("%.0f vs %.0f MiB/s", mibps(n, x.p50()), mibps(n, y.p50()))
			if !t.pass {
				t.bound = "Podman's stream path (conmon, then the service), which the CLI row hands to /dev/null inside the kernel while podvm copies every byte into this process"
				if pp := find(b.streamRes, nameCLIPipe); pp != nil && name == nameCLIVMExec {
					t.bound = fmt.Sprintf("`podman exec` writing into a pipe: read by a bare io.Copy to io.Discard it does %.0f MiB/s, so the reader is not what is slow", mibps(n, pp.p50()))
				}
				if f := find(b.streamRes, nameRuncStream); f != nil {
					t.bound += fmt.Sprintf("; runc alone does %.0f MiB/s", mibps(n, f.p50()))
				}
			}
		}
		ts = append(ts, t)
	}
	for _, r := range b.mem {
		if r.name != nameAPIVM && r.name != nameCLIVM {
			continue
		}
		t := target{what: strings.TrimPrefix(r.name, "podvm ") + " memory growth < 16 MiB per GiB streamed"}
		if r.skip == "" && r.g.err == nil {
			t.have, t.pass = true, r.g.rss < 16<<20
			t.measured = fmt.Sprintf("%s with %s streamed", mib(r.g.rss), mib(b.sz.memBytes))
			if !t.pass {
				t.bound = fmt.Sprintf("what the process holds while streaming: peak heap growth %s, %s allocated", mib(r.g.heap), mib(int64(r.g.alloc)))
			}
		}
		ts = append(ts, t)
	}
	ts = append(ts, b.liveTargets()...)

	fmt.Fprintln(w, "\n**Targets**\n\n| target | measured | result |\n|---|---|---|")
	for _, t := range ts {
		switch {
		case !t.have:
			fmt.Fprintf(w, "| %s | not measured | – |\n", t.what)
		case t.pass:
			fmt.Fprintf(w, "| %s | %s | pass |\n", t.what, t.measured)
		default:
			fmt.Fprintf(w, "| %s | %s | **miss**, bounded by %s |\n", t.what, t.measured, t.bound)
		}
	}
}

// floorOf is the channel-alone row of a podvm agent row.
func floorOf(name string) string {
	if name == nameCLIVM {
		return nameFloorCLI
	}
	return nameFloorAPI
}

// bareStreamOf is the bare container's stream row of a podvm agent row.
func bareStreamOf(name string) string {
	if name == nameCLIVM {
		return nameBareStreamCLI
	}
	return nameBareStreamAPI
}

// row is a table row of a series: name, p50, p90, p50 over base's p50,
// failures.
func row(s, base *series) string {
	if !s.ok() {
		return fmt.Sprintf("| %s | %s | | | %s |", s.name, skipped(s), failures(s))
	}
	vs := "–"
	if base != nil {
		vs = ratio(float64(s.p50()), float64(base.p50()))
	}
	return fmt.Sprintf("| %s | %s | %s | %s | %s |", s.name, ms(s.p50()), ms(s.p90()), vs, failures(s))
}

func skipped(s *series) string {
	if s.skip != "" {
		return s.skip
	}
	return "every run failed"
}

func failures(s *series) string {
	if s.fails == 0 {
		return "0"
	}
	return fmt.Sprintf("%d: %s", s.fails, oneLine(s.err))
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func orNone(s string) string {
	if s == "" {
		return "0"
	}
	return s
}

// scheme names the kind of connection, not the path: "a unix socket".
func scheme(uri string) string {
	s, _, _ := strings.Cut(uri, "://")
	switch s {
	case "unix":
		return "a unix socket"
	case "tcp":
		return "TCP"
	case "ssh":
		return "SSH"
	}
	return s
}

// shellLine shows argv as a shell would take it, for the captions.
func shellLine(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if strings.ContainsAny(a, " ;>&'$") {
			a = "'" + a + "'"
		}
		out[i] = a
	}
	return strings.Join(out, " ")
}
