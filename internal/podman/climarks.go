package podman

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/podvm/podvm/exec"
	"github.com/podvm/podvm/internal/driver"
	"github.com/podvm/podvm/internal/marks"
)

// podman-remote before 5.7 loses the beginning of an exec's output
// without a word (containers/podman#25855): its client reads the
// hijacked stream from the raw connection, while net/http has already
// read, into the buffer it parsed the response's header from, whatever
// came with that header. Under load a short command's whole output
// comes that early, and podman prints nothing and exits with the
// command's status (seen here: 2 runs in 10 of 16 at once, on two busy
// cores). Podman 5.7 reads the response's body instead
// (containers/podman#27061). For such a client the CLI driver runs each
// command under package marks' script: the script reads its mark from
// stdin before the command runs, and podman sends stdin only once it has
// read the header, so nothing of the command's can come before; and the
// end marks prove that everything came. An image without /bin/sh runs
// its commands as before, with the loss.

// markedFrom is the first client version that reads its exec stream
// whole.
var markedFrom = [3]int{5, 7, 0}

// clients holds, per service ([CLI.Local]'s name: the podman binary and
// its service), a *clientCheck: whether its exec needs the marks.
var clients sync.Map

// clientCheck is one service's answer to needsMarks, asked once for all
// its callers; a failure to ask is asked again after askAgain.
type clientCheck struct {
	mu     sync.Mutex
	asking chan struct{} // the ask in flight, closed when it ends
	known  bool
	need   bool
	retry  time.Time
}

// askTimeout bounds the ask (`podman version`), whoever waits for it;
// askAgain is how long a failed one's answer (no marks) stands.
const (
	askTimeout = 30 * time.Second
	askAgain   = 10 * time.Second
)

// noShell holds the containers whose image has no /bin/sh, by
// [CLI.shellKey]: their commands run without the marks. Remove forgets
// one.
var noShell sync.Map

// shellKey is container id's key in noShell.
func (d CLI) shellKey(id string) string {
	_, service := d.Local()
	return service + "\x00" + id
}

// needsMarks reports whether d's podman is a remote client that may
// lose an exec's output (see above). It asks `podman version` once per
// service, for every caller at once, under a timeout of its own (not a
// run's); until the answer comes, or when ctx ends first, or when the
// ask failed (asked again after askAgain), the answer is no.
func (d CLI) needsMarks(ctx context.Context) bool {
	_, service := d.Local()
	v, _ := clients.LoadOrStore(service, &clientCheck{})
	c := v.(*clientCheck)
	c.mu.Lock()
	if c.known || time.Now().Before(c.retry) {
		defer c.mu.Unlock()
		return c.need
	}
	asking := c.asking
	if asking == nil {
		asking = make(chan struct{})
		c.asking = asking
		go func() {
			need, err := d.askClient()
			c.mu.Lock()
			if err == nil {
				c.need, c.known = need, true
			} else {
				c.retry = time.Now().Add(askAgain)
			}
			c.asking = nil
			c.mu.Unlock()
			close(asking)
		}()
	}
	c.mu.Unlock()
	select {
	case <-asking:
	case <-ctx.Done():
		return false // the exec fails with ctx's error anyway
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.need
}

// askClient asks podman what client it is: whether it needs the marks.
func (d CLI) askClient() (bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), askTimeout)
	defer cancel()
	res, err := d.run(ctx, "version", d.host, exec.Command{Args: []string{"version", "--format", "json"}})
	if err != nil {
		return false, err
	}
	return losesExecOutput(res.Stdout)
}

// losesExecOutput reads `podman version --format json`: a remote client
// (one that reports a server) older than markedFrom.
func losesExecOutput(version string) (bool, error) {
	var v struct {
		Client, Server *struct{ Version string }
	}
	if err := json.Unmarshal([]byte(version), &v); err != nil || v.Client == nil {
		return false, fmt.Errorf("%w: podman version: %q", driver.ErrEngine, version)
	}
	return v.Server != nil && older(v.Client.Version, markedFrom), nil
}

