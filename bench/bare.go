package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"

	"github.com/podvm/podvm/internal/libpod"
)

// The bounds of the agent's rows: what the sandbox's stdio stream and
// the sandbox itself cost with no agent in between, measured in the same
// run.
//
// A bare container is a sandbox whose PID 1 is a shell loop reading its
// stdin, attached the way podvm attaches to the agent: through the
// service's attach endpoint (APIVM) or a `podman start -a -i` process
// (CLIVM). For each line "e" the shell itself echoes "e" back: a round
// trip over the channel with no process started. For a line N it runs
// dd to write N blocks of zero bytes: the stream's throughput with no
// agent and no framing.
const bareScript = `while read -r x; do if [ "$x" = e ]; then echo e; else dd if=/dev/zero bs=` +
	"65536" + ` count="$x" status=none; fi; done`

// bare is one bare container's stdio, used by one operation at a time.
type bare struct {
	mu    sync.Mutex
	w     io.Writer // its stdin
	r     io.Reader // its stdout
	buf   []byte
	err   error // sticky: a failed exchange leaves the stream out of step
	close func()
}

// createBare creates a bare container (stopped) with the sandbox's
// flags and returns its ID. Like podvm's sandboxes it has no log driver:
// conmon would otherwise also write every byte to a log file.
func (p *podman) createBare(ctx context.Context, image string) (string, error) {
	a := append([]string{"create", "-i", "--log-driver", "none"}, p.sandboxFlags()...)
	return p.output(ctx, append(a, "--entrypoint", "sh", image, "-c", bareScript)...)
}

// bareAPI starts container id attached through the service, as APIVM
// attaches to its agent: the multiplexed stream demultiplexed into a
// pipe.
func bareAPI(ctx context.Context, url, id string) (*bare, error) {
	c, err := libpod.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	s, err := c.ContainerAttach(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := c.ContainerStart(ctx, id); err != nil {
		s.Close()
		return nil, err
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(libpod.Demux(s, pw, io.Discard)) }()
	return &bare{w: s, r: pr, buf: make([]byte, 64<<10), close: func() { pr.Close(); s.Close() }}, nil
}

// bareCLI starts container id with `podman start -a -i`, as CLIVM
// starts its agent, its stdin and stdout pipes of this process.
func (p *podman) bareCLI(ctx context.Context, id string) (*bare, error) {
	c := p.command(context.WithoutCancel(ctx), "start", "-a", "-i", id)
	w, err := c.StdinPipe()
	if err != nil {
		return nil, err
	}
	r, err := c.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.Start(); err != nil {
		return nil, err
	}
	go func() { _ = c.Wait() }() // ends when the container is removed
	return &bare{w: w, r: r, buf: make([]byte, 64<<10), close: func() { w.Close() }}, nil
}

// exchange writes line and reads the n bytes of the answer; it returns
// them when they fit its buffer.
func (b *bare) exchange(line string, n int64) ([]byte, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.err != nil {
		return nil, b.err
	}
	if _, err := io.WriteString(b.w, line+"\n"); err != nil {
		b.err = fmt.Errorf("bare container: writing: %w", err)
		return nil, b.err
	}
	var got []byte
	for left := n; left > 0 && b.err == nil; {
		k, err := io.ReadFull(b.r, b.buf[:min(left, int64(len(b.buf)))])
		if err != nil {
			b.err = fmt.Errorf("bare container: reading: %w", err)
		}
		got, left = b.buf[:k], left-int64(k)
	}
	if n > int64(len(b.buf)) {
		got = nil
	}
	return got, b.err
}

// echo is a round trip over the bare container's stdio.
func (b *bare) echo() op {
	return func(context.Context) error {
		got, err := b.exchange("e", 2)
		if err == nil && string(got) != "e\n" {
			err = fmt.Errorf("bare container: echoed %q, want %q", got, "e\n")
		}
		return err
	}
}

// stream reads n bytes (a multiple of streamBlock) that the bare
// container's dd writes.
func (b *bare) stream(n int64) op {
	return func(context.Context) error {
		_, err := b.exchange(strconv.FormatInt(n/streamBlock, 10), n)
		return err
	}
}

// bares are the bare containers of the run, one per path, made on
// first use; their failure is a skipped row, not a failed run.
type bares struct {
	api, cli       *bare
	apiErr, cliErr error
}

func (b *bench) setupBares(ctx context.Context) {
	mk := func(attach func(string) (*bare, error)) (*bare, error) {
		id, err := b.p.createBare(ctx, b.cfg.Image)
		if err != nil {
			return nil, err
		}
		return attach(id)
	}
	b.bare.api, b.bare.apiErr = mk(func(id string) (*bare, error) { return bareAPI(ctx, b.p.url, id) })
	b.bare.cli, b.bare.cliErr = mk(func(id string) (*bare, error) { return b.p.bareCLI(ctx, id) })
}

// bareAlts are the alternatives of the bare containers, built by mk.
func (b *bench) bareAlts(apiName, cliName string, mk func(*bare) op) []alt {
	var alts []alt
	for _, x := range []struct {
		name string
		b    *bare
		err  error
	}{{apiName, b.bare.api, b.bare.apiErr}, {cliName, b.bare.cli, b.bare.cliErr}} {
		if x.b == nil {
			alts = append(alts, alt{name: x.name, skip: "unavailable: " + oneLine(errors.Join(x.err, errors.New("not set up")))})
			continue
		}
		alts = append(alts, alt{name: x.name, op: mk(x.b)})
	}
	return alts
}

// spawnLoops is how many commands the spawn row starts per timed run.
const spawnLoops = 100

// spawnArgv starts and waits the round trip's command spawnLoops times
// from a shell loop, its output on /dev/null.
var spawnArgv = []string{"sh", "-c", `i=0; while [ $i -lt ` + strconv.Itoa(spawnLoops) + ` ]; do ` +
	shellLine(roundTripArgv) + ` >/dev/null 2>&1; i=$((i+1)); done`}

// closeBares ends the bare containers' streams (cleanup removes them).
func (b *bench) closeBares() {
	for _, x := range []*bare{b.bare.api, b.bare.cli} {
		if x != nil {
			x.close()
		}
	}
}
