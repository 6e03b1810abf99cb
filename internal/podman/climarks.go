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

// clients holds, per podman binary and service ([CLI.Local]'s name),
// whether its exec needs the marks, learnt once per process.
var clients sync.Map

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
// process; a failure to ask is no answer, and asked again next time.
func (d CLI) needsMarks(ctx context.Context) bool {
	_, service := d.Local()
	if v, ok := clients.Load(service); ok {
		return v.(bool)
	}
	res, err := d.run(ctx, "version", d.host, exec.Command{Args: []string{"version", "--format", "json"}})
	if err != nil {
		return false
	}
	need, err := losesExecOutput(res.Stdout)
	if err != nil {
		return false
	}
	clients.Store(service, need)
	return need
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
	for _, kv := range p.Env {
		name, _, _ := strings.Cut(kv, "=")
		if why := marks.Unsettable(name); why != "" {
			return 0, false, false, fmt.Errorf("%w: podman-remote before %d.%d: environment variable %q: its exec runs the command through sh, where %s",
				driver.ErrNotSupported, markedFrom[0], markedFrom[1], name, why)
		}
	}
	s := marks.New("podvm-exec-", p.Stdin, p.Stdout, p.Stderr)
	tail := &tailWriter{max: 4 << 10}
	// The environment goes to podman too, not only to the script's
	// subshell: the kill of a run finds its processes by a variable of
	// it, and the script's sh and its hold are the run's as well.
	args := []string{"exec", "-i"}
	for _, e := range p.Env {
		args = append(args, "--env", e)
	}
	args = appendFlag(args, "--user", p.User)
	args = append(append(args, id, "/bin/sh"), marks.Args(p.Workdir, p.Env, p.Stdin != nil, p.Argv)...)
	res, err := d.invoke(ctx, exec.Command{
		Args:           args,
		Stdin:          s.Stdin(),
		Stdout:         s.Stdout(),
		Stderr:         io.MultiWriter(s.Stderr(), tail),
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
	if ferr := StartFailure("", res.ExitCode, 0, string(tail.b), int64(len(tail.b))); ferr != nil {
		if errors.Is(ferr, exec.ErrNotFound) && strings.Contains(string(tail.b), "/bin/sh") {
			return 0, false, true, nil
		}
		return res.ExitCode, false, false, ferr
	}
	return -1, true, false, fmt.Errorf("%w: %s: podman exited %d without the script's end marks: output or the exit status may be lost", driver.ErrEngine, p.Argv[0], res.ExitCode)
}