// older reports whether version ("5.4.2", "4.3.1-dev") is before want.
// One that does not parse is not.
func older(version string, want [3]int) bool {
	version, _, _ = strings.Cut(version, "-")
	parts := strings.SplitN(version, ".", 3)
	for i, w := range want {
		if i >= len(parts) {
			return 0 < w
		}
		n, err := strconv.Atoi(parts[i])
		if err != nil {
			return false
		}
		if n != w {
			return n < w
		}
	}
	return false
}

// execMarked is exec for a client that needs the marks: p runs under
// marks.ExecScript, in /bin/sh, which sets its environment and working
// directory. no reports an image without /bin/sh (nothing ran).
func (d CLI) execMarked(ctx context.Context, id string, p driver.Process) (code int, started bool, no bool, err error) {
	if err := marks.CheckEnv(fmt.Sprintf("podman-remote before %d.%d", markedFrom[0], markedFrom[1]), p.Env); err != nil {
		return 0, false, false, err
	}
	s := marks.New("podvm-exec-", p.Stdin, p.Stdout, p.Stderr)
	var stdout, stderr counter
	tail := &tailWriter{max: 4 << 10}
	// The environment goes to podman, as for any exec: the script's sh
	// and its hold have it too (the kill of a run finds its processes by
	// a variable of it), and its values are in no argv. The subshell
	// takes out what sh exports itself, so the caller's own values of
	// those come again as the script's arguments.
	args := []string{"exec", "-i"}
	var own []string
	for _, e := range p.Env {
		args = append(args, "--env", e)
		if name, _, _ := strings.Cut(e, "="); name == "SHLVL" || name == "PWD" || name == "OLDPWD" {
			own = append(own, e)
		}
	}
	args = appendFlag(args, "--user", p.User)
	args = append(append(args, id, "/bin/sh"), marks.Args(p.Workdir, own, p.Stdin != nil, p.Argv)...)
	res, err := d.invoke(ctx, exec.Command{
		Args:           args,
		Stdin:          s.Stdin(),
		Stdout:         io.MultiWriter(s.Stdout(), &stdout),
		Stderr:         io.MultiWriter(s.Stderr(), tail, &stderr),
		MaxOutputBytes: 1, // the caller captures through the writers
	})
	s.Stop()
	switch {
	case res == nil:
		return -1, false, false, err
	case res.TimedOut:
		return -1, true, false, err
	}
	code, why, complete := s.Result()
	switch {
	case why != "":
		return 0, false, false, marks.StartError("podman", p.Argv[0], p.Workdir, why)
	case complete:
		// A writer's error is the caller's to report, as exec's.
		return code, true, false, nil
	}
	// No marks: podman could not run the script (its own lines say why,
	// which execWatched maps from this status), or the session was cut.
	if err := LostStream(p.Argv[0], res.ExitCode, string(tail.b)); err != nil {
		return -1, true, false, err
	}
	if ferr := StartFailure("", res.ExitCode, int64(stdout), string(tail.b), int64(stderr)); ferr != nil {
		if errors.Is(ferr, exec.ErrNotFound) && strings.Contains(string(tail.b), "/bin/sh") {
			return 0, false, true, nil
		}
		return res.ExitCode, false, false, ferr
	}
	// The container gone or stopped under the command says so, in
	// podman's own lines after the command's.
	sentinel := driver.ErrEngine
	if r := recognise(strings.Join(ownLines(string(tail.b)), "\n")); r == driver.ErrNoSuchContainer || r == driver.ErrContainerNotRunning {
		sentinel = r
	}
	return -1, true, false, fmt.Errorf("%w: %s: podman exited %d without the script's end marks: output or the exit status may be lost", sentinel, p.Argv[0], res.ExitCode)
}

// counter counts what is written to it.
type counter int64

func (c *counter) Write(p []byte) (int, error) {
	*c += counter(len(p))
	return len(p), nil
}
